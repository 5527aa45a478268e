"""The data plan: which samples form each row, micro-batch and optimiser step.

Rows (packed bins or single samples) are fixed once; each epoch shuffles them
with a generator seeded by (seed, epoch), so the order is a pure function of the
position — resume needs only (epoch, micro-batch index).

The samples of one optimiser step may run as fewer forward passes
(`merge_tokens`): the same samples, in the same order, each attending only to
itself, and the same loss, since the loss is normalised by the step's label
tokens, not per micro-batch. Unpacked samples are laid end to end in rows of up
to merge_tokens tokens; packed rows stay rows, several micro-batches' worth a
pass.

With `unpadded` (train/setup.unpadded_rows: attention that takes the samples'
boundaries) a pass's packed rows then run as one row without their padding, its
width rounded up to UNPADDED_MULTIPLE tokens: the same samples and loss, and no
matmul over the padding of cutoff_len rows. A first try (2026-12-04, exact widths,
PyTorch's fixed-size segments) reserved 11 GiB more and ran 4% slower; with the
rounding and expandable segments (cuda_memory.py) it ran 2.4% faster on issue
15's workload, in 10.6 GiB less (benchmarks/results/2026-12-06-unpadded-rows-h100.md).
"""

from __future__ import annotations

import atexit
import functools
import math
import signal
import weakref
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset

from .. import dist
from ..data.collate import collate_rows, round_up
from ..data.packing import pack_indices


# An unpadded pass's width is rounded up to this: few distinct shapes for the CUDA allocator and cuBLAS, and a row
# count Triton specialises as a multiple of 16, as it does cutoff_len's
UNPADDED_MULTIPLE = 64


