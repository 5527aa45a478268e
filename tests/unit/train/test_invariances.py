"""Numbers that must hold: accumulation and packing never change the loss; resume is exact."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import run_config
from tunesmith.data.collate import collate_rows
from tunesmith.data.pipeline import prepare_data
from tunesmith.methods.losses import per_segment_mean, token_nll
from tunesmith.models.forward import run_forward
from tunesmith.train.setup import train


def _weights(path):
    return load_file(str(path / "model.safetensors"))


def test_batch4_accum1_equals_batch1_accum4(tmp_path):
    a = train(run_config(tmp_path / "a", per_device_train_batch_size=4, gradient_accumulation_steps=1))
    b = train(run_config(tmp_path / "b", per_device_train_batch_size=1, gradient_accumulation_steps=4))
    assert a.step_losses == pytest.approx(b.step_losses, rel=1e-5, abs=1e-6)
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=1e-4, atol=1e-5)


# FlexAttention is checked on GPU (benchmarks/gpu_checks.py): CPU inductor fails to compile its kernel in torch 2.14.
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_and_unpacked_per_sample_losses_agree(tmp_path, tiny_qwen3, attn):
    cfg = run_config(tmp_path / "p", max_samples=12)
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    rows = prepare_data(cfg, tok).train
    samples = [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows]
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3, attn_implementation=attn).eval()

    def per_sample(batch):
        with torch.no_grad():
            nll = token_nll(run_forward(model, batch, "logits").logits_BTV, batch.targets_BT)
        return per_segment_mean(nll, batch.targets_BT, batch.segment_ids_BT)

    unpacked = per_sample(collate_rows([[s] for s in samples], tok.pad_token_id))
    packed = per_sample(collate_rows([samples[:5], samples[5:]], tok.pad_token_id))
    torch.testing.assert_close(packed, unpacked, rtol=1e-5, atol=1e-5)


def test_auto_checkpointing_trains_like_every_layer_recomputed(tmp_path):
    """The fast path LF's YAML gets (gradient_checkpointing: auto -> off here) against LF's default (every layer
    checkpointed), packed as neat_packing does: the same loss at each of the first 20 steps."""
    common = dict(max_steps=20, packing=True, neat_packing=True, per_device_train_batch_size=2)
    fast = train(run_config(tmp_path / "auto", **common))
    slow = train(run_config(tmp_path / "ckpt", gradient_checkpointing=True, **common))
    assert len(fast.step_losses) == 20
    # issue 15 asks for 1% relative; in fp32 on the CPU recomputation gives the same numbers
    assert fast.step_losses == pytest.approx(slow.step_losses, rel=1e-5)


def test_packing_in_the_loop_gives_same_first_step_loss_as_unpacked(tmp_path):
    # One step over the whole (small) dataset: packing regroups rows, the loss must not move.
    common = dict(max_samples=16, max_steps=1, cutoff_len=512)
    a = train(run_config(tmp_path / "u", per_device_train_batch_size=16, packing=False, **common))
    b = train(run_config(tmp_path / "k", per_device_train_batch_size=16, packing=True, **common))
    assert a.step_losses[0] == pytest.approx(b.step_losses[0], rel=1e-5)


def test_resume_is_exact(tmp_path):
    straight = train(run_config(tmp_path / "s", max_steps=6, lora_dropout=0.1, finetuning_type="lora"))
    first = train(run_config(tmp_path / "r", max_steps=6, save_strategy="steps", save_steps=3,
                             lora_dropout=0.1, finetuning_type="lora"))
    assert first.step_losses == pytest.approx(straight.step_losses, abs=1e-6)
    resumed = train(run_config(tmp_path / "r", max_steps=6, finetuning_type="lora", lora_dropout=0.1,
                               resume_from_checkpoint=str(tmp_path / "r" / "checkpoint-3")))
    assert resumed.step_losses == pytest.approx(straight.step_losses[3:], abs=1e-6)
    logged = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged if "loss" in m][-3:] == [4, 5, 6]
