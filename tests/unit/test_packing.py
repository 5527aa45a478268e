import random

import torch

from tunesmith.data.collate import collate_rows
from tunesmith.data.packing import fill_ratio, pack_indices
from tunesmith.data.render import IGNORE_INDEX


def test_pack_indices_respects_capacity_and_keeps_every_sample():
    rng = random.Random(0)
    lengths = [rng.randint(5, 100) for _ in range(500)]
    bins = pack_indices(lengths, 128)
    assert sorted(i for b in bins for i in b) == list(range(500))
    assert all(sum(lengths[i] for i in b) <= 128 for b in bins)
    assert fill_ratio(lengths, bins, 128) > 0.9


def test_pack_indices_is_deterministic():
    lengths = [3, 7, 1, 9, 4, 4, 8]
    assert pack_indices(lengths, 10) == pack_indices(lengths, 10)


def test_collate_resets_positions_and_shifts_targets_within_samples():
    a = {"input_ids": [1, 2, 3], "labels": [IGNORE_INDEX, 2, 3]}
    b = {"input_ids": [4, 5], "labels": [4, 5]}
    batch = collate_rows([[a, b]], pad_id=0, length=8)
    assert batch.input_ids_BT.tolist() == [[1, 2, 3, 4, 5, 0, 0, 0]]
    assert batch.position_ids_BT.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    # sample a's last token predicts nothing: never its neighbour's first token
    assert batch.targets_BT.tolist() == [[2, 3, IGNORE_INDEX, 5, IGNORE_INDEX] + [IGNORE_INDEX] * 3]
    assert batch.segment_ids_BT.tolist() == [[0, 0, 0, 1, 1, -1, -1, -1]]
    assert batch.num_label_tokens == 3 and batch.num_samples == 2 and batch.num_tokens == 5


def test_collate_fixed_length_rows():
    batch = collate_rows([[{"input_ids": [1], "labels": [1]}]], pad_id=9, length=4)
    assert batch.input_ids_BT.shape == torch.Size([1, 4])


def test_single_unpacked_row_is_not_padded_and_batches_pad_to_multiple():
    a = {"input_ids": [1, 2, 3], "labels": [1, 2, 3]}
    assert collate_rows([[a]], pad_id=0).input_ids_BT.shape == torch.Size([1, 3])
    assert collate_rows([[a], [a]], pad_id=0).input_ids_BT.shape == torch.Size([2, 8])


def test_cu_seqlens_mark_every_sample_and_padding_run():
    """Varlen attention reads the boundaries from the batch: samples of each row, then its padding run."""
    from tunesmith.data.collate import collate_rows

    rows = [[{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}, {"input_ids": [4, 5], "labels": [4, 5]}],
            [{"input_ids": [6], "labels": [6]}]]
    batch = collate_rows(rows, pad_id=0, pad_to_multiple=8)
    assert batch.cu_seqlens.tolist() == [0, 3, 5, 8, 9, 16]
    assert batch.cu_seqlens.dtype == torch.int32 and batch.max_seqlen == 7
