"""dataset_info.json -> DatasetSpec.

Users bring LLaMA-Factory's `dataset_info.json` unchanged, so the schema and the
defaults mirror LLaMA-Factory's `DatasetAttr`:

- without a `columns` block the formatting's default columns apply
  (alpaca: instruction/input/output; sharegpt: conversations; openai: messages);
- with a `columns` block, a column it does not list is None (LLaMA-Factory does
  the same), except the one column a format cannot work without (alpaca
  `prompt`, sharegpt/openai `messages`), which keeps its default;
- `tags` not listed keep the formatting's defaults (sharegpt: from/value/human/
  gpt/observation/function_call/system; openai: role/content/user/assistant/
  tool/function_call/system).

Unknown keys are errors with a "did you mean", because a misspelt column name
would otherwise silently read the wrong data.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, model_validator

from tunesmith.errors import DataError

DATASET_INFO = "dataset_info.json"

_ALPACA_ONLY = ("prompt", "query", "response", "history")
_DEFAULT_COLUMNS = {
    "alpaca": {"prompt": "instruction", "query": "input", "response": "output"},
    "sharegpt": {"messages": "conversations"},
    "openai": {"messages": "messages"},
}
# Columns a format cannot do without: they keep their default even when a
# `columns` block does not list them.
_PRIMARY_COLUMN = {"alpaca": "prompt", "sharegpt": "messages", "openai": "messages"}
_DEFAULT_TAGS = {
    "sharegpt": {
        "role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
        "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system",
    },
    "openai": {
        "role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
        "observation_tag": "tool", "function_tag": "function_call", "system_tag": "system",
    },
}
_DEFAULT_TAGS["alpaca"] = _DEFAULT_TAGS["sharegpt"]  # unused by alpaca, kept for LLaMA-Factory parity


class Columns(BaseModel):
    """Which column of the data holds each part of a record (None = not used)."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | None = None
    query: str | None = None
    response: str | None = None
    history: str | None = None
    messages: str | None = None
    system: str | None = None
    tools: str | None = None
    images: str | None = None
    videos: str | None = None
    audios: str | None = None
    chosen: str | None = None
    rejected: str | None = None
    kto_tag: str | None = None
    margin: str | None = None  # rm: a per-pair margin (how much better chosen is), used by the Bradley-Terry loss


class Tags(BaseModel):
    """The keys and role names inside sharegpt/openai message dicts."""

    model_config = ConfigDict(extra="forbid")

    role_tag: str | None = None
    content_tag: str | None = None
    user_tag: str | None = None
    assistant_tag: str | None = None
    observation_tag: str | None = None
    function_tag: str | None = None
    system_tag: str | None = None


class DatasetSpec(BaseModel):
    """One entry of dataset_info.json."""

    model_config = ConfigDict(extra="forbid")

    file_name: str | None = None
    hf_hub_url: str | None = None
    formatting: Literal["alpaca", "sharegpt", "openai"] = "alpaca"
    ranking: bool = False
    subset: str | None = None
    split: str = "train"
    folder: str | None = None
    num_samples: int | None = None
    columns: Columns = Columns()
    tags: Tags = Tags()
    # Accepted so LLaMA-Factory files load unchanged (same meaning as there); sources.py
    # says clearly when an entry can only be loaded through one of these.
    ms_hub_url: str | None = None  # ModelScope dataset id
    om_hub_url: str | None = None  # Modelers (openMind) dataset id
    script_url: str | None = None  # a folder under dataset_dir holding a dataset loading script
    cloud_file_name: str | None = None  # an s3:// or gs:// JSON file
    file_sha1: str | None = None  # old LLaMA-Factory files carry it; unused there too
    revision: str | None = None
    media_dir: str | None = None

    _user_columns: frozenset[str] = PrivateAttr(default=frozenset())
    _user_tags: frozenset[str] = PrivateAttr(default=frozenset())
    _user_keys: frozenset[str] = PrivateAttr(default=frozenset())

    @model_validator(mode="after")
    def _fill_defaults(self) -> "DatasetSpec":
        fmt = self.formatting
        self._user_keys = frozenset(self.model_fields_set)
        self._user_columns = frozenset(self.columns.model_fields_set)
        self._user_tags = frozenset(self.tags.model_fields_set)
        if self.formatting != "alpaca":
            misplaced = sorted(self._user_columns & set(_ALPACA_ONLY))
            if misplaced:
                raise ValueError(f"columns {misplaced} are only used by formatting 'alpaca', not '{fmt}'")
        elif "messages" in self._user_columns:
            raise ValueError("column 'messages' is only used by formatting 'sharegpt'/'openai', not 'alpaca'")
        defaults = dict(_DEFAULT_COLUMNS[fmt])
        if "columns" in self.model_fields_set:  # LLaMA-Factory: unlisted columns are None ...
            primary = _PRIMARY_COLUMN[fmt]  # ... but the primary one keeps its default
            defaults = {primary: defaults[primary]}
        col_update = {k: v for k, v in defaults.items() if k not in self._user_columns}
        self.columns = self.columns.model_copy(update=col_update)
        tag_update = {k: v for k, v in _DEFAULT_TAGS[fmt].items() if k not in self.tags.model_fields_set}
        self.tags = self.tags.model_copy(update=tag_update)
        if self.num_samples is not None and self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {self.num_samples}")
        if not any((self.file_name, self.hf_hub_url, self.ms_hub_url, self.om_hub_url,
                    self.script_url, self.cloud_file_name)):
            raise ValueError("needs a source: set 'file_name' (a file or folder in dataset_dir) or 'hf_hub_url'")
        return self

    @property
    def user_columns(self) -> frozenset[str]:
        """Column keys the dataset_info.json entry set itself (not defaults)."""
        return self._user_columns

    def as_local_entry(self, file_name: str) -> dict:
        """This entry for a local copy of its data: the same formatting, ranking, columns and tags as the
        dataset_info.json entry set them, read from `file_name` instead of a hub."""
        entry: dict = {"file_name": file_name}
        for key in ("formatting", "ranking", "num_samples", "media_dir"):
            if key in self._user_keys:
                entry[key] = getattr(self, key)
        if self._user_columns:
            entry["columns"] = {k: getattr(self.columns, k) for k in Columns.model_fields if k in self._user_columns}
        if self._user_tags:
            entry["tags"] = {k: getattr(self.tags, k) for k in Tags.model_fields if k in self._user_tags}
        return entry


