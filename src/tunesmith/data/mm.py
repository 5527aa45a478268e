"""Multimodal samples: placeholders in the text, media lists beside it.

Datasets write `<image>`, `<video>`, `<audio>` in the text (LLaMA-Factory's
convention). Here each placeholder becomes a content part ({"type": "image"},
...) so the model's own chat template renders its media markers, and after
tokenization each media token is expanded, at the token level, into the exact
token sequence the model's processor would produce (computed from the media's
size by a planner). Each file is then decoded once (media.check_plan), so a
truncated or corrupt file is an error naming the record and file here, before
training, rather than in a data worker at the step that meets it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import torch

from ..stages import STAGES
from ..errors import DataError
from .budget import cut_messages
from .media import check_plan
from .sample import template_tools, token_ranges, turn_labels, where

PLACEHOLDERS = {"image": "<image>", "video": "<video>", "audio": "<audio>"}
_SPLIT = re.compile("(" + "|".join(re.escape(p) for p in PLACEHOLDERS.values()) + ")")
_KIND = {v: k for k, v in PLACEHOLDERS.items()}
MEDIA_KINDS = ("image", "video", "audio")


_NO_MEDIA = {"images": [], "videos": [], "audios": []}
_TOKEN_TYPES = (("image", 1), ("video", 2))  # the codes mm_token_type_ids uses; 0 for every other token


def media_plans(rows: list[dict]) -> list[dict]:
    """The media plan of each row (its `mm_plan` JSON), an empty plan for text-only rows."""
    return [json.loads(r["mm_plan"]) if r.get("mm_plan") else _NO_MEDIA for r in rows]


def media_token_types(input_ids: torch.Tensor, token_ids: dict[str, int]) -> torch.Tensor:
    """mm_token_type_ids: 1 at image tokens, 2 at video tokens, 0 elsewhere (what mRoPE position code reads)."""
    types = torch.zeros_like(input_ids)
    for kind, code in _TOKEN_TYPES:
        if kind in token_ids:
            types[input_ids == token_ids[kind]] = code
    return types


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
            out.append(message)
            continue
        parts = []
        for piece in _SPLIT.split(content):
            if piece in _KIND:
                parts.append({"type": _KIND[piece]})
            elif piece:
                parts.append({"type": "text", "text": piece})
        out.append({**message, "content": parts})
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


def _substituted(text: str, spans: list[tuple[int, int]], pattern: str, replace) -> tuple[str, list]:
    """`text` with every match of `pattern` replaced by `replace(match)`, and `spans` moved with it: a position past
    a match's start moves by that match's change in length."""
    shifts: list[tuple[int, int]] = []  # (position in the original text, length change there)
    pieces, last = [], 0
    for match in re.finditer(pattern, text):
        replacement = replace(match)
        pieces += [text[last:match.start()], replacement]
        shifts.append((match.start(), len(replacement) - len(match.group(0))))
        last = match.end()

    def moved(at: int) -> int:
        return at + sum(delta for start, delta in shifts if start < at)

    return "".join(pieces) + text[last:], [(moved(a), moved(b)) for a, b in spans]


def expand_in_text(text: str, spans: list[tuple[int, int]], expansions: list[Expansion], tokenizer):
    """`text` with each media placeholder replaced by its expansion's text, and `spans` moved with it.

    For families whose expansion carries plain text around the media tokens (Gemma 3: "\n\n" before
    <start_of_image> and after <end_of_image>): tokenized together with its neighbours, that text merges
    with the template's newlines as in the processor's own call, which expanding token ids cannot do.
    """
    by_token = {tokenizer.convert_ids_to_tokens(e.token_id): [tokenizer.decode(r) for r in e.replacements]
                for e in expansions}
    if not by_token:
        return text, spans
    used = {token: 0 for token in by_token}

    def replace(match) -> str:
        token = match.group(0)
        if used[token] == len(by_token[token]):
            raise DataError("more media tokens in the rendered text than media items")
        used[token] += 1
        return by_token[token][used[token] - 1]

    text, spans = _substituted(text, spans, "|".join(re.escape(t) for t in by_token), replace)
    for token, replacements in by_token.items():
        if used[token] != len(replacements):
            raise DataError(f"the chat template rendered {used[token]} media token(s) for {len(replacements)} "
                            "media item(s)")
    return text, spans


def collapse_markers(text: str, spans: list[tuple[int, int]], collapsed: dict[str, str]):
    """`text` with each marker the processor collapses (MediaProcessor.collapsed_markers) replaced by its bare media
    token, as the processor's own call does before expanding it, and `spans` moved with it."""
    if not collapsed:
        return text, spans
    return _substituted(text, spans, "|".join(re.escape(m) for m in collapsed), lambda m: collapsed[m.group(0)])


