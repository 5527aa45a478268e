"""context_parallel.py's pieces in one process: which tokens each context-parallel rank holds, and that its queries
against every rank's keys (in the gathered order, under context_mask) give the whole row's attention at its
positions, packed samples and padding kept apart, and that the FlashAttention segments (varlen_plan) allow what the
mask allows. tests/gpu/test_megatron_varlen.py runs the kernel on them. Multi-process runs: tests/e2e/test_megatron_cli.py. Skipped without
megatron-core."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("megatron.core")

from tunesmith.engines.megatron import context_parallel  # noqa: E402
from tunesmith.engines.megatron.forward import packed_causal_mask  # noqa: E402


def test_each_rank_holds_an_early_and_a_late_block():
    assert context_parallel.block_positions(8, 2).tolist() == [[0, 1, 6, 7], [2, 3, 4, 5]]
    positions = context_parallel.block_positions(24, 3)
    assert positions.tolist()[0] == [0, 1, 2, 3, 20, 21, 22, 23]
    assert sorted(positions.flatten().tolist()) == list(range(24))  # every token once


def _as_rank(monkeypatch, rank: int, size: int):
    monkeypatch.setattr(context_parallel, "cp_rank", lambda: rank)
    monkeypatch.setattr(context_parallel, "cp_size", lambda: size)


@pytest.mark.parametrize("size", [2, 3])
def test_local_queries_against_the_gathered_keys_give_the_whole_rows_attention(monkeypatch, size):
    # row 0: samples of 5 and 4 tokens, then padding; row 1: one sample, then padding (segment -1)
    length = 12
    segments = torch.tensor([[0] * 5 + [1] * 4 + [-1] * 3, [0] * 10 + [-1] * 2])
    q, k, v = (torch.randn(2, 3, length, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    whole = F.scaled_dot_product_attention(q, k, v, attn_mask=~packed_causal_mask(segments))
    positions = context_parallel.block_positions(length, size)
    keys, values = k[:, :, positions.flatten()], v[:, :, positions.flatten()]  # what gathered_sequence gives
    for rank in range(size):
        _as_rank(monkeypatch, rank, size)
        mask = context_parallel.context_mask(segments)
        assert mask.shape == (2, 1, length // size, length)
        mine = F.scaled_dot_product_attention(context_parallel.local_part(q, 2), keys, values, attn_mask=~mask)
        torch.testing.assert_close(mine, whole[:, :, positions[rank]])


def _plan_allowed(plan, rows: int, local: int, length: int) -> torch.Tensor:
    """[B, T / CP, T] bool: which gathered keys each local query sees under `plan`, FlashAttention's reading of it
    (queries flattened row after row, keys picked from [T x B], the causal mask aligned to each segment's end)."""
    allowed = torch.zeros(rows * local, length * rows, dtype=torch.bool)
    cu_q, cu_k = plan.cu_seqlens_q.tolist(), plan.cu_seqlens_k.tolist()
    for i in range(len(cu_q) - 1):
        queries, keys = range(cu_q[i], cu_q[i + 1]), plan.key_index[cu_k[i]:cu_k[i + 1]]
        offset = len(keys) - len(queries)
        for j, query in enumerate(queries):
            allowed[query, keys[:offset + j + 1]] = True
    by_row = allowed.view(rows, local, length, rows)  # key index g x B + b
    return torch.stack([by_row[b, :, :, b] for b in range(rows)])


@pytest.mark.parametrize("size", [2, 3])
def test_the_varlen_plan_lets_each_query_see_what_the_mask_allows(monkeypatch, size):
    """varlen_plan (FlashAttention's segments under context parallelism) allows exactly what context_mask does,
    with a sample crossing blocks and ranks, one inside a block, and padding; no query segment is empty."""
    length = 24
    segments = torch.tensor([[0] * 5 + [1] * 4 + [2] * 11 + [-1] * 4, [0] * 3 + [1] * 19 + [-1] * 2,
                             [0] * 24])
    for rank in range(size):
        _as_rank(monkeypatch, rank, size)
        plan = context_parallel.varlen_plan(segments, torch.device("cpu"))
        lengths_q = plan.cu_seqlens_q.diff()
        assert int(lengths_q.min()) > 0 and plan.max_seqlen_q == int(lengths_q.max())
        assert plan.max_seqlen_k == int(plan.cu_seqlens_k.diff().max())
        allowed = _plan_allowed(plan, 3, length // size, length)
        assert torch.equal(allowed, ~context_parallel.context_mask(segments)[:, 0])


def test_a_loss_reads_this_ranks_tokens_and_the_whole_rows_counts(monkeypatch):
    from tunesmith.data.collate import collate_rows

    sample = {"input_ids": list(range(1, 8)), "labels": list(range(1, 8))}
    batch = collate_rows([[sample]], pad_id=0, length=8)
    _as_rank(monkeypatch, 1, 2)
    mine = context_parallel.local_batch(batch)
    assert mine.targets_BT.tolist() == batch.targets_BT[:, 2:6].tolist()
    assert mine.segment_ids_BT.shape == (1, 4) and mine.input_ids_BT.shape == (1, 8)
    assert mine.num_label_tokens == batch.num_label_tokens
