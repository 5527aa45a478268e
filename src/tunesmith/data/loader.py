"""Named datasets -> one mixed dataset of Samples, and the train/eval split.

Order of operations follows LLaMA-Factory so the same YAML gives the same data:
per dataset, `num_samples` (in sources), then `max_samples` (the first N rows,
taken before conversion so a huge dataset is not converted to be thrown away),
then conversion; then the datasets are mixed.
"""

from __future__ import annotations

import math
from pathlib import Path

import datasets

from tunesmith.data.formats import convert_rows
from tunesmith.data.registry import get_spec, local_dataset_dir
from tunesmith.data.sources import load_rows
from tunesmith.errors import DataError

MIX_STRATEGIES = {"concat": None, "interleave_under": "first_exhausted", "interleave_over": "all_exhausted"}
# The one dataset whose {{name}} and {{author}} are filled (identity_name, identity_author): LLaMA-Factory's
# identity demo. Any other dataset keeps its text as written (code and templates use {{...}} of their own).
IDENTITY = "identity"


def load_samples(
    names: list[str],
    *,
    dataset_dir: str | Path,
    stage: str,
    mix_strategy: str = "concat",
    interleave_probs: list[float] | str | None = None,
    max_samples: int | None = None,
    seed: int = 42,
    skip_bad_samples: bool = False,
    num_proc: int | None = None,
    placeholders: dict[str, str] | None = None,
    work_dir: Path | None = None,
) -> tuple[datasets.Dataset, dict]:
    """Load, convert and mix the named datasets (JSON rows and map outputs under `work_dir` when given).

    Returns (samples, report) where report is {name: {"rows": n, "skipped": k}}; with skip_bad_samples an entry
    that skipped records also lists them under "skipped_records" ({"dataset", "index", "file", "reason"}: the file
    is the dataset's data file or folder, or its hub id).
    """
    if not names:
        raise DataError("no dataset given. Set dataset: <name>[,<name>...] (names from dataset_info.json).")
    probs = _check_mix(mix_strategy, interleave_probs, len(names))
    dataset_dir = local_dataset_dir(dataset_dir)  # (prepare_data has done it; direct callers too)
    if max_samples is not None and max_samples < 1:
        raise DataError(f"max_samples must be >= 1, got {max_samples}. Remove it to use every record.")
    parts, report = [], {}
    for name in names:
        spec = get_spec(name, dataset_dir)
        rows = load_rows(name, spec, dataset_dir, seed=seed, work_dir=work_dir)
        if max_samples is not None and len(rows) > max_samples:
            rows = rows.select(range(max_samples))
        listed: list[dict] = []
        samples, skipped = convert_rows(
            rows, name, spec, dataset_dir, stage=stage, placeholders=placeholders if name == IDENTITY else None,
            skip_bad_samples=skip_bad_samples, num_proc=num_proc, skipped_records=listed,
        )
        if len(samples) == 0:
            raise DataError(f"dataset '{name}': all {skipped} records were bad and skipped; nothing to train on.")
        entry = report.setdefault(name, {"rows": 0, "skipped": 0})  # a name may be listed twice
        entry["rows"] += len(samples)
        entry["skipped"] += skipped
        if listed:  # the file (or hub dataset) the record is in, as the media stage names a bad medium's file
            source = spec.hf_hub_url or str(Path(dataset_dir) / spec.file_name)
            entry.setdefault("skipped_records", []).extend({**record, "file": source} for record in listed)
        parts.append(samples)
    return _mix(parts, mix_strategy, probs, seed), report


def _check_mix(mix_strategy: str, interleave_probs, num_datasets: int) -> list[float] | None:
    if mix_strategy not in MIX_STRATEGIES:
        raise DataError(f"mix_strategy '{mix_strategy}' is unknown; use one of {', '.join(MIX_STRATEGIES)}.")
    if interleave_probs is None:
        return None
    if mix_strategy == "concat":
        raise DataError("interleave_probs only applies to mix_strategy interleave_under/interleave_over; "
                        "set one of those or remove interleave_probs.")
    if isinstance(interleave_probs, str):  # LLaMA-Factory YAML writes "0.7,0.3"
        interleave_probs = [p for p in interleave_probs.split(",") if p.strip()]
    try:
        probs = [float(p) for p in interleave_probs]
    except (TypeError, ValueError):
        raise DataError(f"interleave_probs must be numbers, got {interleave_probs!r}.") from None
    if len(probs) != num_datasets:
        raise DataError(f"interleave_probs has {len(probs)} value(s) but {num_datasets} dataset(s) are listed; "
                        f"give one probability per dataset.")
    if any(p < 0 for p in probs) or not math.isclose(sum(probs), 1.0, abs_tol=1e-6):
        raise DataError(f"interleave_probs {probs} must be >= 0 and sum to 1 (they sum to {sum(probs):g}).")
    return probs


def _mix(parts: list[datasets.Dataset], mix_strategy: str, probs: list[float] | None, seed: int) -> datasets.Dataset:
    if len(parts) == 1 and probs is None:
        return parts[0]
    if mix_strategy == "concat":
        return datasets.concatenate_datasets(parts)
    return datasets.interleave_datasets(
        parts, probabilities=probs, seed=seed, stopping_strategy=MIX_STRATEGIES[mix_strategy]
    )


def split_eval(ds: datasets.Dataset, val_size: float | int, seed: int) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(train, eval): a float in (0, 1) is a fraction of the records, an integer >= 1 a count."""
    num_eval = _num_eval(val_size, len(ds))
    if num_eval >= len(ds):
        raise DataError(f"val_size {val_size} takes {num_eval} of the {len(ds)} records for evaluation, leaving "
                        f"no training data. Use a smaller val_size or more data.")
    parts = ds.train_test_split(test_size=num_eval, seed=seed, shuffle=True)
    return parts["train"], parts["test"]


def _num_eval(val_size, num_rows: int) -> int:
    if isinstance(val_size, bool) or not isinstance(val_size, (int, float)):
        raise DataError(f"val_size must be a fraction in (0, 1) or a count >= 1, got {val_size!r}.")
    if 0 < val_size < 1:
        return max(1, math.ceil(val_size * num_rows))
    if val_size >= 1 and float(val_size).is_integer():
        return int(val_size)
    raise DataError(f"val_size must be a fraction in (0, 1) or a whole count >= 1, got {val_size!r}.")
