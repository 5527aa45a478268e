"""Shared pieces of rm / dpo / kto: sequence log-probs of a batch and the reference model.

Batches of these stages hold two halves (chosen then rejected, or examples then
their mismatched KL twins), one sequence per row, so per-row sums are per-sequence.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging

import torch

from ..data import cache
from ..errors import ConfigError
from .losses import IGNORE_INDEX, sequence_logps, token_logps
from .sft import forward_logits

log = logging.getLogger("tunesmith")


def batch_logps(model, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (sequence) summed and averaged response log-probs, and each row's label-token count."""
    logps_BT = token_logps(forward_logits(model, batch), batch.targets_BT)
    mask_BT = batch.targets_BT != IGNORE_INDEX
    total_B, mean_B = sequence_logps(logps_BT, mask_BT)
    return total_B, mean_B, mask_BT.sum(-1)


class Reference:
    """The reference policy: a frozen copy, the base with LoRA adapters off, precomputed log-probs, or none."""

    def __init__(self, cfg, model, needed: bool):
        mode = cfg.finetune.pref_reference if needed else "none"
        is_lora = hasattr(model, "disable_adapter")
        if mode == "auto":
            mode = "adapters_off" if is_lora else "copy"
        self.mode = mode
        self.model = None
        if mode == "copy":
            self.model = copy.deepcopy(model.get_base_model() if is_lora else model).eval().requires_grad_(False)

    @contextlib.contextmanager
    def _policy_as_reference(self, model):
        with model.disable_adapter():
            yield model

    @torch.no_grad()
    def logps(self, model, batch, average: bool) -> torch.Tensor | None:
        """Reference log-probs per row, or None (reference-free)."""
        if self.mode == "none":
            return None
        if self.mode == "precomputed":
            if "ref_logps_B" not in batch.extra:
                raise ConfigError(["pref_reference: precomputed, but the batch has no reference log-probs"])
            return batch.extra["ref_logps_B"].to(batch.input_ids_BT.device)
        was_training = model.training
        model.eval()
        try:
            if self.mode == "adapters_off":
                with self._policy_as_reference(model):
                    total, mean, _ = batch_logps(model, batch)
            else:
                total, mean, _ = batch_logps(self.model, batch)
        finally:
            model.train(was_training)
        return mean if average else total


def precompute_reference(runner, columns: tuple[str, str], average: bool) -> None:
    """One pass of the starting model over the train (and eval) data, before training; cached on disk.

    Adds `columns` (the first and second half of each batch's rows) to the datasets, so the batches carry
    the reference log-probs and no reference model stays in memory.
    """
    for split in ("train", "eval"):
        dataset = getattr(runner.data, split)
        if dataset is None or columns[0] in dataset.column_names:
            continue
        key = _reference_key(runner, split, average)
        path = cache.cache_root() / "reference_logps" / f"{key}.json"
        if path.exists():
            values = json.loads(path.read_text())
        else:
            values = _reference_pass(runner, dataset, average)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
            log.info("reference log-probs of %d %s records computed and cached in %s", len(dataset), split, path)
        for name, column in zip(columns, values):
            dataset = dataset.add_column(name, column)
        setattr(runner.data, split, dataset)


@torch.no_grad()
def _reference_pass(runner, dataset, average: bool) -> list[list[float]]:
    model = runner.engine.model
    model.eval()
    first, second = [], []
    batches = runner.batches(dataset)
    for i in range(len(batches)):
        batch = batches[i].to(runner.engine.device)
        with runner.engine._autocast():
            total, mean, _ = batch_logps(model, batch)
        values = (mean if average else total).float().tolist()
        half = len(values) // 2
        first += values[:half]
        second += values[half:]
    model.train()
    return [first, second]


def _reference_key(runner, split: str, average: bool) -> str:
    """Same tokenized data (its cache key), same split, same starting weights (files' size and mtime), same
    precision: the same reference log-probs."""
    cfg = runner.cfg
    data_key = str(runner.data.report.get("cache", "")).split()[-1:]
    h = hashlib.sha256()
    h.update(json.dumps([data_key, split, cfg.data.val_size, cfg.train.seed, _weights_stat(cfg.model.model_name_or_path),
                         _weights_stat(cfg.model.adapter_name_or_path), cfg.model.bf16, cfg.model.pure_bf16,
                         average]).encode())
    return h.hexdigest()[:24]


def _weights_stat(name: str | None) -> list:
    from pathlib import Path

    from ..models.tiny import resolve_model_path

    if not name:
        return []
    folder = Path(resolve_model_path(name))
    if not folder.is_dir():
        return [name]  # a hub id: its revision is part of the name
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(folder.glob("*.safetensors"))]
