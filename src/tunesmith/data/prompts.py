"""Online-RL prompts as a data kind: each sample's conversation up to the answer, rendered with the
generation prompt, tokenized and cached like any dataset (through pipeline.prepare_data).

A record that ends with an assistant turn (an SFT-style record) gives that turn as the reference
`answer` for the rewards, as does `reward_model.ground_truth` (verl's parquet prompt files). Media prompts (vision-language models) are planned from their headers,
as for SFT: the media tokens are expanded to what the processor would produce, and the plan
travels with the prompt. Each row keeps its columns (answer, target_box, ...) as JSON in `sample`.
"""

from __future__ import annotations

import json

from ..errors import DataError
from .budget import cut_messages
from .mm import (check_placeholders, collapse_markers, expand_in_text, expand_media_tokens, has_media, in_record,
                 plan_and_check, to_content_parts)
from .render import IGNORE_INDEX, RenderOptions, bad_record, batch_samples, message_budget, render_text
from .sample import template_tools, where

_COLUMNS = ("input_ids", "labels", "text", "mm_plan", "sample", "length", "num_truncated", "bad", "source")
# The built-in rewards that read a column of every prompt row: name -> (the option naming it, its default)
# (rollout/rewards/accuracy.py and grounding.py; a test keeps the two in step)
READS_COLUMN = {"accuracy": ("answer_key", "answer"), "grounding": ("box_key", "target_box")}


def reward_columns(reward_funcs) -> tuple:
    """(column, reward, option) for each column that the configured rewards read from every prompt row."""
    out = []
    for func in reward_funcs:
        if func.name in READS_COLUMN:
            option, default = READS_COLUMN[func.name]
            out.append((func.kwargs.get(option, default), func.name, option))
    return tuple(out)


def _check_reward_columns(sample: dict, extra: dict, opts: RenderOptions) -> None:
    for column, reward, option in opts.reward_columns:
        if extra.get(column) is None:
            raise DataError(f"{where(sample)}: reward '{reward}' reads a '{column}' column from every prompt, and "
                            f"this record has none (its columns: {sorted(extra) or 'only messages'}); add it to the "
                            "record (or a final assistant turn, which counts as the answer), map it in "
                            f"dataset_info.json's columns, or point the reward at another column with `{option}`")


def render_prompt_batch(batch: dict, tokenizer, opts: RenderOptions, media=None) -> dict:
    """`datasets.map(batched=True)` entry for prompts: input_ids (no labels), text, mm_plan, sample.
    A prompt whose media cannot be decoded raises, or with skip_bad_samples is flagged `bad` (and listed)."""
    out = {k: [] for k in _COLUMNS}
    for sample in batch_samples(batch, opts):
        messages = sample["messages"]
        extra = json.loads(sample.get("extra") or "{}")
        if messages and messages[-1]["role"] == "assistant":
            extra.setdefault("answer", messages[-1]["content"])
            messages = messages[:-1]
        verl = extra.get("reward_model")  # verl's parquet prompt files keep the reference answer here
        if isinstance(verl, dict) and verl.get("ground_truth") is not None:
            extra.setdefault("answer", verl["ground_truth"])
        _check_reward_columns(sample, extra, opts)
        try:
            prompt = _prompt_ids(sample, messages, tokenizer, opts, media)
        except DataError as err:
            if not (opts.skip_bad_samples and has_media(sample)):
                raise
            prompt, extra, messages = {"ids": [], "text": "", "mm_plan": "", "bad": bad_record(sample, err)}, {}, []
        if len(prompt["ids"]) > opts.cutoff_len:
            count = "far more" if prompt["cut"] else f"{len(prompt['ids'])}"
            raise DataError(f"{where(sample)}: the prompt has {count} tokens, more than cutoff_len={opts.cutoff_len}; "
                            "raise cutoff_len")
        for key, value in (("input_ids", prompt["ids"]), ("labels", []), ("text", prompt["text"]),
                           ("mm_plan", prompt["mm_plan"]), ("length", len(prompt["ids"])), ("num_truncated", 0),
                           ("bad", prompt.get("bad", "")), ("sample", json.dumps({**extra, "messages": messages})),
                           ("source", sample["source"])):
            out[key].append(value)
    return out


def _prompt_ids(sample: dict, messages: list[dict], tokenizer, opts: RenderOptions, media) -> dict:
    """The prompt's ids. Messages are cut to the character budget first: a cut prompt is longer than cutoff_len
    whatever it holds past the cut, so it is refused as it would be uncut (data/budget.py)."""
    has = has_media(sample)
    if has and media is None:
        raise DataError(f"{where(sample)} has media but the model is a text-only model")
    if has:
        check_placeholders({**sample, "messages": messages})
        expansions, plan = plan_and_check(sample, media)
    cut_msgs, cut = cut_messages(messages, message_budget(tokenizer, opts))
    try:
        text = render_text(tokenizer, to_content_parts(cut_msgs) if has else cut_msgs, opts,
                           tools=template_tools(sample), add_generation_prompt=True)
    except DataError as err:
        raise in_record(sample, err) from None
    collapsed = collapse_markers(text, [], getattr(media, "collapsed_markers", {}))[0] if has else text
    if has and getattr(media, "expand_in_text", False):  # Gemma 3: its newlines merge as in the processor's call
        expanded, _ = expand_in_text(collapsed, [], expansions, tokenizer)
        return {"ids": tokenizer(expanded, add_special_tokens=False)["input_ids"], "text": text, "mm_plan": plan,
                "cut": cut}
    ids = tokenizer(collapsed, add_special_tokens=False)["input_ids"]
    if not has:
        return {"ids": ids, "text": text, "mm_plan": "", "cut": cut}
    ids, _ = expand_media_tokens(ids, list(ids), expansions, IGNORE_INDEX)
    return {"ids": ids, "text": text, "mm_plan": plan, "cut": cut}


def prompt_records(dataset) -> list[dict]:
    """The rollout source's view of a prepared prompt dataset: ids, text, mm_plan and the sample's columns."""
    if dataset is None:
        return []
    columns = dataset.select_columns([c for c in ("input_ids", "text", "mm_plan", "sample")
                                      if c in dataset.column_names]).to_dict()
    plans = columns.get("mm_plan") or [""] * len(dataset)  # text-only data keeps no media plans
    return [{"ids": ids, "text": text, "mm_plan": plan or "", "sample": json.loads(sample)}
            for ids, text, plan, sample in zip(columns["input_ids"], columns["text"], plans, columns["sample"])]
