"""OpenAI response bodies: whole answers, streamed chunks, usage; the answer's text shaped into content,
reasoning_content and tool_calls the same way whether it streams or not."""

from __future__ import annotations

import time
import uuid

from .engine import Finished
from .reasoning import ThinkSplitter
from .tools import ToolFormat, ToolStream


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(num_prompt_tokens: int, num_completion_tokens: int) -> dict:
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_completion_tokens,
            "total_tokens": num_prompt_tokens + num_completion_tokens}


class ChatShaper:
    """One choice's text -> message deltas: a leading think block as reasoning_content, tool calls (when the
    request has tools) as tool_calls, the rest as content."""

    def __init__(self, tools: ToolFormat | None):
        self.think = ThinkSplitter()
        self.tools = ToolStream(tools) if tools else None
        self.num_calls = 0

    def feed(self, text: str) -> list[dict]:
        return self._deltas(*self.think.feed(text))

    def finish(self, finished: Finished) -> tuple[list[dict], str]:
        """(the last deltas, the finish_reason)."""
        deltas = self._deltas(*self.think.flush())
        if self.tools:
            content, calls = self.tools.finish()
            if content:
                deltas.append({"content": content})
            deltas += [{"tool_calls": [{"index": i, **call.as_openai()}]} for i, call in enumerate(calls)]
            self.num_calls = len(calls)
        return deltas, "tool_calls" if self.num_calls else finished.reason

    def _deltas(self, reasoning: str, content: str) -> list[dict]:
        out = [{"reasoning_content": reasoning}] if reasoning else []
        if content and self.tools:
            content = self.tools.feed(content)
        return out + ([{"content": content}] if content else [])


def merge_deltas(deltas: list[dict]) -> dict:
    """The assistant message the deltas of one choice add up to."""
    message: dict = {"role": "assistant", "content": None}
    for delta in deltas:
        for key in ("content", "reasoning_content"):
            if key in delta:
                message[key] = (message.get(key) or "") + delta[key]
        if "tool_calls" in delta:
            message.setdefault("tool_calls", []).extend(
                {k: v for k, v in call.items() if k != "index"} for call in delta["tool_calls"])
    return message


class ChatBodies:
    """The bodies of one /v1/chat/completions response (all chunks of a stream share id and created)."""

    def __init__(self, model: str):
        self.id, self.model, self.created = new_id("chatcmpl"), model, int(time.time())

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, messages: list[tuple[dict, str]], usage_counts: dict) -> dict:
        choices = [{"index": i, "message": m, "finish_reason": reason, "logprobs": None}
                   for i, (m, reason) in enumerate(messages)]
        return {**self._head("chat.completion"), "choices": choices, "usage": usage_counts}

    def chunk(self, index: int, delta: dict, finish_reason: str | None = None, with_usage: bool = False) -> dict:
        body = {**self._head("chat.completion.chunk"),
                "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}
        return {**body, "usage": None} if with_usage else body

    def usage_chunk(self, usage_counts: dict) -> dict:
        return {**self._head("chat.completion.chunk"), "choices": [], "usage": usage_counts}


class CompletionBodies:
    def __init__(self, model: str):
        self.id, self.model, self.created = new_id("cmpl"), model, int(time.time())

    def _head(self) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model}

    def whole(self, texts: list[tuple[str, str]], usage_counts: dict) -> dict:
        choices = [{"index": i, "text": text, "finish_reason": reason, "logprobs": None}
                   for i, (text, reason) in enumerate(texts)]
        return {**self._head(), "choices": choices, "usage": usage_counts}

    def chunk(self, index: int, text: str, finish_reason: str | None = None, with_usage: bool = False) -> dict:
        body = {**self._head(), "choices": [{"index": index, "text": text, "finish_reason": finish_reason,
                                             "logprobs": None}]}
        return {**body, "usage": None} if with_usage else body

    def usage_chunk(self, usage_counts: dict) -> dict:
        return {**self._head(), "choices": [], "usage": usage_counts}
