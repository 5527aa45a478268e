"""How tunesmith handles a LLaMA-Factory key: the table's entry (LFKey), its four kinds and the functions that
build entries and map values. The table itself is config/lf_keys.py; config/lf_translate.py applies it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Literal

Handling = Literal["honoured", "mapped", "no_effect", "refused"]
HANDLINGS: tuple[Handling, ...] = ("honoured", "mapped", "no_effect", "refused")


class Refused(Exception):
    """A mapping function refuses this value (the message says why and what to use)."""


@dataclass(frozen=True)
class LFKey:
    name: str
    handling: Handling
    note: str  # refused: the reason and the alternative, as the error shows it
    source: str = ""
    target: str = ""  # mapped: the tunesmith key(s) it sets, for the docs
    to: Callable[[Any, dict], dict] | None = None  # mapped: value, all given keys -> tunesmith keys ({} = unset)
    check: Callable[[Any], str | None] | None = None  # honoured: a message for a value tunesmith refuses
    accept: tuple | Callable[[Any, dict], bool] = ()  # refused: values that need no feature (no effect)
    accept_doc: str = ""  # refused with a callable accept: which values it accepts, for the docs

    def accepts(self, value: Any, given: dict) -> bool:
        if callable(self.accept):
            return self.accept(value, given)
        return any(same_value(value, ok) for ok in self.accept)


def same_value(a: Any, b: Any) -> bool:
    """Equal and of the same kind, so `1` never passes for `true` nor `0` for `false`."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


# ---- constructors ------------------------------------------------------------------------------------------

def honoured(name: str, note: str = "", check=None) -> LFKey:
    return LFKey(name, "honoured", note or "same key, same meaning", check=check)


def mapped(name: str, target: str, to, note: str) -> LFKey:
    return LFKey(name, "mapped", note, target=target, to=to)


def idle(name: str, note: str) -> LFKey:
    return LFKey(name, "no_effect", note)


def refused(name: str, note: str, accept=(False, None), accept_doc: str = "") -> LFKey:
    return LFKey(name, "refused", note, accept=accept, accept_doc=accept_doc)


def unless_null(name: str, note: str) -> LFKey:
    """A setting whose default is null: any value asks for the feature."""
    return refused(name, note, accept=(None,))


def section(source: str, entries: list[LFKey]) -> dict[str, LFKey]:
    return {e.name: dataclasses.replace(e, source=source) for e in entries}


# ---- mapping functions -----------------------------------------------------------------------------------

def set_key(target: str):
    """value -> {target: value}; null (LLaMA-Factory's default) sets nothing."""
    def to(value, given):
        return {} if value is None else {target: value}
    return to


def switch_key(target: str, when_true):
    """A switch: true sets target to `when_true`; false (LLaMA-Factory's default) sets nothing."""
    def to(value, given):
        if not isinstance(value, bool):
            raise Refused(f"expects true or false, not {value!r}")
        return {target: when_true} if value else {}
    return to


class RefuseValues(dict):
    """A check refusing the listed values, each with its message (the docs list them)."""

    def __call__(self, value):
        return self.get(value) if isinstance(value, str) else None


def refused_values(entry: LFKey) -> dict[str, str]:
    """The values of an honoured key that are refused, with their messages (for the docs)."""
    return dict(entry.check) if isinstance(entry.check, RefuseValues) else {}
