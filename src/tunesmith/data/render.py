"""Sample -> input_ids and labels, through the model's own chat template.

The template is never hand-copied: the conversation is rendered to text by
`tokenizer.apply_chat_template`, tokenized once with offsets, and the supervised
spans (assistant turns) are found by rendering the conversation up to each
assistant turn. So the ids are exactly what `apply_chat_template` gives, and the
labels follow the template whatever its format.

Each message is first cut to a character budget derived from cutoff_len (data/budget.py), so a huge record costs
what a normal one does; the kept tokens are the same (the head of the conversation is what cutoff_len keeps).
Records whose media cannot be used are, with skip_bad_samples, emitted as empty rows whose `bad` column names the
dataset, record, file and reason (the pipeline counts and lists them); without it they raise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from jinja2 import TemplateError

from ..errors import DataError
from ..stages import STAGES
from .budget import char_budget, cut_messages
from .mm import check_placeholders, has_media, media_counts, render_mm_sft
from .sample import template_messages, template_tools, token_ranges, turn_labels, where, with_default_system

IGNORE_INDEX = -100


@dataclass(frozen=True)
class RenderOptions:
    """Everything that shapes the token ids; part of the cache fingerprint."""

    stage: str = "sft"
    chat_template: str | None = None
    render_kwargs: dict = field(default_factory=dict)
    cutoff_len: int = 2048
    train_on_prompt: bool = False
    mask_history: bool = False
    skip_bad_samples: bool = False
    char_budget: int | None = None  # characters kept per message (data/budget.py); None: derived from cutoff_len
    # online RL: (column, reward, option) for each column a configured reward reads from every prompt row
    reward_columns: tuple = ()
    default_system: str | None = None  # the system message of every conversation that has none


def message_budget(tokenizer, opts: RenderOptions) -> int:
    return opts.char_budget or char_budget(tokenizer, opts.cutoff_len)


def bad_record(sample: dict, err: Exception) -> str:
    """The `bad` column of a skipped record: JSON naming the dataset, record, file (when known) and reason."""
    return json.dumps({"dataset": sample.get("source"), "index": sample.get("index"),
                       "file": getattr(err, "path", None), "reason": str(err)}, ensure_ascii=False)


def _skippable(sample: dict, opts: RenderOptions) -> bool:
    """skip_bad_samples covers records whose media cannot be used; other render errors concern every record."""
    return opts.skip_bad_samples and has_media(sample)


def render_text(tokenizer, messages, opts: RenderOptions, *, tools=None, add_generation_prompt=False) -> str:
    """The conversation as the chat template writes it (reasoning moved where the template reads it:
    reasoning_as_thinking); a conversation the template refuses (its raise_exception, e.g. Gemma 2's "System role
    not supported") is a DataError with the template's words. A template that does not parse or reads an undefined
    name is not the record's fault: its own error stands."""
    try:
        return tokenizer.apply_chat_template(
            reasoning_as_thinking(template_messages(messages), opts.chat_template),
            tools=tools,
            chat_template=opts.chat_template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **opts.render_kwargs,
        )
    except TemplateError as err:
        if type(err) is not TemplateError:  # a syntax error, an undefined name: the template's, not the record's
            raise
        raise DataError(f"the chat template refuses this conversation: {err}; change the record, or set template: "
                        "to one that renders it") from None


def conversation_spans(tokenizer, messages, opts: RenderOptions, tools=None) -> tuple[str, list, bool]:
    """The rendered text, the [start, end) character span of every assistant turn in it, and whether an
    end-of-sequence token was appended after the last answer (_close_last_answer).

    A turn starts where the generation prompt before it ends and ends after the
    template's end-of-turn marker. Templates that render history differently from
    the last turn (Qwen3 drops history think blocks) are handled by locating the
    turn's content and the end marker inside the full text.
    """
    full = render_text(tokenizer, messages, opts, tools=tools)
    spans = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = render_text(tokenizer, messages[:k], opts, tools=tools, add_generation_prompt=True)
        start = len(prefix) if full.startswith(prefix) else _history_turn_start(tokenizer, full, messages, k, opts,
                                                                                 tools, prefix)
        upto = render_text(tokenizer, messages[: k + 1], opts, tools=tools)
        end = len(upto) if full.startswith(upto) else _turn_end_in_history(tokenizer, full, start, upto, messages, k)
        _check_calls_rendered(full[start:end], message, k)
        spans.append((start, end))
    return _close_last_answer(tokenizer, full, spans, messages)


def _check_calls_rendered(turn: str, message: dict, k: int) -> None:
    """A chat template that ignores a message's tool_calls would train the turn as an empty answer."""
    calls = message.get("tool_calls")
    names = [call["name"] for call in json.loads(calls)] if isinstance(calls, str) and calls else []
    missing = [name for name in names if name not in turn]
    if missing:
        raise DataError(f"assistant turn {k} calls {missing[0]!r}, but the chat template does not render tool "
                        "calls; use a template that does (template: qwen or qwen3, or the model's own if it has "
                        "a tool format)")


def _close_last_answer(tokenizer, full: str, spans: list, messages: list) -> tuple[str, list, bool]:
    """A template that writes nothing (or only whitespace) after the last answer (GLM-4.5/4.6: a turn ends where the
    next role token starts) would teach the model never to stop: the eos token is appended there and supervised, as
    LLaMA-Factory's `efficient_eos` templates do."""
    eos = tokenizer.eos_token
    if not spans or not eos or spans[-1][1] != len(full):
        return full, spans, False
    answer = _text_of(messages[-1]["content"]).split("</think>")[-1].strip()
    if not answer or not full.rstrip().endswith(answer):
        return full, spans, False
    return full + eos, spans[:-1] + [(spans[-1][0], len(full) + len(eos))], True


def _history_turn_start(tokenizer, full: str, messages: list, k: int, opts: RenderOptions, tools, prompt: str) -> int:
    """Where assistant turn k starts when the generation prompt is not what the full text has there.

    Reasoning templates with thinking off (Qwen3's enable_thinking=false) end the generation prompt with an
    empty think block, which history turns do not carry. The turn then starts after the part of the
    generation prompt the full text does have (its role header), cut back to a whole token of the prompt,
    so a first answer character that happens to match the prompt is never taken for header; the answer
    must follow right there (a turn whose reasoning the template keeps is not this case, and is refused).
    """
    history = render_text(tokenizer, messages[:k], opts, tools=tools)
    answer = _text_of(messages[k]["content"]).split("</think>")[-1].strip()
    if full.startswith(history) and prompt.startswith(history):
        header, rest = prompt[len(history):], full[len(history):]
        common = 0
        while common < min(len(header), len(rest)) and header[common] == rest[common]:
            common += 1
        ends = [end for _, end in tokenizer(header, add_special_tokens=False, return_offsets_mapping=True)
                ["offset_mapping"] if end <= common]
        start = len(history) + max(ends, default=0)
        if start > len(history) and full.startswith(answer, start):
            return start
    if opts.render_kwargs.get("enable_thinking") is False and "</think>" in _text_of(messages[k]["content"]):
        raise DataError(
            f"assistant turn {k} carries reasoning (<think>...</think>) but thinking is off (enable_thinking: false "
            "or a *_nothink template), and the chat template keeps that reasoning after a prompt that closed "
            "thinking; drop the reasoning from the data, or turn thinking on.")
    raise DataError(
        f"the chat template renders the conversation before assistant turn {k} differently on its own; "
        "tunesmith cannot find the supervised span. Use a named template (e.g. template: chatml)."
    )


def _turn_end_in_history(tokenizer, full: str, start: int, upto: str, messages: list, k: int) -> int:
    turn = upto[start:]
    text = _text_of(messages[k]["content"]).strip()
    # Reasoning templates drop a history turn's think block: look for the answer part too. A turn that calls tools
    # is found by what the template wrote after its reasoning (the calls, and the answer before them).
    candidates = [text, text.split("</think>")[-1].strip()]
    if messages[k].get("tool_calls"):
        candidates = [turn.split("</think>")[-1].strip()]
    for content in dict.fromkeys(candidates):
        at = turn.rfind(content)
        end_marker = turn[at + len(content) :] if at >= 0 else ""
        pos = full.find(content, start)
        if at >= 0 and pos >= 0:
            end_marker = _history_end_marker(tokenizer, full, pos + len(content), end_marker, messages)
            if end_marker is not None:
                return pos + len(content) + len(end_marker)
    raise DataError(
        "cannot locate an assistant turn of the conversation in the rendered text; "
        "the chat template rewrites it. Use a named template (e.g. template: chatml)."
    )


def _turn_closers(tokenizer, full: str, messages: list) -> list[str]:
    """The special tokens that close a turn in the full text: those right after a user message's text (<|end|> in
    GPT-OSS and Phi-3.5; a template that closes no turn, GLM's, has none), longest first."""
    specials = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    users = [_text_of(m["content"]).strip() for m in messages if m["role"] == "user"]
    found = {t for t in specials for text in users if text and text + t in full}
    return sorted(found, key=len, reverse=True)


def _history_end_marker(tokenizer, full: str, pos: int, last_marker: str, messages: list) -> str | None:
    """The end-of-turn marker of a history answer ending at `pos` in the full text: the last turn's marker when the
    full text has it there; else the turn-closing token that follows the answer (GPT-OSS ends the last answer with
    <|return|> and earlier ones with <|end|>, as it ends user turns). None when neither holds."""
    if full.startswith(last_marker, pos):
        return last_marker
    return next((t for t in _turn_closers(tokenizer, full, messages) if full.startswith(t, pos)), None)


def reasoning_as_thinking(messages: list, chat_template: str | None) -> list:
    """For chat templates that read the reasoning from a message's `thinking` field (GPT-OSS's analysis channel),
    a leading <think>...</think> block of an assistant answer moves there; other templates get the messages as
    they are."""
    if not chat_template or "message.thinking" not in chat_template:
        return messages
    moved = []
    for message in messages:
        content = message.get("content")
        if message["role"] == "assistant" and isinstance(content, str) and "thinking" not in message \
                and content.lstrip().startswith("<think>") and "</think>" in content:
            reasoning, answer = content.split("</think>", 1)
            message = {**message, "thinking": reasoning.split("<think>", 1)[1].strip("\n"),
                       "content": answer.lstrip("\n")}
        moved.append(message)
    return moved


def _text_of(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def _render_sft_uncut(sample: dict, tokenizer, opts: RenderOptions) -> dict:
    """input_ids and labels of the whole (character-budgeted) conversation, the [start, end) token range of every
    assistant turn (for a conversation longer than cutoff_len, which fit_turns cuts), whether the last token is an
    end-of-sequence token appended after the template's text, and the text-cut flag."""
    messages = sample["messages"]
    if not messages or messages[-1]["role"] != "assistant":
        raise DataError(f"{where(sample)}: the conversation must end with an assistant turn")
    messages, text_cut = cut_messages(messages, message_budget(tokenizer, opts))
    try:
        text, spans, eos_appended = conversation_spans(tokenizer, messages, opts, template_tools(sample))
    except DataError as err:
        raise DataError(f"{where(sample)}: {err}") from None
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels = turn_labels(ids, enc["offset_mapping"], spans, train_on_prompt=opts.train_on_prompt,
                         mask_history=opts.mask_history)
    turns = token_ranges(enc["offset_mapping"], spans) if len(ids) > opts.cutoff_len else []  # fit_turns' input
    return {"input_ids": ids, "labels": labels, "turns": turns, "eos_appended": eos_appended,
            "num_text_cut": int(text_cut)}


def render_sft(sample: dict, tokenizer, opts: RenderOptions) -> dict:
    """input_ids, labels (-100 outside supervised spans), truncated flag, text-cut flag. A conversation longer than
    cutoff_len is shortened turn by turn as LLaMA-Factory does (fit_turns), so a long prompt keeps its answer."""
    row = _render_sft_uncut(sample, tokenizer, opts)
    ids, labels = fit_turns(row, opts.cutoff_len, opts.mask_history)
    return {"input_ids": ids, "labels": labels, "num_truncated": int(len(row["input_ids"]) > opts.cutoff_len),
            "num_text_cut": row["num_text_cut"]}


def fit_turns(row: dict, cutoff_len: int, mask_history: bool) -> tuple[list, list]:
    """The ids and labels of a rendered conversation cut to cutoff_len the way LLaMA-Factory cuts one: each turn is
    a prompt part (everything since the previous answer) and its answer; turns are taken in order (with
    mask_history the last first, kept in place), each within the budget left, split between its prompt and answer
    by pair_budget, both cut to their heads; a turn that finds no budget left is dropped. An end-of-sequence token
    appended after the last answer (templates that write none) keeps its place at the end."""
    ids, labels = row["input_ids"], row["labels"]
    if len(ids) <= cutoff_len:
        return ids, labels
    reserved = 1 if row["eos_appended"] else 0
    end = len(ids) - reserved
    bounds, previous = [], 0
    for start, stop in row["turns"]:
        bounds.append((previous, start, stop))
        previous = stop
    bounds[-1] = (*bounds[-1][:2], end)  # whatever the template writes after the last answer goes with it
    kept, total = [], reserved
    for source, target, stop in (reversed(bounds) if mask_history else bounds):
        if total >= cutoff_len:
            break
        source_len, target_len = pair_budget(target - source, stop - target, cutoff_len - total)
        kept.append([(source, source + source_len), (target, target + target_len)])
        total += source_len + target_len
    if mask_history:
        kept.reverse()
    ranges = [r for turn in kept for r in turn] + [(end, len(ids))]
    return ([t for a, b in ranges for t in ids[a:b]], [t for a, b in ranges for t in labels[a:b]])


def fit_media(row: dict, opts: RenderOptions) -> dict | None:
    """A media sample cut to cutoff_len turn by turn as a text one (fit_turns: a long prompt keeps its answer),
    unless the cut would take any of its media tokens (the model needs all of them): then None."""
    if len(row["input_ids"]) <= opts.cutoff_len:
        return {**row, "num_truncated": 0}
    ids, labels = fit_turns(row, opts.cutoff_len, opts.mask_history)
    media = row["media_ids"]
    if sum(t in media for t in ids) != sum(t in media for t in row["input_ids"]):
        return None
    return {**row, "input_ids": ids, "labels": labels, "num_truncated": 1}


def render_pt(sample: dict, tokenizer, opts: RenderOptions) -> dict:
    """Plain text + EOS, every token supervised. Long texts are split, not cut, into cutoff_len pieces."""
    messages = sample["messages"]
    if not messages:
        raise DataError(f"{where(sample)}: empty text")
    text = _text_of(messages[0]["content"])
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if tokenizer.bos_token_id is not None and getattr(tokenizer, "add_bos_token", False):
        ids = [tokenizer.bos_token_id] + ids
    ids = ids + [tokenizer.eos_token_id]
    return {"input_ids": ids, "labels": list(ids), "num_truncated": 0, "num_text_cut": 0}


def split_long(row: dict, cutoff_len: int) -> list[dict]:
    """pt rows longer than cutoff_len become several rows (no token lost)."""
    ids, labels = row["input_ids"], row["labels"]
    return [
        {"input_ids": ids[i : i + cutoff_len], "labels": labels[i : i + cutoff_len]}
        for i in range(0, len(ids), cutoff_len)
    ]


def _refuse_media(sample: dict) -> None:
    counts = {kind: n for kind, n in media_counts(sample).items() if n}
    if counts:
        check_placeholders(sample)
        listed = ", ".join(f"{n} {kind}(s)" for kind, n in counts.items())
        raise DataError(
            f"{where(sample)} has {listed}, but the model is a text-only model: use a vision/audio-language model "
            "(e.g. model_name_or_path: tiny:qwen2_5_vl) or drop the media columns from dataset_info.json"
        )




def _response_only(opts: RenderOptions) -> RenderOptions:
    """Preference and KTO losses score only the final response: no prompt or history labels."""
    from dataclasses import replace

    return replace(opts, mask_history=True, train_on_prompt=False)


def _render_one(sample: dict, tokenizer, opts: RenderOptions, media) -> dict:
    if has_media(sample):
        if media is None:
            _refuse_media(sample)
        row = fit_media(render_mm_sft(sample, tokenizer, opts, media, conversation_spans, IGNORE_INDEX,
                                      message_budget(tokenizer, opts)), opts)
        if row is None:
            raise DataError(f"{where(sample)}: its media tokens do not fit in cutoff_len={opts.cutoff_len}")
        return row
    return render_sft(sample, tokenizer, opts)


def batch_samples(batch: dict, opts: RenderOptions):
    """The samples of a `datasets.map` batch, each conversation opened by default_system where it has no system
    message."""
    for values in zip(*batch.values()):
        sample = dict(zip(batch, values))
        if sample.get("messages"):
            sample["messages"] = with_default_system(sample["messages"], opts.default_system)
        yield sample


_PAIR_COLUMNS = ("input_ids", "labels", "rejected_input_ids", "rejected_labels", "length", "num_truncated",
                 "num_text_cut", "bad", "mm_plan", "margin", "source")


def render_pair_batch(batch: dict, tokenizer, opts: RenderOptions, media=None) -> dict:
    """rm / dpo: the chosen and the rejected conversation of each record, labels on the final response."""
    opts = _response_only(opts)
    out = {k: [] for k in _PAIR_COLUMNS}
    for sample in batch_samples(batch, opts):
        if not sample.get("rejected"):
            raise DataError(f"{where(sample)}: stage rm/dpo needs pairs; mark the dataset `ranking: true` with "
                            "chosen and rejected columns in dataset_info.json")
        try:
            chosen, rejected = _render_fitted(
                [sample, {**sample, "messages": sample["messages"][:-1] + sample["rejected"]}], tokenizer, opts, media)
        except DataError as err:
            if not _skippable(sample, opts):
                raise
            row = dict.fromkeys(_PAIR_COLUMNS, 0) | {"input_ids": [], "labels": [], "rejected_input_ids": [],
                                                       "rejected_labels": [], "mm_plan": "", "margin": 0.0,
                                                       "bad": bad_record(sample, err), "source": sample["source"]}
        else:
            row = {"input_ids": chosen["input_ids"], "labels": chosen["labels"],
                   "rejected_input_ids": rejected["input_ids"], "rejected_labels": rejected["labels"],
                   "length": len(chosen["input_ids"]) + len(rejected["input_ids"]),
                   "num_truncated": int(bool(chosen["num_truncated"] or rejected["num_truncated"])),
                   "num_text_cut": int(bool(chosen["num_text_cut"] or rejected["num_text_cut"])), "bad": "",
                   "mm_plan": chosen.get("mm_plan", ""), "margin": _margin(sample), "source": sample["source"]}
        for key in _PAIR_COLUMNS:
            out[key].append(row[key])
    return out


def _render_fitted(samples: list[dict], tokenizer, opts: RenderOptions, media) -> list[dict]:
    """Rows of conversations that share their prompt (a pair's chosen and rejected). Text rows longer than
    cutoff_len are shortened as LLaMA-Factory does it (its infer_seqlen: the prompt's head and each response's
    head, the token budget split between them by pair_budget), all alike, so a long prompt costs prompt tokens
    rather than the sample. Media rows are cut at cutoff_len, never inside their media tokens."""
    if has_media(samples[0]):
        return [_render_one(sample, tokenizer, opts, media) for sample in samples]
    rows = [_render_sft_uncut(sample, tokenizer, opts) for sample in samples]
    prompts = [_prompt_length(row["labels"]) for row in rows]
    target = max(len(row["input_ids"]) - p for row, p in zip(rows, prompts))
    cut = any(len(row["input_ids"]) > opts.cutoff_len for row in rows)
    source_len, target_len = pair_budget(max(prompts), target, opts.cutoff_len)
    out = []
    for row, prompt in zip(rows, prompts):
        def keep(seq: list) -> list:
            return seq[:min(prompt, source_len)] + seq[prompt:prompt + target_len] if cut else seq
        out.append({"input_ids": keep(row["input_ids"]), "labels": keep(row["labels"]), "num_truncated": int(cut),
                    "num_text_cut": row["num_text_cut"]})
    return out


def _prompt_length(labels: list[int]) -> int:
    return next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), len(labels))


