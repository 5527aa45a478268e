"""The training-config form, generated from the config schema (config/schema.py GROUPS).

Each field becomes an input described by its key, group, kind, allowed values, default and doc. A value typed
into the form is read exactly like `key=value` on the command line (a YAML scalar), so the form accepts what
the CLI accepts: `a,b` for lists, `1e-4` for floats, `[{name: accuracy, weight: 2}]` for reward_funcs.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from ..config.schema import GROUPS


def _unwrap_optional(annotation) -> tuple[Any, bool]:
    """(the annotation without None, whether None is allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        return (args[0] if len(args) == 1 else annotation), nullable
    return annotation, False


def field_kind(annotation) -> tuple[str, list | None]:
    """The input to show: bool, choice (with its values), int, float, list or text."""
    inner, _ = _unwrap_optional(annotation)
    if typing.get_origin(inner) is typing.Literal:
        return "choice", list(typing.get_args(inner))
    if inner is bool:
        return "bool", [True, False]
    if inner is int:
        return "int", None
    if inner is float:
        return "float", None
    if typing.get_origin(inner) is list:
        return "list", None
    return "text", None


def default_value(field) -> Any:
    """The field's default as JSON; a list of models (reward_funcs) shows their names."""
    value = field.get_default(call_default_factory=True)
    if isinstance(value, list):
        return [getattr(v, "name", v) for v in value]
    return value


def form_schema() -> list[dict]:
    """Every group of the schema with every one of its fields, in the order of `tunesmith train --help`."""
    groups = []
    for name, cls in GROUPS.items():
        fields = []
        for key, field in cls.model_fields.items():
            kind, choices = field_kind(field.annotation)
            fields.append({"key": key, "kind": kind, "choices": choices, "default": default_value(field),
                           "nullable": _unwrap_optional(field.annotation)[1], "doc": field.description or ""})
        groups.append({"name": name, "doc": (cls.__dict__.get("__doc__") or "").strip(), "fields": fields})
    return groups
