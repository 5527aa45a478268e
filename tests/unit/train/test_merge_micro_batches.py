"""merge_micro_batches: the samples of an unpacked optimiser step run as packed forward passes, with the same
samples per step and the same loss as one forward pass per micro-batch (issue 15, item 4)."""

import pytest
import torch
from safetensors.torch import load_file

from conftest import run_config
from tunesmith.train.plan import EpochPlan
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


def _weights(path):
    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("overrides", [
    {},
    {"model_name_or_path": "tiny:qwen3_vl", "dataset": "mllm_demo,identity", "template": "auto",
     "image_max_pixels": 16384, "cutoff_len": 1024, "max_samples": 16, "freeze_vision_tower": False},
], ids=["text", "qwen3_vl"])
def test_merged_steps_give_the_losses_and_weights_of_one_pass_per_micro_batch(tmp_path, overrides):
    common = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "max_steps": 3, **overrides}
    merged = train(run_config(tmp_path / "merged", **common))
    alone = train(run_config(tmp_path / "alone", merge_micro_batches=False, **common))
    assert len(merged.step_losses) == 3
    assert merged.step_losses == pytest.approx(alone.step_losses, rel=1e-5)
    wa, wb = _weights(tmp_path / "merged"), _weights(tmp_path / "alone")
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=1e-4, atol=1e-5)


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