def pair_budget(source_len: int, target_len: int, cutoff_len: int) -> tuple[int, int]:
    """(prompt tokens, response tokens) to keep of a pair that does not fit, as LLaMA-Factory splits them: a
    response shorter than half the budget is kept whole, a prompt shorter than half keeps it and the response takes
    the rest, otherwise the budget is shared in proportion to their lengths."""
    if target_len * 2 < cutoff_len:
        max_target = cutoff_len
    elif source_len * 2 < cutoff_len:
        max_target = cutoff_len - source_len
    else:
        max_target = int(cutoff_len * (target_len / (source_len + target_len)))
    new_target = min(max_target, target_len)
    return min(max(cutoff_len - new_target, 0), source_len), new_target


_KTO_COLUMNS = ("input_ids", "labels", "kl_input_ids", "kl_labels", "kto_tag", "length", "num_truncated",
                "num_text_cut", "bad", "mm_plan", "source")


def render_kto_batch(batch: dict, tokenizer, opts: RenderOptions, media=None) -> dict:
    """kto: each (prompt, completion, label), plus the prompt with the next record's completion for the KL
    estimate (mismatched pairs, as in the KTO paper)."""
    opts = _response_only(opts)
    samples = list(batch_samples(batch, opts))
    out = {k: [] for k in _KTO_COLUMNS}
    for i, sample in enumerate(samples):
        if sample.get("kto_tag") is None:
            raise DataError(f"{where(sample)}: stage kto needs each record's kto_tag (true: a desirable response, "
                            "false: an undesirable one), and this record has none; give it one, or, where no column "
                            "is mapped, map it with \"columns\": {\"kto_tag\": \"<column>\"} in dataset_info.json")
        other = samples[(i + 1) % len(samples)]
        try:
            (row,) = _render_fitted([sample], tokenizer, opts, media)
            (kl,) = _render_fitted([{**sample, "messages": sample["messages"][:-1] + other["messages"][-1:]}],
                                   tokenizer, opts, media)
        except DataError as err:
            if not _skippable(sample, opts):
                raise
            values = {"input_ids": [], "labels": [], "kl_input_ids": [], "kl_labels": [], "kto_tag": bool(sample["kto_tag"]),
                      "length": 0, "num_truncated": 0, "num_text_cut": 0, "bad": bad_record(sample, err), "mm_plan": "",
                      "source": sample["source"]}
        else:
            values = {"input_ids": row["input_ids"], "labels": row["labels"], "kl_input_ids": kl["input_ids"],
                      "kl_labels": kl["labels"], "kto_tag": bool(sample["kto_tag"]),
                      "length": len(row["input_ids"]) + len(kl["input_ids"]), "num_truncated": row["num_truncated"],
                      "num_text_cut": int(bool(row["num_text_cut"] or kl["num_text_cut"])), "bad": "",
                      "mm_plan": row.get("mm_plan", ""), "source": sample["source"]}
        for key in _KTO_COLUMNS:
            out[key].append(values[key])
    return out


