"""`accuracy`: 1/0 when a response's final answer equals the row's `answer` (math answers).

The final answer is extracted (<answer> tag, \\boxed{}, last number, last line),
normalised and compared exactly or numerically; math-verify, when installed,
decides what the plain comparison cannot.
"""

from __future__ import annotations

import importlib.util
import math
import re
import threading
from fractions import Fraction

from .rows import check_lengths, column

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# A number not glued to a word before it ("x2" is no number; "12-5" ends with 5, not -5):
# optional minus, thousands groups or plain digits, decimals, an optional /denominator.
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?![\w])")


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if there is none."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
    return None


def extract_answer(response: str) -> str:
    """The final answer of a response.

    The content of the last <answer>...</answer> if there is one (and inside it the last
    \\boxed{} if it has one), else the last \\boxed{...}, else the last number, else the
    last non-empty line. "" for an empty response.
    """
    tagged = _ANSWER_TAG.findall(response)
    if tagged:
        inner = tagged[-1]
        boxed = last_boxed(inner)
        return (boxed if boxed is not None else inner).strip()
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed.strip()
    numbers = _NUMBER.findall(response)
    if numbers:
        return numbers[-1]
    lines = [line.strip() for line in response.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def normalize_answer(text: str) -> str:
    """strip, lowercase, drop surrounding $…$ and \\text{…}, a trailing period, thousands commas."""
    s = str(text).strip().lower()
    if len(s) >= 2 and s.startswith("$") and s.endswith("$"):
        s = s.strip("$").strip()
    m = re.fullmatch(r"\\text\{(.*)\}", s)
    if m:
        s = m.group(1).strip()
    s = s.rstrip(".").strip()
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s


def _as_number(s: str) -> Fraction | None:
    try:
        return Fraction(s)  # "12", "-3", "0.75", "3/4" (exact, so 0.1 + 0.2 style issues never arise)
    except (ValueError, ZeroDivisionError):
        pass
    try:
        value = float(s)  # "1e3", "12."
    except ValueError:
        return None
    return Fraction(value) if math.isfinite(value) else None


def answers_match(predicted: str, gold: str) -> bool:
    """Normalised exact match, with numeric equality for numbers ("12.0" == "12", "0.5" == "1/2")."""
    p, g = normalize_answer(predicted), normalize_answer(gold)
    if p == g:
        return True
    pn, gn = _as_number(p), _as_number(g)
    return pn is not None and gn is not None and pn == gn


def has_math_verify() -> bool:
    return importlib.util.find_spec("math_verify") is not None


def _math_verify_match(predicted: str, gold: str) -> bool | None:
    """math-verify's verdict, or None when it cannot parse one of the two (then the caller falls back).

    math-verify's timeouts use SIGALRM, which only works in the main thread; elsewhere they are off.
    """
    from math_verify import parse, verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None

    def parsed(text: str):
        # as LaTeX first: the plain-expression parser reads "1+x" as 1
        candidates = (text,) if text.strip().startswith("$") else (f"${text}$", text)
        for candidate in candidates:
            result = parse(candidate, parsing_timeout=timeout)
            if result:
                return result
        return None

    try:
        g, p = parsed(gold), parsed(predicted)
        if not g or not p:
            return None
        return bool(verify(g, p, timeout_seconds=timeout))
    except Exception:  # math-verify raises on odd LaTeX; the plain comparison still gives an answer
        return None


def accuracy(prompts: list[str], responses: list[str], samples: list[dict], *, answer_key: str = "answer",
             use_math_verify: bool | None = None, **kwargs) -> list[float]:
    """1.0 when the response's final answer (see extract_answer) equals the row's `answer`, else 0.0.

    Equality: normalised exact match or numeric equality (answers_match); if that fails and
    math-verify is installed (`pip install tunesmith[math]`; use_math_verify=None means "when
    installed"), math-verify decides, so "\\frac{1}{2}" matches "0.5" and "$x+1$" matches "1+x".
    """
    check_lengths(prompts, responses, samples, "accuracy")
    verify = has_math_verify() if use_math_verify is None else use_math_verify
    rewards = []
    for i, (response, sample) in enumerate(zip(responses, samples)):
        gold = str(column(sample, answer_key, "accuracy", i, "answer_key"))
        predicted = extract_answer(response)
        ok = bool(predicted) and answers_match(predicted, gold)
        if not ok and verify and predicted:
            ok = bool(_math_verify_match(predicted, gold))
        rewards.append(1.0 if ok else 0.0)
    return rewards
