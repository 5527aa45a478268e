"""merge_micro_batches: the samples of an optimiser step run as fewer packed forward passes, with the same
samples per step and the same loss as one forward pass per micro-batch (issue 15, item 4)."""

import pytest
import torch
from safetensors.torch import load_file

from conftest import run_config
from tunesmith.train.plan import EpochPlan, micro_batch_loader
from tunesmith.train.setup import train


def _plan(lengths, merge_tokens, batch_size=1, grad_accum=4):
    return EpochPlan(lengths, packing=False, cutoff_len=100, batch_size=batch_size, grad_accum=grad_accum,
                     num_epochs=1, max_steps=-1, seed=0, merge_tokens=merge_tokens)


def test_each_steps_samples_in_order_in_rows_within_the_budget():
    lengths = [60, 30, 50, 20, 90, 10, 40, 70, 5]
    plan = _plan(lengths, merge_tokens=100)
    order = plan.epoch_order(0)
    steps = plan.step_batches(order)
    assert len(steps) == plan.steps_per_epoch == 3
    for step, micro_batches in zip(steps, [order[i:i + 4] for i in range(0, len(order), 4)]):
        samples = [i for mb in micro_batches for row in mb for i in row]
        assert [i for batch in step for row in batch for i in row] == samples  # same samples, same order
        assert all(len(batch) == 1 for batch in step)  # one packed row per forward pass
        assert all(sum(lengths[i] for i in batch[0]) <= 100 or len(batch[0]) == 1 for batch in step)
    unmerged = _plan(lengths, merge_tokens=0)
    assert unmerged.step_batches(order) == [order[i:i + 4] for i in range(0, len(order), 4)]


def test_a_resumed_epoch_regroups_from_the_same_step_boundary():
    plan = _plan([30] * 12, merge_tokens=100, grad_accum=4)
    order = plan.epoch_order(0)
    assert plan.step_batches(order[4:]) == plan.step_batches(order)[1:]


def test_packed_rows_of_a_step_run_together_and_keep_their_width():
    lengths = [60, 30, 50, 20, 90, 10, 40, 70, 5, 45, 80, 25]
    plan = EpochPlan(lengths, packing=True, cutoff_len=100, batch_size=2, grad_accum=3, num_epochs=1, max_steps=-1,
                     seed=0, merge_tokens=400)  # two micro-batches of 2 x 100 tokens a pass
    order = plan.epoch_order(0)
    steps = plan.step_batches(order)
    assert len(steps) == plan.steps_per_epoch
    for step, micro_batches in zip(steps, [order[i:i + 3] for i in range(0, len(order), 3)]):
        assert step == [micro_batches[0] + micro_batches[1], *micro_batches[2:]]
    batch = next(micro_batch_loader(_Rows(lengths), plan, steps[0], pad_id=0, num_workers=0, epoch=0))
    assert batch.input_ids_BT.shape == (len(steps[0][0]), 100)  # rows of cutoff_len: the same shape every step


class _Rows:
    """A dataset of samples of the given lengths, as micro_batch_loader reads them."""

    column_names = ["input_ids", "labels", "length"]

    def __init__(self, lengths):
        self.rows = [{"input_ids": [1] * n, "labels": [1] * n} for n in lengths]

    def select_columns(self, columns):
        return self

    def __getitem__(self, indices):
        return {c: [self.rows[i][c] for i in indices] for c in ("input_ids", "labels")}


def _weights(path):
    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("overrides", [
    {},
    {"packing": True, "cutoff_len": 256},
    {"model_name_or_path": "tiny:qwen3_vl", "dataset": "mllm_demo,identity", "template": "auto",
     "image_max_pixels": 16384, "cutoff_len": 1024, "max_samples": 16, "freeze_vision_tower": False},
], ids=["text", "text_packed", "qwen3_vl"])
def test_merged_steps_give_the_losses_and_weights_of_one_pass_per_micro_batch(tmp_path, overrides):
    common = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "max_steps": 3, **overrides}
    merged = train(run_config(tmp_path / "merged", **common))
    alone = train(run_config(tmp_path / "alone", merge_micro_batches=False, **common))
    assert len(merged.step_losses) == 3
    assert merged.step_losses == pytest.approx(alone.step_losses, rel=1e-5)
    wa, wb = _weights(tmp_path / "merged"), _weights(tmp_path / "alone")
    for key in wa:
        # other matmul shapes sum in another order; AdamW's update of a near-zero gradient magnifies that (one
        # element in 128k moved 1.9e-5 after three steps, packed)
        torch.testing.assert_close(wa[key], wb[key], rtol=1e-4, atol=5e-5)


def test_deepspeed_in_one_process_gives_the_same_losses_merged(tmp_path):
    """DeepSpeed's accumulation boundary is tunesmith's step() (unmanaged mode), so fewer, packed forward passes
    in a step change nothing."""
    pytest.importorskip("deepspeed")
    from conftest import REPO
    from tunesmith import dist

    common = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "max_steps": 3,
              "deepspeed": str(REPO / "examples" / "deepspeed" / "ds_z2_offload.json")}
    try:
        merged = train(run_config(tmp_path / "merged", **common))
        alone = train(run_config(tmp_path / "alone", merge_micro_batches=False, **common))
    finally:
        dist.shutdown()  # the one-process group DeepSpeed needs, as the CLI ends it (later modules make their own)
    assert merged.step_losses == pytest.approx(alone.step_losses, rel=1e-5)


