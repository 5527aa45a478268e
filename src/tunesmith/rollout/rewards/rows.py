"""What every reward reads from its inputs: a dataset row's columns, and one row per response."""

from __future__ import annotations

import json


def row_value(sample: dict, key: str):
    """sample[key]; for a tunesmith Sample, whose unmapped columns sit in `extra` (a JSON text), looked up there."""
    if not isinstance(sample, dict):
        return None
    if sample.get(key) is not None:
        return sample[key]
    extra = sample.get("extra")
    if isinstance(extra, str) and extra:
        try:
            extra = json.loads(extra)
        except ValueError:
            return None
    return extra.get(key) if isinstance(extra, dict) else None


def column(sample: dict, key: str, reward: str, index: int, option: str):
    """row_value(sample, key), which the reward cannot do without; the error names `option`, the reward's
    config key that points it at another column."""
    value = row_value(sample, key)
    if value is None:
        keys = sorted(sample) if isinstance(sample, dict) else type(sample).__name__
        raise KeyError(f"reward '{reward}' needs a '{key}' column in each dataset row; row {index} has {keys}. "
                       f"Add the column to the data, or set `{option}` in the reward's config entry")
    return value


def check_lengths(prompts, responses, samples, reward: str) -> None:
    if not (len(prompts) == len(responses) == len(samples)):
        raise ValueError(f"reward '{reward}': got {len(prompts)} prompts, {len(responses)} responses and "
                         f"{len(samples)} samples; pass one prompt and one dataset row per response")
