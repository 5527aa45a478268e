"""Files or hub datasets -> rows (a `datasets.Dataset`, columns as in the data).

JSON and JSON Lines are parsed here with Python's json module rather than by
`datasets`, because its arrow-based reader reports malformed input without the
file's line number, and builds its schema from the first records only (a key
missing there is lost). CSV, Parquet and Arrow are typed formats and go through
`datasets` directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np

from tunesmith.data.registry import DatasetSpec
from tunesmith.errors import DataError

# Extension -> loader name. "text" (.txt) yields one row per line in column "text".
FILE_TYPES = {".json": "json", ".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow", ".txt": "text"}

# Column load_rows adds when num_samples reorders rows, so errors still name the record in the file.
ROW_INDEX = "_tunesmith_row"


def load_rows(name: str, spec: DatasetSpec, dataset_dir: str | Path, *, seed: int = 42) -> datasets.Dataset:
    """All rows of dataset `name`, with `num_samples` applied."""
    if spec.hf_hub_url:
        rows = _load_hub(name, spec)
    elif spec.file_name:
        rows = _load_local(name, spec, Path(dataset_dir))
    else:
        other = spec.ms_hub_url or spec.om_hub_url or spec.script_url or spec.cloud_file_name
        raise DataError(
            f"dataset '{name}': only file_name and hf_hub_url sources are supported, not '{other}'. "
            f"Download the data and register it with file_name (relative to dataset_dir)."
        )
    if len(rows) == 0:
        raise DataError(f"dataset '{name}' has no records. Check {spec.file_name or spec.hf_hub_url}.")
    if spec.num_samples is not None:
        rows = _take_num_samples(rows, spec.num_samples, seed)
    return rows


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
        raise DataError(
            f"dataset '{name}': could not download '{spec.hf_hub_url}' (subset={spec.subset}, split={spec.split}) "
            f"from the Hugging Face hub: {type(e).__name__}: {str(e)[:300]}. If this machine is offline, put a "
            f"local copy under dataset_dir and register it with \"file_name\" instead of \"hf_hub_url\"."
        ) from None


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


def _load_local(name: str, spec: DatasetSpec, dataset_dir: Path) -> datasets.Dataset:
    if spec.split != "train":
        raise DataError(
            f"dataset '{name}': split '{spec.split}' applies to hub datasets only; a local file is one split. "
            f"Remove \"split\" from its dataset_info.json entry."
        )
    files, kind = _list_files(name, spec, dataset_dir)
    if kind in ("json", "jsonl"):
        records = []
        for f in files:
            records.extend(read_json_records(f))
        return rows_from_records(records, files)
    try:
        return datasets.load_dataset(kind, data_files=[str(f) for f in files], split="train")
    except Exception as e:  # noqa: BLE001 - arrow/pandas raise many types for a bad file
        raise DataError(f"dataset '{name}': could not read {', '.join(map(str, files))}: {type(e).__name__}: {e}") from None


def read_json_records(path: Path) -> list[dict]:
    """Records of a .json file (one array, or JSON Lines saved as .json) or a .jsonl file.

    Errors name the file and line, which is what a user needs to fix a big file.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text ({e}). Save it as UTF-8.") from None
    if path.suffix.lower() == ".jsonl" or _looks_like_json_lines(text):
        return _parse_json_lines(path, text)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}, line {e.lineno}, column {e.colno}: invalid JSON ({e.msg}). Fix the file.") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON array of records, got a {type(data).__name__}.")
    return [_check_record(path, rec, f"record {i}") for i, rec in enumerate(data)]


def _looks_like_json_lines(text: str) -> bool:
    """A .json file with one object per line (datasets' json loader accepts these too)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2 or not lines[0].lstrip().startswith("{"):
        return False
    try:
        json.loads(lines[0])
        return True
    except json.JSONDecodeError:
        return False


def _parse_json_lines(path: Path, text: str) -> list[dict]:
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}, line {lineno}, column {e.colno}: invalid JSON ({e.msg}). Fix that line.") from None
        records.append(_check_record(path, rec, f"line {lineno}"))
    return records


def _check_record(path: Path, rec: object, where: str) -> dict:
    if not isinstance(rec, dict):
        raise DataError(f"{path}, {where}: a record must be a JSON object, got {type(rec).__name__}: {str(rec)[:80]}")
    return rec


def rows_from_records(records: list[dict], files: list[Path]) -> datasets.Dataset:
    """A Dataset from dicts whose keys may differ: a key a record lacks becomes None."""
    keys = list(dict.fromkeys(k for rec in records for k in rec))
    columns = {k: [rec.get(k) for rec in records] for k in keys}
    try:
        return datasets.Dataset.from_dict(columns)
    except Exception:  # noqa: BLE001 - find the column arrow cannot type, to name it
        pass
    for key, values in columns.items():
        try:
            datasets.Dataset.from_dict({key: values})
        except Exception as e:  # noqa: BLE001
            kinds = sorted({type(v).__name__ for v in values if v is not None})
            raise DataError(
                f"{', '.join(map(str, files))}: field '{key}' has mixed types across records ({', '.join(kinds)}): {e}. "
                f"Make it the same type in every record."
            ) from None
    raise DataError(f"{', '.join(map(str, files))}: could not build a table from the records.")
