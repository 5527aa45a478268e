"""Reward functions for online RL (GRPO and friends), and how a config combines them.

Every reward function has one signature:

    fn(prompts: list[str], responses: list[str], samples: list[dict], **kwargs) -> list[float]

with one entry per response: `prompts[i]` is the prompt that produced `responses[i]` and
`samples[i]` its dataset row (a group of G responses repeats its prompt and row G times).
Rows carry the columns a reward needs: `answer` for `accuracy`, `target_box` for
`grounding` (at the top level, or inside a Sample's `extra` JSON text; see rows.py).
Keyword arguments come from the reward's entry in the config (`pattern`, `max_len`, ...)
and from the trainer (`lengths`: response lengths in tokens); a function must accept,
and may ignore, keywords it does not use.

Built in (`REWARDS`), one module each, named after the reward:

- `accuracy`   1/0: the response's final answer equals the row's `answer` (math-verify when installed)
- `format`     1/0: the response matches a regex (default: <think>…</think> then <answer>…</answer>)
- `length`     0 … −1: DAPO's overlong penalty
- `grounding`  GUI grounding: a predicted point inside `target_box` (1/0), or a box's IoU with it
- `reward_model`  a reward model trained with `stage: rm`, through a RewardShaper

A config lists rewards by name, as `module.path:function` for a user's own function, or as
`{"name": ..., "weight": ..., **kwargs}`; `build_rewards` (registry.py) turns that list into
one callable returning the weighted total and each function's rewards (for logging).
"""

from .accuracy import accuracy, answers_match, extract_answer, has_math_verify, last_boxed, normalize_answer
from .format import DEFAULT_FORMAT_PATTERN, format_reward
from .grounding import box_iou, grounding, parse_location
from .length import length_penalty
from .registry import REWARDS, CombinedReward, RewardFn, RewardSpec, build_rewards, combine, resolve_reward
from .reward_model import RewardModelReward
from .rows import row_value

__all__ = [
    "REWARDS", "CombinedReward", "RewardFn", "RewardSpec", "build_rewards", "combine", "resolve_reward",
    "RewardModelReward", "accuracy", "format_reward", "grounding", "length_penalty",
    "DEFAULT_FORMAT_PATTERN", "answers_match", "box_iou", "extract_answer", "has_math_verify", "last_boxed",
    "normalize_answer", "parse_location", "row_value",
]