def _margin(sample: dict) -> float:
    value = json.loads(sample.get("extra") or "{}").get("margin", 0.0)
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        raise DataError(f"{where(sample)}: margin must be a number, got {value!r}") from None


_BATCH_COLUMNS = ("input_ids", "labels", "length", "num_truncated", "num_text_cut", "too_long", "bad", "mm_plan",
                  "source")


def render_batch(batch: dict, tokenizer, opts: RenderOptions, media=None) -> dict:
    """`datasets.map(batched=True)` entry: one input row can give several pt rows.

    `media` (a models.media_processor.MediaProcessor) handles records with images/videos/audios;
    without it such records are refused. A media record longer than cutoff_len whose cut
    would fall inside its media tokens is flagged `too_long` and dropped (and counted) later; one whose media
    cannot be decoded raises, or with skip_bad_samples is flagged `bad` (and listed) instead.
    """
    out = {key: [] for key in _BATCH_COLUMNS}

    def emit(piece, truncated=0, too_long=0, plan="", bad="", text_cut=0):
        for key, value in (("input_ids", piece["input_ids"]), ("labels", piece["labels"]),
                           ("length", len(piece["input_ids"])), ("num_truncated", truncated),
                           ("num_text_cut", text_cut), ("too_long", too_long), ("bad", bad), ("mm_plan", plan),
                           ("source", sample["source"])):
            out[key].append(value)

    for sample in batch_samples(batch, opts):
        if has_media(sample):
            if media is None:
                _refuse_media(sample)
            try:
                rendered = render_mm_sft(sample, tokenizer, opts, media, conversation_spans, IGNORE_INDEX,
                                         message_budget(tokenizer, opts))
            except DataError as err:
                if not opts.skip_bad_samples:
                    raise
                emit({"input_ids": [], "labels": []}, bad=bad_record(sample, err))
                continue
            row = fit_media(rendered, opts)
            if row is None:
                emit({"input_ids": [], "labels": []}, too_long=1, text_cut=rendered["num_text_cut"])
            else:
                emit(row, row["num_truncated"], plan=row["mm_plan"], text_cut=row["num_text_cut"])
        elif STAGES[opts.stage].data_kind == "text":
            for piece in split_long(render_pt(sample, tokenizer, opts), opts.cutoff_len):
                emit(piece)
        else:
            rendered = render_sft(sample, tokenizer, opts)
            emit(rendered, rendered["num_truncated"], text_cut=rendered["num_text_cut"])
    return out
