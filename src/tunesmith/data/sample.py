"""The Sample: one training example in a format-independent shape.

Every dataset format (alpaca, sharegpt, openai) is converted to this dict shape,
which is what `datasets` stores between conversion and rendering:

    {
      "messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...],
      "tools":    str,            # JSON text of tool definitions, "" when none
      "images":   [str, ...],     # absolute media paths (rendered by the VLM issue)
      "videos":   [str, ...],
      "audios":   [str, ...],
      "rejected": [ {role, content} ... ] | [],  # preference data: the rejected last turn(s)
      "kto_tag":  bool | None,
      "source":   str,            # dataset name, for error messages
      "index":    int,            # row number in that dataset, for error messages
      "extra":    str,            # JSON of the row's other columns (RL answers, target boxes, margins)
    }

For sft the last message is an assistant turn. For pt the text is
messages[0]["content"].
"""

from __future__ import annotations

import json

import numpy as np

ROLES = ("system", "user", "assistant", "tool")

SAMPLE_COLUMNS = ("messages", "tools", "images", "videos", "audios", "rejected", "kto_tag", "source", "index", "extra")


def make_sample(
    messages: list[dict],
    *,
    source: str,
    index: int,
    tools: str = "",
    images: list[str] | None = None,
    videos: list[str] | None = None,
    audios: list[str] | None = None,
    rejected: list[dict] | None = None,
    kto_tag: bool | None = None,
    extra: dict | None = None,
) -> dict:
    return {
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
        "tools": tools or "",
        "images": list(images or []),
        "videos": list(videos or []),
        "audios": list(audios or []),
        "rejected": [{"role": m["role"], "content": m["content"]} for m in (rejected or [])],
        "kto_tag": kto_tag,
        "source": source,
        "index": int(index),
        "extra": json.dumps(extra or {}, ensure_ascii=False, default=str),
    }


def where(sample: dict) -> str:
    """'dataset <name>, record <i>' for error messages."""
    return f"dataset '{sample.get('source', '?')}', record {sample.get('index', '?')}"


def span_labels(ids: list[int], offsets, spans: list[tuple[int, int]], ignore_index: int = -100) -> list[int]:
    """Each token's id where its first character (`offsets`: the tokenizer's offset mapping) lies inside one of
    the character spans, else ignore_index."""
    starts = np.fromiter((start for start, _ in offsets), dtype=np.int64, count=len(ids))
    inside = np.zeros(len(ids), dtype=bool)
    for start, end in spans:
        inside |= (starts >= start) & (starts < end)
    return np.where(inside, np.asarray(ids, dtype=np.int64), ignore_index).tolist()
