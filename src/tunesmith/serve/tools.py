"""Tool calls in a model's answer, in the format its chat template asks for, as OpenAI tool_calls.

A template that renders `tools` also tells the model how to call them; the format is read from the
template text:
- hermes (Qwen2.5/Qwen3/Qwen-VL and many others): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
  one block per call, anywhere in the answer;
- json (Llama 3.x): the whole answer is `{"name": ..., "parameters": {...}}` (optionally after
  `<|python_tag|>`), several calls separated by `;`.
An answer whose calls do not parse is returned as plain content, never dropped.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _call(obj) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(obj["name"], arguments, f"call_{uuid.uuid4().hex[:24]}")


def _json_objects(text: str) -> list | None:
    try:
        return [json.loads(part) for part in text.split(";") if part.strip()]
    except json.JSONDecodeError:
        return None


@dataclass(frozen=True)
class ToolFormat:
    name: str
    marker: str  # where calls begin in streamed text
    anywhere: bool  # the marker may follow content (hermes) or must open the answer (json)

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content without the calls or None when empty, calls); ([text], []) when the calls do not parse."""
        if self.anywhere:
            blocks = _HERMES.findall(text)
            objects = _json_objects(";".join(blocks)) if blocks else None
            content = _HERMES.sub("", text).strip()
        else:
            body = text.strip().removeprefix("<|python_tag|>").strip()
            objects = _json_objects(body) if body.startswith("{") else None
            content = ""
        calls = [_call(obj) for obj in objects or []]
        if not calls or None in calls:
            return text, []
        return content or None, calls

    def start(self, text: str) -> int:
        """Where the calls begin in `text` (len(text) when none has begun); a tail that could still become the
        marker counts as begun, so it is held back from streaming."""
        if not self.anywhere:
            head = text.lstrip()
            opens = head.startswith(("{", "<|python_tag|>")) or (head and "<|python_tag|>".startswith(head))
            return 0 if opens or not head else len(text)
        at = text.find(self.marker)
        if at >= 0:
            return at
        for n in range(min(len(self.marker) - 1, len(text)), 0, -1):
            if text.endswith(self.marker[:n]):
                return len(text) - n
        return len(text)


FORMATS = (ToolFormat("hermes", "<tool_call>", True), ToolFormat("json", "<|python_tag|>", False))


def tool_format(jinja: str) -> ToolFormat | None:
    """The tool-call format a chat template asks for; None when it renders no tools (or one we cannot parse)."""
    if "tools" not in jinja:
        return None
    if "<tool_call>" in jinja:
        return FORMATS[0]
    if "<|python_tag|>" in jinja or '"parameters"' in jinja:
        return FORMATS[1]
    return None


class ToolStream:
    """Streams content until a tool call may begin, then holds the rest for parsing at the end."""

    def __init__(self, fmt: ToolFormat):
        self.fmt, self.text, self.shown = fmt, "", 0

    def feed(self, piece: str) -> str:
        self.text += piece
        start = self.fmt.start(self.text)
        if start <= self.shown:
            return ""
        out, self.shown = self.text[self.shown:start], start
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content not yet streamed, calls)."""
        content, calls = self.fmt.parse(self.text)
        if not calls:
            return self.text[self.shown:], []
        shown = self.text[:self.shown]
        rest = (content or "")[len(shown.strip()):] if content and content.startswith(shown.strip()) else ""
        return rest, calls
