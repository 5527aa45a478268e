"""The Megatron engine over several CPU processes (torchrun, gloo): tensor parallelism gives the single engine's
per-step losses and weights and resumes exactly; tensor x data parallelism (4 processes) gives the losses of FSDP2's
data parallelism on the same data split. Skipped without megatron-core."""

import os

import pytest
import torch

pytest.importorskip("megatron.core")

from safetensors.torch import load_file  # noqa: E402

from test_cli import BASE, cli, metrics  # noqa: E402

COMMON = [*BASE, "dataset=alpaca_demo", "finetuning_type=full", "max_samples=48", "logging_steps=1",
          "learning_rate=1e-3", "max_steps=4", "gradient_accumulation_steps=2", "neat_packing=true"]


def _ranks(monkeypatch, n: int):
    monkeypatch.setenv("FORCE_TORCHRUN", "1")
    monkeypatch.setenv("NPROC_PER_NODE", str(n))
    monkeypatch.setenv("MASTER_PORT", str(29300 + os.getpid() % 300))


def _losses(out):
    return [m["loss"] for m in metrics(out) if "loss" in m]


@pytest.mark.slow
def test_tensor_parallel_equals_the_single_engine_saves_whole_weights_and_resumes_exactly(tmp_path, monkeypatch):
    single, tp2 = tmp_path / "single", tmp_path / "tp2"
    cli("train", *COMMON, "per_device_train_batch_size=2", "backend=single", "save_strategy=no",
        f"output_dir={single}")
    _ranks(monkeypatch, 2)
    proc = cli("train", *COMMON, "per_device_train_batch_size=2", "backend=megatron", "tensor_model_parallel_size=2",
               "save_steps=2", f"output_dir={tp2}")
    assert "TP=2, data parallel 1" in " ".join((proc.stdout + proc.stderr).split())
    assert _losses(tp2) == pytest.approx(_losses(single), rel=1e-4)
    a, b = load_file(tp2 / "model.safetensors"), load_file(single / "model.safetensors")
    assert set(a) == set(b)  # the shards gathered, the vocabulary padding cut: a plain transformers folder
    for key in a:  # Qwen3's per-head q/k norms too (their gradients are summed over the tensor-parallel ranks)
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-5)
    ckpt = tp2 / "checkpoint-2"
    assert (ckpt / "engine_state_rank0.pt").exists() and (ckpt / "engine_state_rank1.pt").exists()
    cli("train", *COMMON, "per_device_train_batch_size=2", "backend=megatron", "tensor_model_parallel_size=2",
        "save_strategy=no", f"output_dir={tp2}", f"resume_from_checkpoint={ckpt}")
    assert _losses(tp2)[-2:] == pytest.approx(_losses(single)[2:], rel=1e-4)


@pytest.mark.slow
def test_tensor_and_data_parallel_equal_fsdp2_data_parallel(tmp_path, monkeypatch):
    """Four processes: two replicas of a TP=2 model, each on its share of every step (the loop's sums count each
    replica once), against FSDP2 on two processes with the same per-replica batch."""
    fsdp2, mega = tmp_path / "fsdp2", tmp_path / "tp2dp2"
    _ranks(monkeypatch, 2)
    cli("train", *COMMON, "per_device_train_batch_size=1", "backend=fsdp2", "save_strategy=no", f"output_dir={fsdp2}")
    _ranks(monkeypatch, 4)
    proc = cli("train", *COMMON, "per_device_train_batch_size=1", "backend=megatron", "tensor_model_parallel_size=2",
               "save_strategy=no", f"output_dir={mega}")
    assert "TP=2, data parallel 2" in " ".join((proc.stdout + proc.stderr).split())
    assert _losses(mega) == pytest.approx(_losses(fsdp2), rel=1e-5)
