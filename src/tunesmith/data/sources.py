"""Files or hub datasets -> rows (a `datasets.Dataset`, columns as in the data).

JSON and JSON Lines are parsed with Python's json module rather than by
`datasets`, because its arrow-based reader reports malformed input without the
file's line number, and builds its schema from the first records only (a key
missing there is lost); data/jsonrows.py reads them a bounded number of records
at a time into arrow files under the run's work folder. CSV, Parquet and Arrow
are typed formats and go through `datasets` directly.

Hub and Parquet/Arrow data may hold its media inside the table (datasets' Image /
Audio / Video features, as llava_1k_en or rlhf_v do); those are written once to
content-named files under $TUNESMITH_CACHE/media, so every record names its media
by path, as JSON data does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from functools import partial
from pathlib import Path

import datasets
import numpy as np

from tunesmith.data.cache import cache_root
from tunesmith.data.jsonrows import read_json_records, rows_from_json_files, rows_from_records  # noqa: F401 (re-exported)
from tunesmith.data.registry import DatasetSpec
from tunesmith.durable import replace_whole
from tunesmith.errors import DataError

# Extension -> loader name. "text" (.txt) yields one row per line in column "text".
FILE_TYPES = {".json": "json", ".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow", ".txt": "text"}

logger = logging.getLogger("tunesmith")

# Column load_rows adds when num_samples reorders rows, so errors still name the record in the file.
ROW_INDEX = "_tunesmith_row"


def load_rows(name: str, spec: DatasetSpec, dataset_dir: str | Path, *, seed: int = 42,
              work_dir: Path | None = None) -> datasets.Dataset:
    """All rows of dataset `name`, with `num_samples` applied. JSON rows are written under `work_dir` when given
    (memory bounded by a part of the file), else held in memory."""
    if spec.hf_hub_url:
        _note_unused_hub_choice(name, spec)
        rows = _load_hub(name, spec)
    elif spec.file_name:
        rows = _load_local(name, spec, Path(dataset_dir), work_dir)
    else:
        raise DataError(_unsupported_source(name, spec))
    if len(rows) == 0:
        raise DataError(f"dataset '{name}' has no records. Check {spec.file_name or spec.hf_hub_url}.")
    if spec.num_samples is not None:
        rows = _take_num_samples(rows, spec.num_samples, seed)
    return embedded_media_to_files(rows, name, spec)


_MEDIA_FEATURES = (datasets.Image, datasets.Audio, datasets.Video)


def embedded_media_to_files(rows: datasets.Dataset, name: str, spec: DatasetSpec) -> datasets.Dataset:
    """Media columns typed as datasets Image/Audio/Video (one, or a list) -> file paths (strings)."""
    for field in ("images", "videos", "audios"):
        column = getattr(spec.columns, field)
        feature = rows.features.get(column) if column else None
        listed = isinstance(feature, (datasets.List, datasets.Sequence, datasets.LargeList))
        inner = feature.feature if listed else feature
        if not isinstance(inner, _MEDIA_FEATURES):
            continue
        raw = type(inner)(decode=False)  # {"bytes", "path"} instead of decoded pixels / samples
        rows = rows.cast_column(column, datasets.List(raw) if listed else raw)
        folder = cache_root() / "media" / field
        folder.mkdir(parents=True, exist_ok=True)
        logger.info("dataset '%s': writing the %s stored in column '%s' to %s", name, field, column, folder)
        features = rows.features.copy()
        features[column] = datasets.List(datasets.Value("string")) if listed else datasets.Value("string")
        rows = rows.map(partial(_media_paths, column=column, folder=folder, where=f"dataset '{name}'"),
                        features=features, with_indices=True, desc=f"Writing {name} {field}")
    return rows


def _media_paths(row: dict, index: int, *, column: str, folder: Path, where: str) -> dict:
    value = row[column]
    if value is None:
        return {column: None}
    items = value if isinstance(value, list) else [value]
    paths = [_media_file(item, folder, f"{where}, record {row.get(ROW_INDEX, index)}") for item in items]
    return {column: paths if isinstance(value, list) else paths[0]}


def _media_file(item: dict | None, folder: Path, where: str) -> str | None:
    """The path of one stored medium: its bytes written once under a content-hash name, or the path it names."""
    if item is None:
        return None
    data, path = item.get("bytes"), item.get("path")
    if not data:
        if path:
            return path
        raise DataError(f"{where}: a stored medium has neither bytes nor a path")
    suffix = Path(path).suffix.lower() if path and len(Path(path).suffix) <= 6 else ""
    target = folder / (hashlib.sha1(data).hexdigest() + suffix)
    if not target.exists():
        replace_whole(target, data)  # concurrent ranks writing the same file is safe
    return str(target)


def _take_num_samples(rows: datasets.Dataset, num_samples: int, seed: int) -> datasets.Dataset:
    """LLaMA-Factory's rule: a random subset; when asked for more rows than exist, every
    row once plus extra rows drawn with replacement. Seeded, so runs are repeatable."""
    rng = np.random.default_rng(seed)
    indices = rng.permutation(len(rows))[:num_samples]
    if num_samples > len(rows):
        indices = np.concatenate([indices, rng.choice(len(rows), num_samples - len(rows))])
    rows = rows.add_column(ROW_INDEX, list(range(len(rows))))
    return rows.select(indices.tolist())


def _load_hub(name: str, spec: DatasetSpec) -> datasets.Dataset:
    try:
        return datasets.load_dataset(spec.hf_hub_url, spec.subset, split=spec.split, data_dir=spec.folder,
                                     revision=spec.revision)
    except Exception as e:  # noqa: BLE001 - offline, missing repo, auth: all need the same advice
        raise DataError(_hub_failure(name, spec, e)) from None


# ---- messages for hub entries that cannot be loaded here -------------------------------------------------

_TRUE = {"1", "ON", "YES", "TRUE", "Y"}
# Exceptions (anywhere in the chain) that mean "the hub was not reached", by class name: huggingface_hub,
# requests and httpx each have their own.
_UNREACHABLE = {"OfflineModeIsEnabled", "LocalEntryNotFoundError", "ConnectionError", "ConnectError",
                "ConnectTimeout", "ReadTimeout", "Timeout", "TimeoutException", "MaxRetryError", "NameResolutionError"}
_LOCAL_DIR = "my_data"  # the example folder the advice uses


def _env_true(key: str) -> bool:
    return os.environ.get(key, "").strip().upper() in _TRUE


def hub_offline() -> bool:
    """Offline mode as datasets sees it (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, read when it was imported), or as
    the environment says now."""
    return bool(datasets.config.HF_HUB_OFFLINE) or _env_true("HF_HUB_OFFLINE") or _env_true("HF_DATASETS_OFFLINE")


def _unreachable(err: BaseException) -> bool:
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, (ConnectionError, TimeoutError)) or type(err).__name__ in _UNREACHABLE:
            return True
        err = err.__cause__ or err.__context__
    return False


def _hub_where(spec: DatasetSpec) -> str:
    parts = [f"{k} '{v}'" for k, v in (("subset", spec.subset), ("folder", spec.folder), ("revision", spec.revision))
             if v]
    if spec.split != "train":
        parts.append(f"split '{spec.split}'")
    return f"'{spec.hf_hub_url}'" + (f" ({', '.join(parts)})" if parts else "")


def _local_folder(name: str) -> str:
    return f"{_LOCAL_DIR}/{name.rsplit('/', 1)[-1]}"


def _local_copy_advice(name: str, spec: DatasetSpec, download: str) -> str:
    """How to get the data onto this machine and register it as a local file, with the entry to paste.
    `download` is the command (or sentence) that puts the data under _local_folder(name)."""
    folder = name.rsplit("/", 1)[-1]
    entry = json.dumps({name: spec.as_local_entry(f"{folder}/<data file or folder>")}, ensure_ascii=False)[1:-1]
    which = [f"the split '{spec.split}'"] + [f"{k} '{v}'" for k, v in (("subset", spec.subset), ("folder", spec.folder))
                                            if v]
    return (
        f"To use it without the hub: on a machine with network, download it:\n"
        f"    {download}\n"
        f"  copy {_LOCAL_DIR}/ to this machine, add this entry to {_LOCAL_DIR}/dataset_info.json (same formatting "
        f"and columns)\n"
        f"    {entry}\n"
        f"  with file_name pointing at the data file, or at a folder holding only the data files of "
        f"{' of '.join(which)} (not the repo's README.md), and set dataset_dir: {_LOCAL_DIR}."
    )


def _hub_failure(name: str, spec: DatasetSpec, err: Exception) -> str:
    where = _hub_where(spec)
    revision = f" --revision {spec.revision}" if spec.revision else ""
    download = f"hf download {spec.hf_hub_url} --repo-type dataset{revision} --local-dir {_local_folder(name)}"
    error = f"{type(err).__name__}: {str(err)[:300]}"
    if hub_offline() and _unreachable(err):
        reason = ("offline mode is on (HF_HUB_OFFLINE=1) and it is not in the local datasets cache. Loading it once "
                  "with network (HF_HUB_OFFLINE unset) caches it for later offline runs.")
    elif _unreachable(err):
        reason = f"the hub could not be reached (no network?): {error}."
    else:
        reason = (f"{error}. Check the id; for a gated or private dataset accept its terms on huggingface.co and "
                  f"log in (hf auth login).")
    return (f"dataset '{name}': could not download {where} from the Hugging Face hub: {reason}\n"
            f"{_local_copy_advice(name, spec, download)}")


def _unsupported_source(name: str, spec: DatasetSpec) -> str:
    """Entries LLaMA-Factory loads from ModelScope, Modelers, a loading script or a cloud bucket."""
    hf_hint = ("If the dataset is also on the Hugging Face hub, add \"hf_hub_url\": \"<its id there>\" to the "
               "entry. Otherwise:\n")
    if spec.ms_hub_url:
        return (f"dataset '{name}' is only on ModelScope (\"ms_hub_url\": \"{spec.ms_hub_url}\"): tunesmith loads "
                f"datasets from the Hugging Face hub and local files, not from ModelScope. {hf_hint}"
                + _local_copy_advice(
                    name, spec, f"modelscope download --dataset {spec.ms_hub_url} --local_dir {_local_folder(name)}"))
    if spec.om_hub_url:
        return (f"dataset '{name}' is only on Modelers (openMind, \"om_hub_url\": \"{spec.om_hub_url}\"): tunesmith "
                f"loads datasets from the Hugging Face hub and local files, not from Modelers. {hf_hint}"
                + _local_copy_advice(
                    name, spec, f"the files of https://modelers.cn/datasets/{spec.om_hub_url} into {_local_folder(name)}"))
    if spec.script_url:
        return (f"dataset '{name}' is read by a dataset loading script (\"script_url\": \"{spec.script_url}\"); "
                f"tunesmith, like the datasets library since version 4, does not run loading scripts. Export the data "
                f"once (with datasets < 4: load_dataset(\"<dataset_dir>/{spec.script_url}\", split=\"train\")"
                f".to_json(\"{name}.jsonl\")) and "
                f"register that file with \"file_name\" instead of \"script_url\".")
    return (f"dataset '{name}' is read from a cloud bucket (\"cloud_file_name\": \"{spec.cloud_file_name}\"), "
            f"which tunesmith does not do. Download the file (for example with aws s3 cp or gsutil cp) into "
            f"dataset_dir and register it with \"file_name\" instead of \"cloud_file_name\".")


def _note_unused_hub_choice(name: str, spec: DatasetSpec) -> None:
    """LLaMA-Factory's USE_MODELSCOPE_HUB / USE_OPENMIND_HUB pick ms_hub_url / om_hub_url over hf_hub_url."""
    for env, other, hub in (("USE_MODELSCOPE_HUB", spec.ms_hub_url, "ModelScope"),
                            ("USE_OPENMIND_HUB", spec.om_hub_url, "Modelers")):
        if other and _env_true(env):
            logger.warning("dataset '%s': %s is set, but tunesmith does not load from %s; loading '%s' from the "
                           "Hugging Face hub instead", name, env, hub, spec.hf_hub_url)


