"""Multimodal samples: placeholders in the text, media lists beside it.

Datasets write `<image>`, `<video>`, `<audio>` in the text (LLaMA-Factory's
convention). Here each placeholder becomes a content part ({"type": "image"},
...) so the model's own chat template renders its media markers, and after
tokenization each media token is expanded, at the token level, into the exact
token sequence the model's processor would produce (computed from the media's
size by a planner, without decoding it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import DataError
from .sample import where

PLACEHOLDERS = {"image": "<image>", "video": "<video>", "audio": "<audio>"}
_SPLIT = re.compile("(" + "|".join(re.escape(p) for p in PLACEHOLDERS.values()) + ")")
_KIND = {v: k for k, v in PLACEHOLDERS.items()}
MEDIA_KINDS = ("image", "video", "audio")


def media_counts(sample: dict) -> dict[str, int]:
    return {kind: len(sample.get(f"{kind}s") or []) for kind in MEDIA_KINDS}


def has_media(sample: dict) -> bool:
    return any(media_counts(sample).values())


def check_placeholders(sample: dict) -> None:
    """The number of placeholders of each kind must equal the length of its media list."""
    text = "".join(m["content"] for m in sample["messages"] if isinstance(m["content"], str))
    for kind, count in media_counts(sample).items():
        found = text.count(PLACEHOLDERS[kind])
        if found != count:
            raise DataError(
                f"{where(sample)}: {found} {PLACEHOLDERS[kind]} placeholder(s) in the text but {count} {kind}(s) "
                f"in its '{kind}s' list; put one {PLACEHOLDERS[kind]} where each {kind} belongs"
            )


def to_content_parts(messages: list[dict]) -> list[dict]:
    """Messages whose text holds placeholders -> messages with typed content parts (OpenAI/HF shape)."""
    out = []
    for message in messages:
        content = message["content"]
        if not isinstance(content, str) or not _SPLIT.search(content):
            out.append({"role": message["role"], "content": content})
            continue
        parts = []
        for piece in _SPLIT.split(content):
            if piece in _KIND:
                parts.append({"type": _KIND[piece]})
            elif piece:
                parts.append({"type": "text", "text": piece})
        out.append({"role": message["role"], "content": parts})
    return out


@dataclass
class Expansion:
    """How to expand one kind of media token: its id, and the replacement ids of each item, in order."""

    token_id: int
    replacements: list[list[int]]


def expand_media_tokens(input_ids: list[int], labels: list[int], expansions: list[Expansion], ignore_index: int):
    """Replace the k-th occurrence of each media token by its k-th replacement; media tokens are never labels."""
    by_id = {e.token_id: iter(e.replacements) for e in expansions}
    used = {e.token_id: 0 for e in expansions}
    new_ids, new_labels = [], []
    for tok, label in zip(input_ids, labels):
        if tok in by_id:
            replacement = next(by_id[tok], None)
            if replacement is None:
                raise DataError("more media tokens in the rendered text than media items")
            used[tok] += 1
            new_ids.extend(replacement)
            new_labels.extend([ignore_index] * len(replacement))
        else:
            new_ids.append(tok)
            new_labels.append(label)
    for e in expansions:
        if used[e.token_id] != len(e.replacements):
            raise DataError(
                f"the chat template rendered {used[e.token_id]} media token(s) for {len(e.replacements)} media item(s)"
            )
    return new_ids, new_labels
