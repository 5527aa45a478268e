"""Text cut to a character budget before tokenizing: the cost of a record is bounded by cutoff_len, not its size.

Rendering keeps heads: render_sft keeps the head of each turn's prompt and of its answer, at most cutoff_len
tokens in all (render.fit_turns, LLaMA-Factory's cut), and a media sample keeps ids[:cutoff_len] (or is dropped
when the cut would fall inside its media tokens). So a message longer than the text that cutoff_len tokens can
cover contributes nothing past that point, and tokenizing a 50 MB message only to keep its first 2,048 tokens
would cost hundreds of MB (a Python int and an offset pair per token). Each message is cut first, to

    budget = (cutoff_len + 64) x max(32, the longest token of the vocabulary, in characters)

characters: no token covers more characters than the longest one, so the first cutoff_len tokens of the rendered
text lie inside the first `budget` characters of any message they reach into; the 64 spare tokens keep the
tokenizer's pre-tokenization boundary (a word cut in two) clear of the kept tokens.

Templates look at a message's content, not just its start: Qwen3 and DeepSeek-R1 templates split a turn at
`</think>` and render only the answer of history turns; tool templates test `startswith('<tool_response>')` /
`endswith('</tool_response>')`; media placeholders must stay (their count is checked). So the content is split at
those markers, every piece longer than the budget keeps its head (`budget` characters) and its last 256 characters
(for `endswith` tests), and the markers all stay. A template then renders the cut content the way it renders the
whole one, up to past the kept tokens; tests/unit/data/test_render.py compares the ids of long records rendered both
ways. One difference from cutting the whole text remains: where a turn's prompt and answer both need more than half
of the budget left, the budget is split in proportion to their lengths, and a cut message counts with its cut
length, so the split differs from LLaMA-Factory's (still heads of the same prompt and answer). Plain-text
pretraining (stage pt) is never cut: it splits long texts into several rows and keeps every token.
"""

from __future__ import annotations

import re
import weakref

# The longest token of common vocabularies is far below this; a tokenizer whose longest token is longer uses that.
CHARS_PER_TOKEN = 32
SPARE_TOKENS = 64
TAIL_CHARS = 256

# Content markers chat templates branch on (reasoning, tool calls and results) and the media placeholders.
_MARKERS = re.compile(r"(</?think>|</?tool_call>|</?tool_response>|<image>|<video>|<audio>)")

_LONGEST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def longest_token_chars(tokenizer) -> int:
    """Characters of the longest vocabulary entry (byte-level entries count bytes: an upper bound on characters)."""
    try:
        return _LONGEST[tokenizer]
    except (KeyError, TypeError):
        pass
    longest = max((len(token) for token in tokenizer.get_vocab()), default=CHARS_PER_TOKEN)
    try:
        _LONGEST[tokenizer] = longest
    except TypeError:  # not weak-referenceable: recomputed next time
        pass
    return longest


def char_budget(tokenizer, cutoff_len: int) -> int:
    """Characters of one message that can still reach the first cutoff_len tokens (see the module docstring)."""
    return (cutoff_len + SPARE_TOKENS) * max(CHARS_PER_TOKEN, longest_token_chars(tokenizer))


def cut_text(text: str, budget: int) -> str:
    """`text` with every marker-free piece longer than budget + TAIL_CHARS reduced to its head and its tail."""
    if len(text) <= budget + TAIL_CHARS:
        return text
    pieces = _MARKERS.split(text)
    for i in range(0, len(pieces), 2):  # even positions are text, odd ones the markers split on
        piece = pieces[i]
        if len(piece) > budget + TAIL_CHARS:
            pieces[i] = piece[:budget] + piece[-TAIL_CHARS:]
    return "".join(pieces)


def cut_messages(messages: list[dict], budget: int) -> tuple[list[dict], bool]:
    """(messages with each text content cut, whether anything was cut). Content parts' texts are cut alike."""
    out, cut = [], False
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            new = cut_text(content, budget)
        elif isinstance(content, list):
            new = [{**part, "text": cut_text(part["text"], budget)} if isinstance(part, dict)
                   and isinstance(part.get("text"), str) else part for part in content]
        else:
            new = content
        if new is not content and new != content:
            cut = True
            message = {**message, "content": new}
        out.append(message)
    return out, cut