def _list_files(name: str, spec: DatasetSpec, dataset_dir: Path) -> tuple[list[Path], str]:
    """The data files of a local entry and their one file type."""
    path = dataset_dir / spec.file_name
    if not path.exists():
        raise DataError(
            f"dataset '{name}': file_name '{spec.file_name}' not found at {path.resolve()}. "
            f"Put the data there or fix file_name / dataset_dir."
        )
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")) if path.is_dir() else [path]
    if not files:
        raise DataError(f"dataset '{name}': folder {path} has no data files.")
    types = {FILE_TYPES.get(p.suffix.lower()) for p in files}
    if None in types:
        bad = next(p for p in files if p.suffix.lower() not in FILE_TYPES)
        raise DataError(f"dataset '{name}': {bad} has an unsupported type; use one of {', '.join(FILE_TYPES)}.")
    if len(types) > 1:
        raise DataError(f"dataset '{name}': folder {path} mixes file types {sorted(types)}; keep one type per folder.")
    return files, types.pop()


def _load_local(name: str, spec: DatasetSpec, dataset_dir: Path, work_dir: Path | None = None) -> datasets.Dataset:
    if spec.split != "train":
        raise DataError(
            f"dataset '{name}': split '{spec.split}' applies to hub datasets only; a local file is one split. "
            f"Remove \"split\" from its dataset_info.json entry."
        )
    files, kind = _list_files(name, spec, dataset_dir)
    if kind in ("json", "jsonl"):
        return rows_from_json_files(files, work_dir)
    try:
        return datasets.load_dataset(kind, data_files=[str(f) for f in files], split="train")
    except Exception as e:  # noqa: BLE001 - arrow/pandas raise many types for a bad file
        raise DataError(f"dataset '{name}': could not read {', '.join(map(str, files))}: {type(e).__name__}: {e}") from None