def _merge_budget(monkeypatch, attention, estimate=None, **overrides):
    from types import SimpleNamespace

    from conftest import run_config
    from tunesmith.data.collate import collate_rows
    from tunesmith.models.load import load_config
    from tunesmith.train import setup

    cfg = run_config("/tmp/unused", per_device_train_batch_size=2, gradient_accumulation_steps=4, cutoff_len=256,
                     **overrides)
    monkeypatch.setattr(setup, "attn_implementation", lambda *a: attention)
    if estimate is not None:
        monkeypatch.setattr("tunesmith.estimate.merged_micro_batches", estimate)
    return setup.merge_tokens(cfg, SimpleNamespace(collate=collate_rows), load_config(cfg.model), 0,
                              torch.device("cpu"))


def test_unpacked_passes_grow_past_one_micro_batch_only_with_boundary_attention(monkeypatch):
    """Unpacked samples share one row a pass: SDPA's mask and eager's scores grow with its length squared."""
    four = lambda *a, **k: (4, "fits")  # noqa: E731
    assert _merge_budget(monkeypatch, "tunesmith_varlen", four) == 4 * 2 * 256
    assert _merge_budget(monkeypatch, "flash_attention_2", four) == 4 * 2 * 256
    assert _merge_budget(monkeypatch, "sdpa", four) == 2 * 256  # one micro-batch's tokens a pass
    assert _merge_budget(monkeypatch, "eager", four) == 0  # batch 2: no merging
    assert _merge_budget(monkeypatch, "sdpa", four, packing=True) == 4 * 2 * 256  # rows stay cutoff_len wide


def test_a_failed_estimate_keeps_one_micro_batch_a_pass(monkeypatch):
    def fails(*a, **k):
        raise ValueError("no config")

    assert _merge_budget(monkeypatch, "tunesmith_varlen", fails) == 2 * 256


def test_unpadded_packed_rows_run_end_to_end_in_one_row():
    from tunesmith.train.plan import UNPADDED_MULTIPLE

    lengths = [60, 30, 50, 20, 90, 10, 40, 70, 5, 45, 80, 25]
    plan = EpochPlan(lengths, packing=True, cutoff_len=100, batch_size=3, grad_accum=1, num_epochs=1, max_steps=-1,
                     seed=0, unpadded=True)
    micro_batches = plan.step_batches(plan.epoch_order(0))[0]
    padded = EpochPlan(lengths, packing=True, cutoff_len=100, batch_size=3, grad_accum=1, num_epochs=1, max_steps=-1,
                       seed=0)
    one = next(micro_batch_loader(_Rows(lengths), plan, micro_batches, pad_id=0, num_workers=0, epoch=0))
    rows = next(micro_batch_loader(_Rows(lengths), padded, micro_batches, pad_id=0, num_workers=0, epoch=0))
    real = sum(lengths[i] for row in micro_batches[0] for i in row)
    assert one.input_ids_BT.shape == (1, -(-real // UNPADDED_MULTIPLE) * UNPADDED_MULTIPLE)
    assert rows.input_ids_BT.shape == (3, 100)
    assert one.num_tokens == rows.num_tokens == real and one.num_samples == rows.num_samples
    assert one.num_label_tokens == rows.num_label_tokens
    # the same samples in the same order, each its own segment, the padding one segment at the end
    kept = rows.segment_ids_BT >= 0
    assert torch.equal(one.input_ids_BT[0, :real], rows.input_ids_BT[kept])
    assert torch.equal(one.position_ids_BT[0, :real], rows.position_ids_BT[kept])
    longest = max(lengths[i] for row in micro_batches[0] for i in row)
    assert one.cu_seqlens[-1] == one.input_ids_BT.shape[1] and longest <= one.max_seqlen <= rows.max_seqlen


def test_unpadded_rows_only_under_boundary_attention_on_packed_text(monkeypatch):
    from types import SimpleNamespace

    from tunesmith.data.collate import collate_rows
    from tunesmith.models.load import load_config
    from tunesmith.train import setup

    def unpadded(attention, media=None, **overrides):
        cfg = run_config("/tmp/unused", per_device_train_batch_size=4, cutoff_len=256, **{"packing": True,
                                                                                             **overrides})
        monkeypatch.setattr(setup, "attn_implementation", lambda *a: attention)
        return setup.unpadded_rows(cfg, SimpleNamespace(collate=collate_rows), load_config(cfg.model), media,
                                   torch.device("cpu"))

    assert unpadded("tunesmith_varlen") and unpadded("flash_attention_2")
    assert not unpadded("sdpa") and not unpadded("eager")  # their cost grows with the row, squared
    assert not unpadded("tunesmith_varlen", packing=False)
    assert not unpadded("tunesmith_varlen", merge_micro_batches=False)
    assert not unpadded("tunesmith_varlen", media=object())
    assert not unpadded("tunesmith_varlen", backend="megatron")  # its forward splits the rows itself


def test_unpadded_packed_rows_give_the_losses_and_weights_of_padded_rows(tmp_path, monkeypatch):
    """Forced on the CPU (whose SDPA tells the samples of one row apart by their positions, as varlen does by
    boundaries): the same losses and weights as rows of cutoff_len."""
    from tunesmith.train import setup

    common = {"per_device_train_batch_size": 4, "max_steps": 3, "packing": True, "cutoff_len": 256}
    padded = train(run_config(tmp_path / "padded", **common))
    monkeypatch.setattr(setup, "unpadded_rows", lambda *a: True)
    unpadded = train(run_config(tmp_path / "unpadded", **common))
    assert unpadded.step_losses == pytest.approx(padded.step_losses, rel=1e-5)
    wa, wb = _weights(tmp_path / "unpadded"), _weights(tmp_path / "padded")
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=1e-4, atol=5e-5)