def shuffled(count: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """0..count-1 in the epoch's order: a permutation seeded by (seed, epoch), or as they are without shuffle."""
    if not shuffle:
        return list(range(count))
    return torch.randperm(count, generator=torch.Generator().manual_seed(seed * 1000003 + epoch)).tolist()


@dataclass
class Position:
    epoch: int = 0
    micro_batch: int = 0  # micro-batches of this epoch already consumed


class EpochPlan:
    def __init__(self, lengths: list[int], *, packing: bool, cutoff_len: int, batch_size: int, grad_accum: int,
                 num_epochs: float, max_steps: int, seed: int, world: int = 1, merge_tokens: int = 0,
                 unpadded: bool = False, shuffle: bool = True):
        self.rows = pack_indices(lengths, cutoff_len) if packing else [[i] for i in range(len(lengths))]
        self.lengths = lengths
        self.merge_tokens = merge_tokens  # 0: every micro-batch is one forward pass
        self.unpadded = unpadded and packing  # a pass's packed rows run end to end, without their padding
        self.packing = packing
        self.cutoff_len = cutoff_len
        self.batch_size = batch_size
        self.grad_accum = grad_accum
        self.seed = seed
        self.shuffle = shuffle  # False: every epoch in the rows' own order (disable_shuffling)
        self.micro_batches_per_epoch = math.ceil(math.ceil(len(self.rows) / batch_size) / world)
        self.steps_per_epoch = math.ceil(self.micro_batches_per_epoch / grad_accum)
        self.total_steps = max_steps if max_steps > 0 else max(1, math.ceil(num_epochs * self.steps_per_epoch))

    @classmethod
    def from_config(cls, cfg, lengths: list[int], **overrides) -> "EpochPlan":
        options = dict(packing=cfg.packing, cutoff_len=cfg.data.cutoff_len,
                       batch_size=cfg.train.per_device_train_batch_size,
                       grad_accum=cfg.train.gradient_accumulation_steps, num_epochs=cfg.train.num_train_epochs,
                       max_steps=cfg.train.max_steps, seed=cfg.train.seed, world=dist.data_world(),
                       shuffle=not cfg.train.disable_shuffling)
        return cls(lengths, **{**options, **overrides})

    def epoch_order(self, epoch: int) -> list[list[list[int]]]:
        """Micro-batches of this epoch: each a list of rows, each row a list of sample indices."""
        rows = [self.rows[i] for i in shuffled(len(self.rows), self.seed, epoch, self.shuffle)]
        return [rows[i : i + self.batch_size] for i in range(0, len(rows), self.batch_size)]

    def step_slice(self, position: Position) -> tuple[int, int]:
        """[start, end) micro-batches of the step that starts at `position`."""
        end = min(position.micro_batch + self.grad_accum, self.micro_batches_per_epoch)
        return position.micro_batch, end

    def step_batches(self, micro_batches: list) -> list[list]:
        """The forward passes of each optimiser step, from a step boundary on: the step's micro-batches, or (with
        merge_tokens) its samples in order laid end to end in single rows of at most merge_tokens tokens, or with
        packing its micro-batches' rows together, merge_tokens worth of rows a pass."""
        steps = [micro_batches[i : i + self.grad_accum] for i in range(0, len(micro_batches), self.grad_accum)]
        return [self._merged(step) for step in steps] if self.merge_tokens else steps

    def _merged(self, step: list) -> list:
        if self.packing:  # whole micro-batches: every pass keeps rows of cutoff_len (the allocator reuses its blocks)
            per_pass = max(1, self.merge_tokens // (self.batch_size * self.cutoff_len))
            return [[row for micro_batch in step[i : i + per_pass] for row in micro_batch]
                    for i in range(0, len(step), per_pass)]
        batches, row, used = [], [], 0
        for sample in (i for micro_batch in step for r in micro_batch for i in r):
            if row and used + self.lengths[sample] > self.merge_tokens:
                batches.append([row])
                row, used = [], 0
            row.append(sample)
            used += self.lengths[sample]
        return batches + [[row]]

    def advance(self, position: Position) -> Position:
        _, end = self.step_slice(position)
        if end >= self.micro_batches_per_epoch:
            return Position(position.epoch + 1, 0)
        return Position(position.epoch, end)


class _MicroBatches(Dataset):
    """Item i = the collated micro-batch i of one epoch (collation runs in DataLoader workers)."""

    def __init__(self, dataset, micro_batches, pad_id: int, row_length: int | None, media=None, collate=collate_rows,
                 unpadded: bool = False):
        self.dataset = dataset
        self.micro_batches = micro_batches
        self.pad_id = pad_id
        self.row_length = row_length
        self.unpadded = unpadded
        self.media = media
        self.collate = collate
        self.columns = [c for c in dataset.column_names if c not in ("length", "source")]

    def __len__(self):
        return len(self.micro_batches)

    def __getitem__(self, i):
        rows = self.micro_batches[i]
        flat = [idx for row in rows for idx in row]
        fetched = self.dataset.select_columns(self.columns)[flat]
        samples = [dict(zip(self.columns, values)) for values in zip(*(fetched[c] for c in self.columns))]
        if self.unpadded:  # one row of the pass's samples, padded only up to a multiple of UNPADDED_MULTIPLE
            width = round_up(sum(len(s["input_ids"]) for s in samples), UNPADDED_MULTIPLE)
            return self.collate([samples], self.pad_id, length=width, media=self.media)
        samples = iter(samples)
        return self.collate([[next(samples) for _ in row] for row in rows], self.pad_id, length=self.row_length,
                            media=self.media)


def rank_share(micro_batches: list, rank: int, world: int) -> list:
    """This rank's micro-batches: every world-th one. Padded by wrapping around so every rank runs the same
    number of steps (an uneven count would leave ranks waiting in a collective)."""
    if world == 1:
        return micro_batches
    per_rank = -(-len(micro_batches) // world)
    padded = (micro_batches * (1 + per_rank * world // max(len(micro_batches), 1)))[: per_rank * world]
    return padded[rank::world]


def micro_batch_loader(dataset, plan: EpochPlan, micro_batches: list, pad_id: int, num_workers: int, epoch: int,
                       media=None, collate=collate_rows):
    """Iterator over the collated `micro_batches` (each a list of rows) of `epoch`."""
    row_length = plan.cutoff_len if plan.packing else None
    loader = DataLoader(
        _MicroBatches(dataset, micro_batches, pad_id, row_length, media, collate, unpadded=plan.unpadded),
        batch_size=None,
        shuffle=False,
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available(),
        # Its own generator: creating a loader must not consume the global RNG (dropout), or resume drifts.
        generator=torch.Generator().manual_seed(plan.seed + epoch),
        worker_init_fn=ignore_stop_signals if num_workers > 0 else None,
    )
    if num_workers == 0:
        return iter(loader)
    _stop_workers_at_exit()
    if not hasattr(signal, "pthread_sigmask"):
        iterator = iter(loader)
    else:
        # The workers start (in iter) with the stop signals blocked, a mask they inherit: one that arrives before
        # ignore_stop_signals runs is held, then discarded there. This process gets its copy when it unblocks.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            iterator = iter(loader)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    _OPEN_ITERATORS.add(iterator)
    return iterator


_OPEN_ITERATORS: "weakref.WeakSet" = weakref.WeakSet()  # loaders with workers, until they are collected


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@functools.cache
def _stop_workers_at_exit() -> None:
    """Registered once, after multiprocessing's own exit hook, so it runs before it (atexit runs last-in first).
    That hook stops daemonic children with SIGTERM and then waits for them; DataLoader workers ignore SIGTERM
    (ignore_stop_signals), so a loader still open at exit (a run that stopped mid-epoch at max_steps) kept the
    process waiting forever after its final save. Here each open loader shuts its workers down as it does when
    collected (torch's own shutdown: each worker is told to stop, then joined)."""
    def stop_open_loaders():
        for iterator in list(_OPEN_ITERATORS):
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()

    atexit.register(stop_open_loaders)


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader workers leave SIGINT/SIGTERM to the main process. A signal sent to the whole process group
    (Ctrl-C, `timeout`, a scheduler's preemption) would otherwise kill them while the main process finishes its
    step and saves ("DataLoader worker ... is killed by signal: Terminated")."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def eval_batches(dataset, batch_size: int, pad_id: int, media=None, collate=collate_rows):
    order = [[i] for i in range(len(dataset))]
    micro = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return _MicroBatches(dataset, micro, pad_id, None, media, collate)
