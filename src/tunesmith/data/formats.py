"""alpaca / sharegpt / openai rows -> Samples (see data/sample.py).

Everything format-specific ends here: after conversion a record is a list of
{role, content} messages with roles system/user/assistant/tool, so rendering,
packing and the methods never look at the original columns again.

Bad records are collected in an `_error` column during the (parallel) map
rather than raised inside the workers, so the user gets one clean DataError
naming the dataset and record, or, with skip_bad_samples, a count of what was
dropped and why.
"""

from __future__ import annotations

import json
import logging
import os
from functools import partial
from pathlib import Path

import datasets
from datasets import Features, List, Value

from tunesmith.data.pages import PageReleasing
from tunesmith.data.registry import DatasetSpec
from tunesmith.data.sample import SAMPLE_COLUMNS, make_sample, tool_calls_text
from tunesmith.data.sources import ROW_INDEX
from tunesmith.errors import DataError
from tunesmith.stages import STAGES

logger = logging.getLogger("tunesmith")

# Plain text and online-RL prompts need no response: the policy writes the answer.
_PROMPT_ONLY_KINDS = ("text", "prompts")


def _prompt_only(stage: str) -> bool:
    return STAGES[stage].data_kind in _PROMPT_ONLY_KINDS
_MAX_LOGGED_SKIPS = 5
_ERROR = "_error"

_MESSAGE = {"role": Value("string"), "content": Value("string"), "tool_calls": Value("string")}
# Explicit types: a worker whose shard holds only bad records would otherwise
# infer null-typed columns that cannot be concatenated with the other shards.
SAMPLE_FEATURES = Features({
    "messages": List(_MESSAGE),
    "tools": Value("string"),
    "images": List(Value("string")),
    "videos": List(Value("string")),
    "audios": List(Value("string")),
    "rejected": List(_MESSAGE),
    "kto_tag": Value("bool"),
    "source": Value("string"),
    "index": Value("int64"),
    "extra": Value("string"),
    _ERROR: Value("string"),
})


# Converting a row takes 50-70 us of Python; starting a pool of workers, sharding and joining their caches costs
# 0.3-0.6 s (1,000 sharegpt rows on 2 CPUs: one process 0.05 s, a pool of 8 0.33-0.63 s). A worker pays for
# itself only with thousands of rows to convert.
ROWS_PER_CONVERT_WORKER = 10_000


