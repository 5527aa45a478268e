"""The Sample: one training example in a format-independent shape.

Every dataset format (alpaca, sharegpt, openai) is converted to this dict shape,
which is what `datasets` stores between conversion and rendering:

    {
      "messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str, "tool_calls": str}, ...],
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
messages[0]["content"]. An assistant turn that calls functions (sharegpt's function_call turn, an OpenAI
message's tool_calls) has them in "tool_calls" as JSON text of [{"name", "arguments"}, ...] ("" for none):
Arrow stores one shape for every message, and render_text hands them to the chat template as the
OpenAI-shaped list (template_messages).
"""

from __future__ import annotations

import json

import numpy as np

from tunesmith.errors import DataError

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
        "messages": [_stored(m) for m in messages],
        "tools": tools or "",
        "images": list(images or []),
        "videos": list(videos or []),
        "audios": list(audios or []),
        "rejected": [_stored(m) for m in (rejected or [])],
        "kto_tag": kto_tag,
        "source": source,
        "index": int(index),
        "extra": json.dumps(extra or {}, ensure_ascii=False, default=str),
    }


def _stored(message: dict) -> dict:
    """A message in the Sample's one shape; calls given as a list (OpenAI's, in code or a scored file) are stored
    as the converter stores them (tool_calls_text)."""
    calls = message.get("tool_calls") or ""
    if not isinstance(calls, str):
        calls = tool_calls_text(calls, "a message", "a conversation")
    return {"role": message["role"], "content": message["content"], "tool_calls": calls}


def tool_calls_text(calls, what: str, where: str) -> str:
    """A function-call turn's calls as stored in a Sample: JSON text of [{"name", "arguments"}, ...].

    `calls` is LLaMA-Factory's function_call content (JSON text of one call or of a list of calls) or an OpenAI
    message's tool_calls list ({"function": {"name", "arguments"}} items). Arguments given as JSON text (the
    OpenAI way) are parsed, so every template renders them alike; text that is not JSON is refused."""
    if isinstance(calls, str):
        try:
            calls = json.loads(calls)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: {what} is a function call but its content is not JSON ({err}); write it as "
                            '{"name": "<function>", "arguments": {...}}, or a list of those') from None
    calls = calls if isinstance(calls, list) else [calls]
    out = []
    for call in calls:
        call = call.get("function", call) if isinstance(call, dict) else call
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            raise DataError(f"{where}: {what}: a function call must be an object with a 'name' and its "
                            f"'arguments', got {str(call)[:80]}")
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: {what}: the arguments of the call to {call['name']!r} are not JSON "
                                f"({err}): {arguments[:80]}") from None
        out.append({"name": call["name"], "arguments": arguments})
    if not out:
        raise DataError(f"{where}: {what} is a function call turn without a call")
    return json.dumps(out, ensure_ascii=False)


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as chat templates read them: stored tool calls (JSON text) become OpenAI's
    [{"type": "function", "function": {"name", "arguments"}}] list; a message without calls has no such key."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if isinstance(calls, str):
            message = {k: v for k, v in message.items() if k != "tool_calls"}
            if calls:
                message["tool_calls"] = [{"type": "function", "function": call} for call in json.loads(calls)]
        out.append(message)
    return out


def with_default_system(messages: list[dict], system: str | None) -> list[dict]:
    """The conversation opened by `system` where it has no system message (or an empty one), as LLaMA-Factory's
    default_system; unchanged when system is None or empty."""
    if not system:
        return messages
    if messages and messages[0]["role"] == "system":
        return messages if messages[0].get("content") else [{**messages[0], "content": system}, *messages[1:]]
    return [{"role": "system", "content": system}, *messages]


def template_tools(sample: dict) -> list | None:
    """The sample's tool definitions as chat templates read them (OpenAI's shape): a bare function spec
    ({"name", "description", "parameters"}, LLaMA-Factory's data) is wrapped as {"type": "function", "function":
    spec}, as LLaMA-Factory and an OpenAI request to vLLM hand them to the model. None when it has none."""
    tools = json.loads(sample["tools"]) if sample.get("tools") else None
    if not tools:
        return None
    tools = tools if isinstance(tools, list) else [tools]
    return [t if not isinstance(t, dict) or "function" in t else {"type": "function", "function": t} for t in tools]


def where(sample: dict) -> str:
    """'dataset <name>, record <i>' for error messages."""
    return f"dataset '{sample.get('source', '?')}', record {sample.get('index', '?')}"


def turn_labels(ids: list[int], offsets, spans: list[tuple[int, int]], *, train_on_prompt: bool, mask_history: bool,
                ignore_index: int = -100) -> list[int]:
    """The labels of a conversation whose assistant turns cover `spans`: those turns, with mask_history the last
    only; with train_on_prompt every token (the config refuses it together with mask_history, as LLaMA-Factory)."""
    if train_on_prompt:
        return list(ids)
    return span_labels(ids, offsets, spans[-1:] if mask_history else spans, ignore_index)


def token_ranges(offsets, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The [start, end) token range of each character span (a token belongs where its first character lies)."""
    starts = np.fromiter((start for start, _ in offsets), dtype=np.int64, count=len(offsets))
    return [(int(np.searchsorted(starts, start)), int(np.searchsorted(starts, end))) for start, end in spans]


def span_labels(ids: list[int], offsets, spans: list[tuple[int, int]], ignore_index: int = -100) -> list[int]:
    """Each token's id where its first character (`offsets`: the tokenizer's offset mapping) lies inside one of
    the character spans, else ignore_index."""
    starts = np.fromiter((start for start, _ in offsets), dtype=np.int64, count=len(ids))
    inside = np.zeros(len(ids), dtype=bool)
    for start, end in spans:
        inside |= (starts >= start) & (starts < end)
    return np.where(inside, np.asarray(ids, dtype=np.int64), ignore_index).tolist()
