"""Form values <-> flat config: validation as `tunesmith train` does it, YAML import (LLaMA-Factory's too) and
export.

The form sends each field as the text a user would type after `key=` on the command line; an empty text
leaves the key unset. Validation is the CLI's own: build_config (the LLaMA-Factory key table, the schema, the
cross-checks) and then resolve() with the facts of this machine, as `tunesmith train` runs them before
anything else.
"""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ..config.lf_keys import LF_KEYS
from ..config.lf_translate import translate
from ..config.load import KEY_TO_GROUP, build_config, parse_cli_items, read_yaml, train_command_problems
from ..config.schema import GROUPS, SECRET_KEYS
from ..errors import ConfigError, TunesmithError
from .form import field_kind

# Where a secret typed into the form goes instead of a file (the design: secrets come from the environment).
SECRET_ENV = {"swanlab_api_key": "SWANLAB_API_KEY", "wandb_api_key": "WANDB_API_KEY", "hf_hub_token": "HF_TOKEN"}


def parse_form(values: dict[str, Any]) -> dict[str, Any]:
    """Form texts -> flat config values, each parsed as `key=text` on the command line; blank = unset."""
    flat: dict[str, Any] = {}
    for key, text in values.items():
        if text is None or (isinstance(text, str) and not text.strip()):
            continue
        if not isinstance(text, str):
            flat[key] = text  # already a value (JSON true/false/number from the page)
            continue
        choice = _choice(key, text.strip())
        if choice is not _NO_CHOICE:
            flat[key] = choice
            continue
        _, parsed = parse_cli_items([f"{key}={text.strip()}"])
        flat.update({k: _as_number(k, v) for k, v in parsed.items()})
    return flat


_NO_CHOICE = object()


def _kind(key: str) -> tuple[str | None, list | None]:
    group = KEY_TO_GROUP.get(key)
    return field_kind(GROUPS[group].model_fields[key].annotation) if group else (None, None)


def _choice(key: str, text: str) -> Any:
    """A value picked from a field's list is that value: `no` of save_strategy stays the string "no" (YAML
    would read it as false)."""
    _, choices = _kind(key)
    for choice in choices or ():
        if str(choice).lower() == text.lower():
            return choice
    return _NO_CHOICE


def _as_number(key: str, value: Any) -> Any:
    """`1e-4` is a string to YAML 1.1 (it wants `1.0e-4`); for a float field it means the number, as pydantic
    would read it, so the exported YAML holds the number."""
    if not isinstance(value, str) or _kind(key)[0] != "float":
        return value
    try:
        return float(value)
    except ValueError:
        return value  # validation names it


def parse_extra(text: str) -> dict[str, Any]:
    """The form's free 'other keys' box: one `key: value` or `key=value` per line (any key, LF's included)."""
    flat: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=") if "=" in line.split(":")[0] else line.partition(":")
        if not sep or not key.strip():
            raise TunesmithError(f"other keys, line {number}: '{line}' is not `key: value` or `key=value`")
        flat.update(parse_cli_items([f"{key.strip()}={value.strip()}"])[1])
    return flat


def as_text(value: Any) -> str:
    """A value as the form shows it: text that parse_form reads back to the same value."""
    if isinstance(value, str) and _reads_back(value, value):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) and "," not in v for v in value):
        joined = ",".join(value)
        if _reads_back(joined, joined) or len(value) > 1:
            return joined
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip()
    return text[:-3].strip() if text.endswith("...") else text


def _reads_back(text: str, value: Any) -> bool:
    return parse_cli_items([f"k={text}"])[1].get("k") == value


def validate(flat: dict[str, Any]) -> dict:
    """{'ok', 'problems': [{'keys', 'message'}], 'resolved'}: the CLI's checks, every problem at once."""
    from ..config.resolve import resolve
    from ..train.setup import run_facts

    try:
        cfg = build_config(None, flat)
        if problems := train_command_problems(cfg):
            raise ConfigError(problems)
        resolved = resolve(cfg, run_facts(cfg))
    except TunesmithError as err:
        messages = list(getattr(err, "problems", None) or [str(err)])
        return {"ok": False, "problems": [_located(m) for m in messages], "resolved": None}
    return {"ok": True, "problems": [], "resolved": _public(resolved.flat())}


def _public(flat: dict) -> dict:
    return {k: ("<redacted>" if k in SECRET_KEYS and v else v) for k, v in flat.items()}


_QUOTED = re.compile(r"'([A-Za-z0-9_.]+)'")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def _located(message: str) -> dict:
    """A problem with the form keys it names, so the page can show it beside each of them."""
    quoted = [k.split(".")[0] for k in _QUOTED.findall(message)]
    named = quoted or [w for w in _WORD.findall(message.split(";")[0]) if w in KEY_TO_GROUP]
    keys = list(dict.fromkeys(named))
    return {"keys": keys, "message": message}


def import_yaml(text: str) -> dict:
    """A tunesmith or LLaMA-Factory YAML -> form values. LLaMA-Factory keys are translated by the key table:
    mapped keys arrive as the tunesmith keys they set, keys without effect and refused keys are listed, keys
    the schema does not have go to the 'other keys' box (validation names them with a "did you mean")."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "import.yaml"
        path.write_text(text, encoding="utf-8")
        flat = read_yaml(path)  # the CLI's reader: a key given twice is an error naming both lines
    lf = translate(flat)
    known = {k: v for k, v in lf.values.items() if k in KEY_TO_GROUP}
    other = {k: v for k, v in lf.values.items() if k not in KEY_TO_GROUP}
    return {"values": {k: as_text(v) for k, v in known.items()},
            "extra": "\n".join(f"{k}: {as_text(v)}" for k, v in other.items()),
            "idle": lf.idle, "problems": lf.problems}


def export_yaml(flat: dict[str, Any], flavour: str = "tunesmith") -> str:
    """The set keys as a YAML file. tunesmith: every key, run with `tunesmith train`. llamafactory: only the
    keys LLaMA-Factory reads with the same meaning; the others are written as comments, so none is lost
    silently. Secrets are never written (they come from the environment)."""
    if flavour not in ("tunesmith", "llamafactory"):
        raise TunesmithError(f"unknown export flavour '{flavour}'; use tunesmith or llamafactory")
    secrets = [k for k in flat if k in SECRET_KEYS]
    kept = {k: v for k, v in flat.items() if k not in SECRET_KEYS}
    head = ["# tunesmith train this.yaml" if flavour == "tunesmith" else "# llamafactory-cli train this.yaml"]
    head += [f"# {k}: not written; set {SECRET_ENV.get(k, k.upper())} in the environment" for k in secrets]
    if flavour == "llamafactory":
        lf_only = {k: v for k, v in kept.items() if _lf_reads(k)}
        rest = [k for k in kept if k not in lf_only]
        if rest:
            head.append("# tunesmith keys LLaMA-Factory does not read (kept as comments):")
            head += [f"# {k}: {as_text(kept[k])}" for k in rest]
        kept = lf_only
    body = yaml.safe_dump(kept, sort_keys=False, allow_unicode=True) if kept else ""
    return "\n".join(head) + "\n" + body


def _lf_reads(key: str) -> bool:
    entry = LF_KEYS.get(key)
    return entry is not None and entry.handling == "honoured"


def secret_env(flat: dict[str, Any]) -> dict[str, str]:
    """Environment variables that carry the secrets of a launched run instead of its YAML file."""
    return {SECRET_ENV[k]: str(v) for k, v in flat.items() if k in SECRET_ENV and v}