def convert_workers(num_rows: int, num_proc: int | None) -> int | None:
    """Workers for converting `num_rows` rows: preprocessing_num_workers at most, one per 10,000 rows; None (this
    process) below two."""
    workers = min(num_proc or 1, num_rows // ROWS_PER_CONVERT_WORKER)
    return workers if workers > 1 else None


def convert_rows(
    rows: datasets.Dataset,
    name: str,
    spec: DatasetSpec,
    dataset_dir: str | Path,
    *,
    stage: str,
    placeholders: dict | None = None,
    skip_bad_samples: bool = False,
    num_proc: int | None = None,
    skipped_records: list | None = None,
) -> tuple[datasets.Dataset, int]:
    """Convert every row to a Sample; returns (samples, number of skipped records).

    With skip_bad_samples=False the first bad record raises DataError; with True
    bad records are removed, counted, the first few reasons logged, and each one
    appended to `skipped_records` ({"dataset", "index", "reason"}) when given.
    """
    check_columns(rows.column_names, name, spec, stage)
    convert = partial(
        _convert_row, name=name, spec=spec, stage=stage, placeholders=dict(placeholders or {}),
        media_dir=os.path.abspath(os.path.join(str(dataset_dir), spec.media_dir or "")),
    )
    converted = rows.map(
        PageReleasing(convert, every=4096), with_indices=True, remove_columns=rows.column_names, features=SAMPLE_FEATURES,
        num_proc=convert_workers(len(rows), num_proc), desc=f"Converting {name}",
    )
    errors = _errors(converted)
    if errors and not skip_bad_samples:
        more = f" ({len(errors) - 1} more bad record(s) after it)" if len(errors) > 1 else ""
        raise DataError(f"{errors[0]['reason']}{more}. Fix the data, or set skip_bad_samples: true to drop bad "
                        f"records.")
    for error in errors[:_MAX_LOGGED_SKIPS]:
        logger.warning("skipping %s", error["reason"])
    if errors:
        logger.warning("dataset '%s': skipped %d of %d records", name, len(errors), len(rows))
        converted = converted.filter(lambda e: not e, input_columns=[_ERROR])
        if skipped_records is not None:
            skipped_records.extend(errors)
    return converted.select_columns(list(SAMPLE_COLUMNS)), len(errors)


def _errors(converted: datasets.Dataset) -> list[dict]:
    """The bad records, read from the error column by arrow (not one Python string per record)."""
    import pyarrow.compute as pc

    column = converted.data.column(_ERROR)
    bad = pc.filter(column, pc.not_equal(column, ""))
    return [json.loads(e) for e in bad.to_pylist()]


def _required_fields(spec: DatasetSpec, stage: str) -> list[str]:
    if spec.formatting == "alpaca":
        fields = ["prompt"]
        if not spec.ranking and not _prompt_only(stage):
            fields.append("response")
    else:
        fields = ["messages"]
    return fields + (["chosen", "rejected"] if spec.ranking else [])


def check_columns(column_names: list[str], name: str, spec: DatasetSpec, stage: str) -> None:
    """Dataset-level check, before any work: every needed column exists.

    A default column the user did not ask for (alpaca's `input`, or `output` for
    stages that need no response) may be absent: many datasets have no `input`.
    """
    required = _required_fields(spec, stage)
    available = [c for c in column_names if c != ROW_INDEX]
    if "response" in required and STAGES[stage].data_kind == "pairs":  # an unranked alpaca entry
        raise DataError(f"dataset '{name}': stage '{stage}' trains on chosen/rejected pairs, and its dataset_info.json "
                        "entry is not a preference dataset; mark it `ranking: true` and map its pairs with "
                        f"\"columns\": {{\"chosen\": ..., \"rejected\": ...}}; the data has columns {available}.")
    for field, column in spec.columns.model_dump().items():
        if column is None:
            if field in required:
                raise DataError(
                    f"dataset '{name}': formatting '{spec.formatting}'{' with ranking' if spec.ranking else ''} "
                    f"for stage '{stage}' needs a '{field}' column. Add \"columns\": {{\"{field}\": \"<column>\"}} "
                    f"to its dataset_info.json entry; the data has columns {available}."
                )
            continue
        optional_default = field not in required and field not in spec.user_columns
        if column not in column_names and not optional_default:
            raise DataError(
                f"dataset '{name}': column '{column}' (the '{field}' column) is not in the data; the data has "
                f"columns {available}. Set \"columns\": {{\"{field}\": \"<one of those>\"}} in its dataset_info.json entry."
            )


def _convert_row(row: dict, position: int, *, name, spec, stage, placeholders, media_dir) -> dict:
    index = row.get(ROW_INDEX, position)
    where = f"dataset '{name}', record {index}"
    try:
        sample = _build_sample(row, index, where, name, spec, stage, placeholders, media_dir)
        sample[_ERROR] = ""
    except DataError as e:
        sample = make_sample([], source=name, index=index)
        sample[_ERROR] = json.dumps({"dataset": name, "index": index, "reason": str(e)}, ensure_ascii=False)
    return sample


def _build_sample(row, index, where, name, spec: DatasetSpec, stage, placeholders, media_dir) -> dict:
    if spec.formatting == "alpaca":
        messages, rejected = _alpaca_messages(row, spec, where, stage)
    else:
        messages, rejected = _chat_messages(row, spec, where)
    _check_conversation(messages, spec, stage, where)
    for m in messages + rejected:
        m["content"] = fill_placeholders(m["content"], placeholders)
    kto_tag = _value(row, spec, "kto_tag", where)
    if kto_tag is not None and not isinstance(kto_tag, bool):
        raise DataError(f"{where}: kto_tag must be true or false, got {kto_tag!r}")
    return make_sample(
        messages, source=name, index=index, tools=_tools(row, spec, where), rejected=rejected, kto_tag=kto_tag,
        images=_media(row, spec, "images", where, media_dir),
        videos=_media(row, spec, "videos", where, media_dir),
        audios=_media(row, spec, "audios", where, media_dir),
        extra=_extra_columns(row, spec),
    )


def _extra_columns(row: dict, spec: DatasetSpec) -> dict:
    """Columns no mapping consumes (an RL `answer`, a `target_box`, a reward `margin`): kept for later stages."""
    used = {value for value in spec.columns.model_dump().values() if value}
    extra = {k: v for k, v in row.items() if k not in used and not k.startswith("_") and v is not None}
    if spec.columns.margin and row.get(spec.columns.margin) is not None:
        extra["margin"] = row[spec.columns.margin]
    return extra


def fill_placeholders(text: str, placeholders: dict[str, str]) -> str:
    """Replace {{key}} by its value (e.g. {{name}}, {{author}} in identity data); None leaves it as is."""
    for key, value in placeholders.items():
        if value is None:
            continue
        text = text.replace("{{" + key + "}}", str(value))
    return text


def _value(row: dict, spec: DatasetSpec, field: str, where: str, required: bool = False):
    """The row's value for a spec column; a required one must be present and not null."""
    column = getattr(spec.columns, field)
    value = row.get(column) if column is not None else None
    if value is None and required:
        keys = [k for k, v in row.items() if v is not None and k != ROW_INDEX]
        raise DataError(
            f"{where}: no value in column '{column}' (the '{field}' column). The record has {keys}; if the "
            f"{field} is under another key, set \"columns\": {{\"{field}\": \"<that key>\"}} in dataset_info.json"
        )
    return value


def _text(value, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{where}: {what} must be a string, got {type(value).__name__}: {str(value)[:80]}")
    return value


def _alpaca_messages(row: dict, spec: DatasetSpec, where: str, stage: str) -> tuple[list[dict], list[dict]]:
    """history pairs, then prompt + "\\n" + query as the user turn, then the response."""
    messages = []
    system = _value(row, spec, "system", where)
    if system:
        messages.append({"role": "system", "content": _text(system, "system", where)})
    for turn, pair in enumerate(_value(row, spec, "history", where) or []):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise DataError(f"{where}: history turn {turn} must be a [query, response] pair, got {str(pair)[:80]}")
        messages.append({"role": "user", "content": _text(pair[0], f"history turn {turn} query", where)})
        messages.append({"role": "assistant", "content": _text(pair[1], f"history turn {turn} response", where)})
    prompt = _text(_value(row, spec, "prompt", where, required=True), "the prompt", where)
    query = _value(row, spec, "query", where)
    content = prompt + "\n" + _text(query, "the query", where) if query else prompt
    messages.append({"role": "user", "content": content})
    if spec.ranking:
        chosen = _text(_value(row, spec, "chosen", where, required=True), "chosen", where)
        rejected = _text(_value(row, spec, "rejected", where, required=True), "rejected", where)
        messages.append({"role": "assistant", "content": chosen})
        return messages, [{"role": "assistant", "content": rejected}]
    response = _value(row, spec, "response", where, required="response" in _required_fields(spec, stage))
    if response is not None:
        messages.append({"role": "assistant", "content": _text(response, "the response", where)})
    return messages, []


def _role_map(spec: DatasetSpec) -> dict[str, str]:
    t = spec.tags
    pairs = [(t.user_tag, "user"), (t.assistant_tag, "assistant"), (t.observation_tag, "tool"),
             (t.function_tag, "assistant"), (t.system_tag, "system")]
    return {tag: role for tag, role in pairs if tag is not None}


def _message(raw, roles: dict[str, str], spec: DatasetSpec, what: str, where: str) -> dict:
    if not isinstance(raw, dict):
        raise DataError(f"{where}: {what} must be an object with '{spec.tags.role_tag}' and "
                        f"'{spec.tags.content_tag}', got {str(raw)[:80]}")
    tag = raw.get(spec.tags.role_tag)
    if tag not in roles:
        raise DataError(
            f"{where}: {what} has unknown role {tag!r} (key '{spec.tags.role_tag}'); known roles: {sorted(roles)}. "
            f"Map it with \"tags\" in dataset_info.json (user_tag, assistant_tag, observation_tag, function_tag, "
            f"system_tag, role_tag, content_tag)"
        )
    content = raw.get(spec.tags.content_tag)
    if raw.get("tool_calls"):  # an OpenAI assistant message that calls tools; its content may be null
        calls = tool_calls_text(raw["tool_calls"], what, where)
        return {"role": roles[tag], "content": _text(content or "", f"{what}'s content", where), "tool_calls": calls}
    if tag == spec.tags.function_tag:  # LLaMA-Factory's function_call turn: the content is the call
        return {"role": "assistant", "content": "", "tool_calls": tool_calls_text(content, what, where)}
    return {"role": roles[tag], "content": _text(content, f"{what}'s content", where)}


def _chat_messages(row: dict, spec: DatasetSpec, where: str) -> tuple[list[dict], list[dict]]:
    """sharegpt / openai messages; a first system-tag turn wins over the system column."""
    raw = _value(row, spec, "messages", where, required=True)
    if not isinstance(raw, list):
        raise DataError(f"{where}: column '{spec.columns.messages}' must be a list of messages, got {type(raw).__name__}")
    roles = _role_map(spec)
    messages = [_message(m, roles, spec, f"message {i}", where) for i, m in enumerate(raw)]
    for i, m in enumerate(messages[1:], start=1):
        if m["role"] == "system":
            raise DataError(f"{where}: message {i} is a system turn; only the first message may be one")
    system = _value(row, spec, "system", where)
    if system and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": _text(system, "system", where)})
    if not spec.ranking:
        return messages, []
    chosen = _message(_value(row, spec, "chosen", where, required=True), roles, spec, "chosen", where)
    rejected = _message(_value(row, spec, "rejected", where, required=True), roles, spec, "rejected", where)
    for what, m in (("chosen", chosen), ("rejected", rejected)):
        if m["role"] != "assistant":
            raise DataError(f"{where}: {what} must be an assistant turn ('{spec.tags.assistant_tag}'), got {m['role']}")
    return messages + [chosen], [rejected]


def _check_conversation(messages: list[dict], spec: DatasetSpec, stage: str, where: str) -> None:
    """What each stage needs from the turn order (see _prompt_only)."""
    turns = [m for m in messages if m["role"] != "system"]
    if not turns:
        raise DataError(f"{where}: empty conversation (no user or assistant turn)")
    if STAGES[stage].data_kind == "text":
        if not messages[0]["content"].strip():
            raise DataError(f"{where}: empty text for stage pt")
        return
    _check_turn_order(turns, where)
    if spec.ranking:
        prompt_last = turns[-2]["role"] if len(turns) >= 2 else None
        if prompt_last not in ("user", "tool"):
            raise DataError(f"{where}: a preference record's conversation must end with a user (or tool) turn "
                            f"before chosen/rejected; it ends with {prompt_last or 'nothing'}")
        return
    if not _prompt_only(stage) and turns[-1]["role"] != "assistant":
        raise DataError(
            f"{where}: conversation ends with a {turns[-1]['role']} turn, but stage '{stage}' trains on the final "
            f"assistant reply. Remove the trailing turn(s) or add the reply"
        )


def _check_turn_order(turns: list[dict], where: str) -> None:
    """After the system prompt (`turns` are the other messages), a prompt (a user turn, or tool results: several in
    a row count as one) and an assistant answer alternate, a prompt first: LLaMA-Factory's rule (it drops other
    records with a warning)."""
    previous = None
    for n, message in enumerate(turns, start=1):
        role = message["role"]
        if role == previous == "tool":
            continue
        if (role == "assistant") == (previous in ("assistant", None)):
            follows = f"after a {previous} turn" if previous else "first"
            raise DataError(f"{where}: turn {n} ({role}: {message['content'][:40]!r}) comes {follows}; user (or "
                            "tool) turns and assistant turns must alternate, a user turn first (LLaMA-Factory drops "
                            "such records)")
        previous = role


def _tools(row: dict, spec: DatasetSpec, where: str) -> str:
    tools = _value(row, spec, "tools", where)
    if not isinstance(tools, str):
        return json.dumps(tools, ensure_ascii=False) if tools is not None else ""
    try:
        json.loads(tools or "[]")
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: the tools column is not JSON ({err}); write it as a JSON list of function "
                        'specs, [{"name": ..., "description": ..., "parameters": {...}}]') from None
    return tools


def _media(row: dict, spec: DatasetSpec, field: str, where: str, media_dir: str) -> list[str]:
    """Media paths made absolute against dataset_dir (or the entry's media_dir); URLs kept."""
    value = _value(row, spec, field, where)
    items = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise DataError(f"{where}: {field} must be a path or a list of paths, got {type(value).__name__}")
    paths = []
    for item in items:
        path = _text(item, f"each entry of {field}", where)
        is_url = path.startswith(("http://", "https://", "data:"))
        paths.append(path if is_url or os.path.isabs(path) else os.path.join(media_dir, path))
    return paths
