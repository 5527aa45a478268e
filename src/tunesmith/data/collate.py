"""Batch dataclasses: the only thing a method sees.

Every row of a batch is one or more samples laid end to end, then padding.
Each sample's position ids restart at 0 and padding forms its own segment, so
with `attention_mask=None` the model's mask builder (transformers' packed-
sequence detection for SDPA/eager/flex, varlen for flash-attention) lets a
token attend only within its own sample. Unpacked batches are the special case
of one sample per row.

Targets are shifted per sample (`targets[i] = labels[i+1]`, the last token of a
sample predicts nothing), so packing never makes a sample predict its neighbour.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from .mm import media_plans, media_token_types
from .render import IGNORE_INDEX


@dataclass
class SFTBatch:
    input_ids_BT: torch.Tensor
    targets_BT: torch.Tensor  # next-token targets, IGNORE_INDEX where not supervised
    position_ids_BT: torch.Tensor
    segment_ids_BT: torch.Tensor  # sample number within the batch, -1 for padding
    num_label_tokens: int
    num_samples: int
    num_tokens: int  # real (non-padding) tokens
    # Vision/audio-language batches: the processor's tensors for all media of the batch (in order),
    # each sample's own grids (for mRoPE), and token types (1 image, 2 video, 0 otherwise).
    media: dict = field(default_factory=dict)
    media_per_sample: list = field(default_factory=list)
    token_types_BT: torch.Tensor | None = None
    # Method-specific per-sequence tensors, e.g. num_pairs, margin_B, desirable_B, ref_logps_B.
    extra: dict = field(default_factory=dict)
    # Segment boundaries over the flattened batch (samples and padding runs), int32, for varlen attention.
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0
    # Indices of the supervised targets in targets_BT.reshape(-1), found on the CPU (the fused output layer takes
    # only those rows, and finding them on the GPU would make the host wait for it). Code that changes targets_BT
    # sets it to None (then they are found on the device).
    counted_rows: torch.Tensor | None = None

    def to(self, device) -> "SFTBatch":
        return self._mapped(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> "SFTBatch":
        """The DataLoader's pin-memory thread calls this: page-locked tensors, so `to(device)` copies them while the
        GPU computes (a pageable copy makes the host wait for it)."""
        return self._mapped(torch.Tensor.pin_memory)

    def _mapped(self, fn) -> "SFTBatch":
        """fn on every tensor of the batch but each sample's media grids, which stay on the CPU (they only feed the
        mRoPE positions, computed there: models/inputs.mrope_position_ids)."""
        return SFTBatch(**{f.name: getattr(self, f.name) if f.name == "media_per_sample"
                           else _apply(getattr(self, f.name), fn) for f in fields(self)})


def _apply(value, fn):
    """fn on every tensor in value (a tensor, or dicts and lists of them)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: _apply(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_apply(v, fn) for v in value]
    return value


def shifted_targets(labels: list[int]) -> list[int]:
    return list(labels[1:]) + [IGNORE_INDEX]


def collate_rows(rows: list[list[dict]], pad_id: int, pad_to_multiple: int = 8, length: int | None = None,
                 media=None) -> SFTBatch:
    """rows: each a list of samples ({input_ids, labels[, mm_plan]}). Pads to `length` or the longest row.

    With `media` (a models.media_processor.MediaProcessor) the samples' media are decoded and processed
    here, once, in the DataLoader worker that calls this.
    """
    widths = [sum(len(s["input_ids"]) for s in row) for row in rows]
    # A single unpacked row needs no padding: without a padding segment the model keeps the plain
    # causal mask (flash kernels) instead of a per-sample block mask.
    width = length or (widths[0] if len(rows) == 1 else round_up(max(widths), pad_to_multiple))
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    targets = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
    positions = torch.zeros(shape, dtype=torch.long)
    segments = torch.full(shape, -1, dtype=torch.long)
    segment_lengths = []
    sample_no = 0
    for r, row in enumerate(rows):
        at = 0
        for sample in row:
            n = len(sample["input_ids"])
            input_ids[r, at : at + n] = torch.tensor(sample["input_ids"])
            targets[r, at : at + n] = torch.tensor(shifted_targets(sample["labels"]))
            positions[r, at : at + n] = torch.arange(n)
            segments[r, at : at + n] = sample_no
            at, sample_no = at + n, sample_no + 1
            segment_lengths.append(n)
        positions[r, at:] = torch.arange(width - at)  # padding: its own segment
        if width > at:
            segment_lengths.append(width - at)
    batch = SFTBatch(
        input_ids_BT=input_ids,
        targets_BT=targets,
        position_ids_BT=positions,
        segment_ids_BT=segments,
        num_label_tokens=int((targets != IGNORE_INDEX).sum()),
        num_samples=sample_no,
        num_tokens=sum(widths),
        cu_seqlens=torch.tensor([0] + segment_lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32),
        max_seqlen=max(segment_lengths),
        counted_rows=(targets.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1),
    )
    if media is not None:
        _add_media(batch, [s for row in rows for s in row], media)
    return batch


def _add_media(batch: SFTBatch, samples: list[dict], media) -> None:
    batch.media, batch.media_per_sample = media.process(media_plans(samples))
    batch.token_types_BT = media_token_types(batch.input_ids_BT, media.token_ids)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _sequences(records: list[dict], ids_key: str, labels_key: str) -> list[list[dict]]:
    return [[{"input_ids": r[ids_key], "labels": r[labels_key]}] for r in records]


def _doubled_media(batch: SFTBatch, records: list[dict], media) -> None:
    """Both halves of a pair/KTO batch show the same media: process each record's media once, use it twice."""
    inputs, per_sample = media.process(media_plans(records))
    batch.media = {k: torch.cat([v, v]) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    batch.media_per_sample = per_sample + per_sample
    batch.token_types_BT = media_token_types(batch.input_ids_BT, media.token_ids)


def collate_pairs(rows: list[list[dict]], pad_id: int, length: int | None = None, media=None) -> SFTBatch:
    """rm / dpo: chosen sequences first, then the rejected ones, in one batch (one forward for both)."""
    records = [r for row in rows for r in row]
    seqs = _sequences(records, "input_ids", "labels") + _sequences(records, "rejected_input_ids", "rejected_labels")
    batch = collate_rows(seqs, pad_id)
    batch.extra = {"num_pairs": len(records),
                   "margin_B": torch.tensor([float(r.get("margin") or 0.0) for r in records])}
    if "ref_chosen_logps" in records[0]:
        batch.extra["ref_logps_B"] = torch.tensor([r["ref_chosen_logps"] for r in records] +
                                                  [r["ref_rejected_logps"] for r in records])
    if media is not None:
        _doubled_media(batch, records, media)
    return batch


def collate_kto(rows: list[list[dict]], pad_id: int, length: int | None = None, media=None) -> SFTBatch:
    """kto: the examples first, then the same prompts with mismatched completions (for the KL estimate)."""
    records = [r for row in rows for r in row]
    seqs = _sequences(records, "input_ids", "labels") + _sequences(records, "kl_input_ids", "kl_labels")
    batch = collate_rows(seqs, pad_id)
    batch.extra = {"num_examples": len(records), "desirable_B": torch.tensor([bool(r["kto_tag"]) for r in records])}
    if "ref_logps" in records[0]:
        batch.extra["ref_logps_B"] = torch.tensor([r["ref_logps"] for r in records] + [r["ref_kl_logps"] for r in records])
    if media is not None:
        _doubled_media(batch, records, media)
    return batch
