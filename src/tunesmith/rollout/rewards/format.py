"""`format`: 1/0 when a response matches a regex (default: <think>…</think> then <answer>…</answer>)."""

from __future__ import annotations

import re

DEFAULT_FORMAT_PATTERN = r"^<think>.*?</think>\s*<answer>.*?</answer>$"


def format_reward(prompts: list[str], responses: list[str], samples: list[dict], *,
                  pattern: str = DEFAULT_FORMAT_PATTERN, **kwargs) -> list[float]:
    """1.0 when `re.match(pattern, response.strip(), re.DOTALL)` matches, else 0.0.

    re.match anchors at the start only; end the pattern with `$` to demand a full match
    (the default does). Add inline flags such as (?i) to the pattern for more.
    """
    regex = re.compile(pattern, re.DOTALL)
    return [1.0 if regex.match(r.strip()) else 0.0 for r in responses]
