"""A reasoning model's leading `<think>...</think>` block, split from its answer as the text streams.

The API returns the thinking as `reasoning_content` (the field vLLM and DeepSeek use) and the answer as
`content`; an empty block (qwen3 with thinking off) disappears; a block that never closes (the answer
ran out of tokens while thinking) is all reasoning.
"""

from __future__ import annotations

_OPEN, _CLOSE = "<think>", "</think>"


def _partial_tail(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that is a proper beginning of `marker`."""
    return next((n for n in range(min(len(marker) - 1, len(text)), 0, -1) if text.endswith(marker[:n])), 0)


class ThinkSplitter:
    def __init__(self):
        self.state = "start"  # start -> think -> after -> content, or start -> content
        self.buf = ""
        self.reasoning_shown = False

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) safe to show now."""
        self.buf += text
        if self.state == "start":
            head = self.buf.lstrip()
            if not head or (_OPEN.startswith(head) and head != _OPEN):
                return "", ""
            if not head.startswith(_OPEN):
                self.state = "content"
            else:
                self.state, self.buf = "think", head[len(_OPEN):]
        if self.state == "think":
            return self._think(), self._after()
        return "", self._after()

    def _think(self) -> str:
        at = self.buf.find(_CLOSE)
        if at >= 0:
            reasoning, self.buf, self.state = self.buf[:at], self.buf[at + len(_CLOSE):], "after"
            return self._show_reasoning(reasoning.rstrip())
        keep = len(self.buf) - _partial_tail(self.buf, _CLOSE)
        while keep > 0 and self.buf[keep - 1].isspace():  # trailing space may be all there is before </think>
            keep -= 1
        reasoning, self.buf = self.buf[:keep], self.buf[keep:]
        return self._show_reasoning(reasoning)

    def _show_reasoning(self, text: str) -> str:
        if not self.reasoning_shown:
            text = text.lstrip()
        self.reasoning_shown = self.reasoning_shown or bool(text)
        return text

    def _after(self) -> str:
        if self.state == "after":
            self.buf = self.buf.lstrip()
            if not self.buf:
                return ""
            self.state = "content"
        if self.state != "content":
            return ""
        out, self.buf = self.buf, ""
        return out

    def flush(self) -> tuple[str, str]:
        """What was held back, at the end of the answer."""
        if self.state == "think":
            rest, self.buf = self.buf.rstrip(), ""
            return self._show_reasoning(rest), ""
        if self.state == "start":
            rest, self.buf = self.buf, ""
            return "", rest.strip() and rest
        return "", self._after()


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole answer."""
    splitter = ThinkSplitter()
    parts = [splitter.feed(text), splitter.flush()]
    reasoning = "".join(p[0] for p in parts)
    return reasoning or None, "".join(p[1] for p in parts)
