"""bf16 working weights next to fp32 masters (engines/master_weights.py): the same training as autocast over
fp32 parameters, and checkpoints that hold the fp32 masters. Forced on here on the CPU (it is the GPU default)."""

import pytest
import torch
from safetensors.torch import load_file

from conftest import run_config
from tunesmith import engines
from tunesmith.engines.master_weights import Bf16Working
from tunesmith.train.setup import train


@pytest.fixture
def working_on(monkeypatch):
    monkeypatch.setattr(engines, "uses_bf16_working", lambda precision, device: precision == "bf16")


def _run(out, **extra):
    settings = dict(bf16=True, max_steps=20, learning_rate=1e-3, per_device_train_batch_size=2,
                    gradient_accumulation_steps=2, lr_scheduler_type="constant", cutoff_len=64)
    return train(run_config(out, **{**settings, **extra}))


def test_losses_match_autocast_over_fp32_weights(tmp_path, monkeypatch):
    plain = _run(tmp_path / "plain")
    monkeypatch.setattr(engines, "uses_bf16_working", lambda precision, device: precision == "bf16")
    working = _run(tmp_path / "working")
    for a, b in zip(plain.step_losses, working.step_losses, strict=True):
        assert abs(a - b) / abs(a) < 0.01
    saved = load_file(tmp_path / "working" / "model.safetensors")
    assert {t.dtype for t in saved.values()} == {torch.float32}  # the masters, not the bf16 copies


def test_resume_continues_from_the_masters(tmp_path, working_on):
    out = tmp_path / "o"
    full = _run(tmp_path / "full", max_steps=6)
    _run(out, save_strategy="steps", save_steps=3, max_steps=3)
    resumed = _run(out, resume_from_checkpoint=str(out / "checkpoint-3"), max_steps=6)
    torch.testing.assert_close(resumed.step_losses, full.step_losses[3:], rtol=1e-5, atol=1e-5)


def test_tied_weights_share_one_copy_and_gradients_reach_the_masters():
    emb = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head)
    master = emb.weight
    working = Bf16Working(model)
    assert model[0].weight is model[1].weight and model[0].weight.dtype == torch.bfloat16
    for _ in range(2):  # two micro-batches accumulate in fp32
        model(torch.tensor([1, 2])).float().sum().backward()
    assert model[0].weight.grad is None and master.grad.dtype == torch.float32 and master.grad.abs().sum() > 0
    with torch.no_grad():
        master.add_(1.0)
    working.refresh()
    torch.testing.assert_close(model[0].weight.float(), master.detach(), rtol=1e-2, atol=1e-2)
    with working.masters_in_place():
        assert model[0].weight is master
    assert working.masters() == [master]
