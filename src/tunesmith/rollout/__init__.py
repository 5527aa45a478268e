"""Online RL: generation of rollouts and their rewards (see rollout/rewards/)."""

from .rewards import REWARDS, CombinedReward, RewardModelReward, RewardSpec, build_rewards, combine, resolve_reward

__all__ = ["REWARDS", "CombinedReward", "RewardModelReward", "RewardSpec", "build_rewards", "combine",
           "resolve_reward"]
