"""Reward shaping for RL from a reward model: length bonus, running normalisation, clipping.

Pure state (plain floats), so a shaper checkpoints with ``state_dict()`` and resumes exactly.
Under data parallelism the caller gathers scores from all ranks before calling, so every
rank keeps the same running statistics.
"""

from __future__ import annotations

import math

import torch


class RunningMeanStd:
    """Running mean and population variance (ddof 0) over every value seen.

    Batches merge with the parallel form of Welford's update (Chan et al. 1979): for a
    batch of n values with mean m_b and variance v_b, δ = m_b − mean, N = count + n,
    mean ← mean + δ·n/N,  var ← (var·count + v_b·n + δ²·count·n/N) / N,  count ← N.
    Computed in float64.
    """

    def __init__(self) -> None:
        self.mean = 0.0
        self.var = 1.0
        self.count = 0.0

    def update(self, x_B: torch.Tensor) -> None:
        x = x_B.detach().reshape(-1).to(torch.float64)
        n = x.numel()
        if n == 0:
            return
        batch_mean = x.mean().item()
        batch_var = x.var(unbiased=False).item()
        if self.count == 0:
            self.mean, self.var, self.count = batch_mean, batch_var, float(n)
            return
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta * delta * self.count * n / total
        self.mean = self.mean + delta * n / total
        self.var = m2 / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def state_dict(self) -> dict[str, float]:
        return {"mean": float(self.mean), "var": float(self.var), "count": float(self.count)}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.mean = float(state["mean"])
        self.var = float(state["var"])
        self.count = float(state["count"])


class RewardShaper:
    """Turns reward-model scores into training rewards.

    reward = score + α·min(len / L, 1)            (α = length_alpha, L = length_target)
    if normalize: update the running stats with these rewards, then
        reward = (reward − mean) / sqrt(var + eps)
    if clip: reward = clamp(reward, −clip, clip).
    Returns detached fp32 rewards_B.
    """

    def __init__(
        self,
        length_alpha: float = 0.0,
        length_target: int = 512,
        normalize: bool = False,
        clip: float | None = None,
        eps: float = 1e-6,
    ) -> None:
        if length_target <= 0:
            raise ValueError(f"length_target must be > 0, got {length_target}; set it to the desired response length")
        if clip is not None and clip <= 0:
            raise ValueError(f"clip must be > 0 or None, got {clip}; use None to disable clipping")
        self.length_alpha = float(length_alpha)
        self.length_target = length_target
        self.normalize = normalize
        self.clip = clip
        self.eps = eps
        self.stats = RunningMeanStd()

    def __call__(self, rm_scores_B: torch.Tensor, lengths_B: torch.Tensor) -> torch.Tensor:
        scores = rm_scores_B.detach().float()
        frac = lengths_B.detach().to(device=scores.device, dtype=torch.float32) / self.length_target
        rewards_B = scores + self.length_alpha * frac.clamp(max=1.0)
        if self.normalize:
            self.stats.update(rewards_B)
            rewards_B = (rewards_B - self.stats.mean) / math.sqrt(self.stats.var + self.eps)
        if self.clip is not None:
            rewards_B = rewards_B.clamp(-self.clip, self.clip)
        return rewards_B

    def state_dict(self) -> dict[str, float]:
        return self.stats.state_dict()

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.stats.load_state_dict(state)
