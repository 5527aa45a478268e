"""LLaMA-Factory keys -> tunesmith keys, by the table in config/lf_keys.py: mapped keys translated, keys without
effect set aside, refused keys reported; and LLaMA-Factory's launcher switches (USE_MCA, USE_MEGATRON_BRIDGE)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .lf_key_kinds import LFKey, Refused, same_value
from .lf_keys import LF_ENV, LF_ENV_BACKENDS, LF_KEYS, SECRETS


@dataclass
class Translation:
    values: dict[str, Any]  # tunesmith keys (and unknown keys, left for the caller to report)
    idle: list[str]  # keys accepted without effect, in the order given
    problems: list[str]


def _shown(key: str, value: Any) -> str:
    return "<redacted>" if key in SECRETS else repr(value)


def translate(flat: dict[str, Any]) -> Translation:
    """The user's flat keys -> tunesmith keys; LLaMA-Factory keys mapped, set aside (no effect) or refused."""
    out = Translation({}, [], [])
    mapped: dict[str, tuple[str, Any]] = {}  # tunesmith key -> (the LLaMA-Factory key that set it, its value)
    for key, value in flat.items():
        entry = LF_KEYS.get(key)
        if entry is None or entry.handling == "honoured":
            why = entry.check(value) if entry is not None and entry.check is not None else None
            if why:
                out.problems.append(f"'{key}' = {_shown(key, value)}: {why}")
            else:
                out.values[key] = value  # tunesmith's own key, or unknown: the caller reports those
        elif entry.handling == "no_effect" or (entry.handling == "refused" and entry.accepts(value, flat)):
            out.idle.append(key)
        elif entry.handling == "refused":
            out.problems.append(f"'{key}' = {_shown(key, value)}: {entry.note}")
        else:
            _apply_mapping(entry, value, flat, out, mapped)
    return out


def _apply_mapping(entry: LFKey, value: Any, flat: dict, out: Translation, mapped: dict) -> None:
    key = entry.name
    try:
        targets = entry.to(value, flat)
    except Refused as why:
        out.problems.append(f"'{key}' = {_shown(key, value)}: {why}")
        return
    if not targets:
        out.idle.append(key)
    for target, new in targets.items():
        if _given_directly(target, flat) and not same_value(flat[target], new):
            out.problems.append(f"'{key}' = {_shown(key, value)} means {target}: {new!r}, but {target}: "
                                f"{flat[target]!r} is also set; keep one")
        elif target in mapped and not same_value(mapped[target][1], new):
            out.problems.append(f"'{key}' = {_shown(key, value)} and '{mapped[target][0]}' both set {target}, "
                                "differently; keep one")
        else:
            mapped[target] = (key, new)
            out.values[target] = new


def _given_directly(key: str, flat: dict) -> bool:
    """The user wrote this tunesmith key itself (not through a mapped LLaMA-Factory key)."""
    entry = LF_KEYS.get(key)
    return key in flat and (entry is None or entry.handling == "honoured")


def _switched_on(environ, name: str) -> bool:
    return environ.get(name, "").lower() in ("1", "true", "y")


def env_problems(environ=None) -> list[str]:
    """LLaMA-Factory launcher switches (USE_MEGATRON_BRIDGE=1) that select an engine tunesmith does not have."""
    environ = os.environ if environ is None else environ
    return [f"{name}={environ[name]} {why}" for name, why in LF_ENV.items() if _switched_on(environ, name)]


def env_backend(flat: dict, environ=None) -> tuple[dict, list[str]]:
    """USE_MCA=1 selects backend: megatron, as LLaMA-Factory's launcher does: (flat with it set, problems).
    A different backend written in the config is a conflict, reported."""
    environ = os.environ if environ is None else environ
    for name, backend in LF_ENV_BACKENDS.items():
        if not _switched_on(environ, name):
            continue
        given = flat.get("backend", "auto")
        if given not in ("auto", backend):
            return flat, [f"{name}={environ[name]} selects backend: {backend}, but backend: {given} is set; unset "
                          f"{name} or remove backend"]
        return {**flat, "backend": backend}, []
    return flat, []