def _format_validation_error(name: str, err: ValidationError, allowed: dict[str, list[str]]) -> list[str]:
    """One line per problem, with a did-you-mean for misspelt keys."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            parent = str(e["loc"][0]) if len(e["loc"]) > 1 else ""
            options = allowed.get(parent, allowed[""])
            guess = difflib.get_close_matches(str(e["loc"][-1]), options, n=1)
            msg = f"unknown key; allowed: {', '.join(options)}" + (f" (did you mean '{guess[0]}'?)" if guess else "")
        lines.append(f"'{name}': {loc + ': ' if loc else ''}{msg}")
    return lines


_ALLOWED_KEYS = {
    "": [k for k in DatasetSpec.model_fields],
    "columns": list(Columns.model_fields),
    "tags": list(Tags.model_fields),
}


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise DataError(
            f"{path} not found. Create it (see data/dataset_info.json in tunesmith for examples) "
            f"or set dataset_dir to the folder that holds your dataset_info.json."
        )
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}, line {e.lineno}, column {e.colno}: invalid JSON ({e.msg}). Fix the file.") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text ({e}). Save it as UTF-8.") from None
    if not isinstance(info, dict):
        raise DataError(f"{path} must hold a JSON object {{dataset name: entry}}, not a {type(info).__name__}.")
    return info


def load_dataset_info(dataset_dir: str | Path) -> dict[str, DatasetSpec]:
    """Parse dataset_dir/dataset_info.json; every bad entry is reported at once."""
    path = Path(dataset_dir) / DATASET_INFO
    info = _read_json(path)
    specs, problems = {}, []
    for name, entry in info.items():
        if not isinstance(entry, dict):
            problems.append(f"'{name}': entry must be a JSON object, not {type(entry).__name__}")
            continue
        try:
            specs[name] = DatasetSpec.model_validate(entry)
        except ValidationError as e:
            problems.extend(_format_validation_error(name, e, _ALLOWED_KEYS))
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise DataError(f"{len(problems)} problem(s) in {path}:\n{lines}")
    return specs


REMOTE = "REMOTE:"  # LLaMA-Factory's dataset_dir prefix for a dataset repo on the Hugging Face Hub


def local_dataset_dir(dataset_dir: str | Path) -> str | Path:
    """dataset_dir as a folder: LLaMA-Factory's "REMOTE:<hub dataset repo>" is that repo, downloaded once into the
    Hugging Face cache (its dataset_info.json and the files its entries name); anything else as it is."""
    text = str(dataset_dir)
    if not text.startswith(REMOTE):
        return dataset_dir
    repo = text[len(REMOTE):]
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id=repo, repo_type="dataset")
    except Exception as err:  # network, a missing repo, offline without a cached copy: one message names them
        raise DataError(f"dataset_dir {text}: the Hugging Face dataset repo '{repo}' could not be fetched "
                        f"({type(err).__name__}: {str(err)[:200]}). Check the name and the network (with "
                        "HF_HUB_OFFLINE=1 only a cached copy is read), or download it and set dataset_dir to its "
                        "folder.") from None


def get_spec(name: str, dataset_dir: str | Path) -> DatasetSpec:
    """The spec registered as `name`; dataset_dir "ONLINE" means `name` is a hub id (as in LLaMA-Factory)."""
    if str(dataset_dir) == "ONLINE":
        return DatasetSpec(hf_hub_url=name)
    specs = load_dataset_info(dataset_dir)
    if name in specs:
        return specs[name]
    known = sorted(specs)
    guess = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean '{guess[0]}'?" if guess else ""
    raise DataError(
        f"dataset '{name}' is not registered in {Path(dataset_dir) / DATASET_INFO}.{hint} "
        f"Known datasets: {', '.join(known) or '(none)'}. Add an entry for it or fix the name."
    )
