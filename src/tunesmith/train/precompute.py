"""pref_reference: precomputed — one pass of the starting model over the train (and eval) data before
training, cached on disk; the values become data columns, so no reference model stays in memory."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from ..data import cache

log = logging.getLogger("tunesmith")


def precompute_reference(source, engine) -> None:
    """Adds the method's reference_columns (each batch's first and second half of rows) to the datasets."""
    columns, average = source.method.reference_columns, source.method.average
    for split in ("train", "eval") if source.cfg.train.do_train else ("eval",):
        dataset = getattr(source.data, split)
        if dataset is None or columns[0] in dataset.column_names:
            continue
        path = cache.cache_root() / "reference_logps" / f"{_reference_key(source, split, average)}.json"
        if path.exists():
            values = json.loads(path.read_text())
        else:
            values = source.reference_values(engine, dataset, average)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
            log.info("reference log-probs of %d %s records computed and cached in %s", len(dataset), split, path)
        for name, column in zip(columns, values):
            dataset = dataset.add_column(name, column)
        setattr(source.data, split, dataset)


def _reference_key(source, split: str, average: bool) -> str:
    """Same tokenized data (its cache key), same split, same starting weights (files' size and mtime), same
    precision: the same reference log-probs."""
    cfg = source.cfg
    data_key = str(source.data.report.get("cache", "")).split()[-1:]
    h = hashlib.sha256()
    h.update(json.dumps([data_key, split, cfg.data.val_size, cfg.train.seed, _weights_stat(cfg.model.model_name_or_path),
                         _weights_stat(cfg.model.adapter_name_or_path), cfg.model.bf16, cfg.model.pure_bf16,
                         average]).encode())
    return h.hexdigest()[:24]


def _weights_stat(name: str | None) -> list:
    from ..models.tiny import resolve_model_path

    if not name:
        return []
    folder = Path(resolve_model_path(name))
    if not folder.is_dir():
        return [name]  # a hub id: its revision is part of the name
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(folder.glob("*.safetensors"))]
