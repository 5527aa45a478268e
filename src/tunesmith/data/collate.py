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

from dataclasses import dataclass, fields

import torch

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

    def to(self, device) -> "SFTBatch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device, non_blocking=True)
        return SFTBatch(**moved)


def shifted_targets(labels: list[int]) -> list[int]:
    return list(labels[1:]) + [IGNORE_INDEX]


def collate_rows(rows: list[list[dict]], pad_id: int, pad_to_multiple: int = 8, length: int | None = None) -> SFTBatch:
    """rows: each a list of samples ({input_ids, labels}). Pads to `length` or the longest row."""
    widths = [sum(len(s["input_ids"]) for s in row) for row in rows]
    width = length or _round_up(max(widths), pad_to_multiple)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    targets = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
    positions = torch.zeros(shape, dtype=torch.long)
    segments = torch.full(shape, -1, dtype=torch.long)
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
        positions[r, at:] = torch.arange(width - at)  # padding: its own segment
    return SFTBatch(
        input_ids_BT=input_ids,
        targets_BT=targets,
        position_ids_BT=positions,
        segment_ids_BT=segments,
        num_label_tokens=int((targets != IGNORE_INDEX).sum()),
        num_samples=sample_no,
        num_tokens=sum(widths),
    )


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
