"""`grounding`: GUI grounding, a predicted point inside the row's `target_box` (1/0) or a box's IoU with it."""

from __future__ import annotations

import re

from .rows import check_lengths, column

# Grounding: "[x1, y1, x2, y2]" / "(x1,y1,x2,y2)" boxes, "(x, y)" / "[x, y]" points, {"x": .., "y": ..}.
_NUM = r"-?\d+(?:\.\d+)?"
_BOX4 = re.compile(rf"[\[(]\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*[\])]")
_POINT2 = re.compile(rf"[\[(]\s*({_NUM})\s*,\s*({_NUM})\s*[\])]")
_XY = re.compile(rf"\"?x\"?\s*[:=]\s*({_NUM})\s*,\s*\"?y\"?\s*[:=]\s*({_NUM})", re.IGNORECASE)
_ANY_NUM = re.compile(rf"(?<![\w.]){_NUM}")


def parse_location(text: str) -> tuple[float, float] | tuple[float, float, float, float] | None:
    """The first point (x, y) or box (x1, y1, x2, y2) written in the text, None if there is none.

    Bracketed groups of 4 or 2 numbers (JSON lists such as {"bbox_2d": [10, 20, 50, 40]} or
    {"point": [12, 30]}, or plain "(12, 30)"), and x/y pairs ({"x": 12, "y": 30}, "x=12, y=30"),
    whichever comes first in the text. Without any of those, bare numbers: exactly four make a
    box, otherwise the first two a point.
    """
    found = []
    for regex in (_BOX4, _POINT2, _XY):
        m = regex.search(text)
        if m:
            found.append((m.start(), -len(m.groups()), tuple(float(v) for v in m.groups())))
    if found:
        return min(found)[2]  # earliest; at one position a box wins over a point
    numbers = [float(v) for v in _ANY_NUM.findall(text)]
    if len(numbers) == 4:
        return tuple(numbers)
    return tuple(numbers[:2]) if len(numbers) >= 2 else None


def box_iou(a, b) -> float:
    """Intersection over union of two [x1, y1, x2, y2] boxes (continuous coordinates; corners in any order)."""
    ax1, ax2 = sorted((a[0], a[2]))
    ay1, ay2 = sorted((a[1], a[3]))
    bx1, bx2 = sorted((b[0], b[2]))
    by1, by2 = sorted((b[1], b[3]))
    inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / union if union > 0 else 0.0


def grounding(prompts: list[str], responses: list[str], samples: list[dict], *, box_key: str = "target_box",
              **kwargs) -> list[float]:
    """GUI grounding against the row's `target_box` [x1, y1, x2, y2] (same coordinates as the response).

    A predicted point (see parse_location) scores 1.0 inside the box (edges included), else
    0.0; a predicted box scores its IoU with the target; nothing parsable scores 0.0.
    """
    check_lengths(prompts, responses, samples, "grounding")
    rewards = []
    for i, (response, sample) in enumerate(zip(responses, samples)):
        target = [float(v) for v in column(sample, box_key, "grounding", i, "box_key")]
        if len(target) != 4:
            raise ValueError(f"reward 'grounding': row {i}'s '{box_key}' must be [x1, y1, x2, y2], got {target}")
        loc = parse_location(response)
        if loc is None:
            rewards.append(0.0)
        elif len(loc) == 2:
            x1, x2 = sorted((target[0], target[2]))
            y1, y2 = sorted((target[1], target[3]))
            rewards.append(1.0 if x1 <= loc[0] <= x2 and y1 <= loc[1] <= y2 else 0.0)
        else:
            rewards.append(box_iou(loc, target))
    return rewards