def with_markers(text: str, markers: dict[str, str]) -> str:
    """Plain text (pt stage): each placeholder becomes the family's media marker, e.g.
    <|vision_start|><|image_pad|><|vision_end|>, which the expansion then fills."""
    for kind, placeholder in PLACEHOLDERS.items():
        if placeholder in text and kind not in markers:
            raise DataError(f"this model takes no {kind} input")
        text = text.replace(placeholder, markers.get(kind, placeholder))
    return text


def in_record(sample: dict, err: DataError) -> DataError:
    """`err` prefixed with the record it concerns; the file it names (MediaError.path) is kept."""
    wrapped = DataError(f"{where(sample)}: {err}")
    wrapped.path = getattr(err, "path", None)
    return wrapped


def plan_and_check(sample: dict, media) -> tuple[list[Expansion], str]:
    """The media plan (from the headers), then every file decoded once: errors name the record and the file."""
    try:
        expansions, plan = media.plan(sample)
        check_plan(json.loads(plan))
    except DataError as err:
        raise in_record(sample, err) from None
    return expansions, plan


def render_mm_sft(sample: dict, tokenizer, opts, media, spans_fn, ignore_index: int, budget: int) -> dict:
    """A media sample: render with content parts, label assistant turns, expand media tokens. Messages are cut to
    `budget` characters first (data/budget.py keeps the placeholders). `spans_fn`: render.conversation_spans. A
    sample longer than cutoff_len also gets the token range of each assistant turn (render.fit_turns cuts it)."""
    check_placeholders(sample)
    expansions, plan = plan_and_check(sample, media)
    messages, text_cut = cut_messages(sample["messages"], budget)
    eos_appended = False
    if STAGES[opts.stage].data_kind == "text":
        text = with_markers(messages[0]["content"], media.markers) + tokenizer.eos_token
        spans = [(0, len(text))]
    else:
        try:
            text, spans, eos_appended = spans_fn(tokenizer, to_content_parts(messages), opts, template_tools(sample))
        except DataError as err:
            raise in_record(sample, err) from None
    text, spans = collapse_markers(text, spans, getattr(media, "collapsed_markers", {}))
    in_text = getattr(media, "expand_in_text", False)
    if in_text:
        try:
            text, spans = expand_in_text(text, spans, expansions, tokenizer)
        except DataError as err:
            raise in_record(sample, err) from None
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels = turn_labels(ids, enc["offset_mapping"], spans, train_on_prompt=opts.train_on_prompt,
                         mask_history=opts.mask_history, ignore_index=ignore_index)
    unexpanded = ids
    if in_text:  # media tokens are never labels
        never = set(media.token_ids.values()) | {e.token_id for e in expansions}
        labels = [ignore_index if t in never else label for t, label in zip(ids, labels)]
    else:
        try:
            ids, labels = expand_media_tokens(ids, labels, expansions, ignore_index)
        except DataError as err:
            raise in_record(sample, err) from None
    turns = []
    if len(ids) > opts.cutoff_len:
        turns = token_ranges(enc["offset_mapping"], spans)
        if not in_text:
            turns = _expanded_ranges(unexpanded, turns, expansions)
    # a cut must not fall inside an expansion: its placeholders and its embedding tokens (Gemma 3's soft tokens)
    media_ids = {e.token_id for e in expansions} | (media.block_ids if expansions else set())
    return {"input_ids": ids, "labels": labels, "mm_plan": plan, "media_ids": media_ids, "num_text_cut": int(text_cut),
            "turns": turns, "eos_appended": eos_appended}


def _expanded_ranges(ids: list[int], ranges: list[tuple[int, int]], expansions: list[Expansion]) -> list:
    """Token ranges of `ids` moved to where they lie once expand_media_tokens has replaced its media tokens."""
    sizes = {e.token_id: iter([len(r) for r in e.replacements]) for e in expansions}
    starts = [0]
    for tok in ids:
        starts.append(starts[-1] + (next(sizes[tok]) if tok in sizes else 1))
    return [(starts[a], starts[b]) for a, b in ranges]
