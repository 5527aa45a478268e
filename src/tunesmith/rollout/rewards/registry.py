"""The reward registry, and how a config's entries (built-in names, users' functions: user.py) combine into one
callable.

Adding a reward: write its module (one function, or a class for a reward with
state) and list it in REWARDS below under the name configs use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

from .accuracy import accuracy
from .format import format_reward
from .grounding import grounding
from .length import length_penalty
from .reward_model import RewardModelReward
from .user import RewardError, UserReward, resolve_reward  # noqa: F401  (resolve_reward: part of this module's API)

RewardFn = Callable[..., list[float]]

# A value that is a class is instantiated once per config entry with the entry's kwargs (it may hold
# a model or running statistics); a function receives the entry's kwargs at every call.
REWARDS: dict[str, RewardFn | type] = {
    "accuracy": accuracy,
    "format": format_reward,
    "length": length_penalty,
    "grounding": grounding,
    "reward_model": RewardModelReward,
}


@dataclass
class RewardSpec:
    """One config entry: a registered name or 'module:function', its weight and its kwargs."""

    name: str
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, item: "str | dict | RewardSpec") -> "RewardSpec":
        if isinstance(item, RewardSpec):
            return item
        if isinstance(item, str):
            return cls(item)
        if isinstance(item, dict):
            rest = dict(item)
            name = rest.pop("name", None)
            if not isinstance(name, str):
                raise ValueError(f"reward entry {item} needs a 'name' (one of {sorted(REWARDS)} or 'module:function')")
            weight = rest.pop("weight", 1.0)
            if not isinstance(weight, (int, float)) or isinstance(weight, bool):
                raise ValueError(f"reward '{name}': weight must be a number, got {weight!r}")
            return cls(name, float(weight), rest)
        raise ValueError(f"a reward entry is a name or {{\"name\": ..., \"weight\": ..., ...}}, got {item!r}")

    def build(self) -> RewardFn:
        if ":" in self.name:
            return UserReward(self.name, **self.kwargs)
        if self.name in REWARDS:
            fn = REWARDS[self.name]
        else:
            raise ValueError(f"unknown reward '{self.name}'. Registered rewards: {', '.join(sorted(REWARDS))}; "
                             f"or give your own as 'module.path:function'")
        if isinstance(fn, type):
            return fn(**self.kwargs)
        return partial(fn, **self.kwargs) if self.kwargs else fn


class CombinedReward:
    """Σ weight·reward over the entries; calling returns (total, {name: that function's rewards})."""

    def __init__(self, specs: list[RewardSpec]) -> None:
        if not specs:
            raise ValueError(f"no reward function given; list at least one of {sorted(REWARDS)}")
        names = [s.name for s in specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"reward(s) {dupes} listed twice; merge the entries (one name, one weight)")
        self.specs = specs
        self.functions = {s.name: s.build() for s in specs}
        self.weights = {s.name: s.weight for s in specs}

    def __call__(self, prompts: list[str], responses: list[str], samples: list[dict],
                 **kwargs) -> tuple[list[float], dict[str, list[float]]]:
        per_function: dict[str, list[float]] = {}
        total = [0.0] * len(responses)
        for name, fn in self.functions.items():
            values = fn(prompts, responses, samples, **kwargs)
            values = [float(v) for v in values]
            if len(values) != len(responses):
                raise ValueError(f"reward '{name}' returned {len(values)} values for {len(responses)} responses")
            bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
            if bad is not None:
                raise RewardError(f"reward '{name}' returned {values[bad]} for response {bad}; every reward must be "
                                  "a finite number (a NaN or infinite one makes its group's advantages non-finite)")
            per_function[name] = values
            weight = self.weights[name]
            total = [t + weight * v for t, v in zip(total, values)]
        return total, per_function

    def state_dict(self) -> dict[str, dict]:
        """Running statistics of the stateful rewards (reward-model normalisation), for checkpoints."""
        return {n: fn.state_dict() for n, fn in self.functions.items() if hasattr(fn, "state_dict")}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        for name, value in state.items():
            if name in self.functions and hasattr(self.functions[name], "load_state_dict"):
                self.functions[name].load_state_dict(value)


def combine(specs: list[RewardSpec]) -> CombinedReward:
    return CombinedReward([RewardSpec.parse(s) for s in specs])


def build_rewards(spec: list[dict | str] | str | dict) -> CombinedReward:
    """A config's reward list -> one callable (prompts, responses, samples, **kw) -> (total, per_function)."""
    items = spec if isinstance(spec, (list, tuple)) else [spec]
    return combine([RewardSpec.parse(item) for item in items])
