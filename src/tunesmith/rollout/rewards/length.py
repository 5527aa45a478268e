"""`length`: DAPO's soft overlong penalty, 0 … −1."""

from __future__ import annotations


def length_penalty(prompts: list[str], responses: list[str], samples: list[dict], *, max_len: int = 4096,
                   buffer: int = 1024, lengths: list[int] | None = None, **kwargs) -> list[float]:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), in [−1, 0].

    With L = the response length, L_max = max_len and L_cache = buffer:
        0                              if L ≤ L_max − L_cache
        (L_max − L_cache − L)/L_cache  if L_max − L_cache < L ≤ L_max   (linear from 0 to −1)
        −1                             if L > L_max
    L is in tokens when the trainer passes `lengths` (one per response), else in characters
    of the response text; set max_len and buffer in the same unit.
    """
    if buffer <= 0 or buffer > max_len:
        raise ValueError(f"length reward: buffer must be in (0, max_len], got buffer={buffer}, max_len={max_len}")
    sizes = list(lengths) if lengths is not None else [len(r) for r in responses]
    if len(sizes) != len(responses):
        raise ValueError(f"length reward: {len(sizes)} lengths for {len(responses)} responses")
    start = max_len - buffer
    return [0.0 if n <= start else -1.0 if n > max_len else (start - n) / buffer for n in sizes]
