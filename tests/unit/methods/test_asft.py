"""use_asft_loss (LLaMA-Factory's ASFT): DFT's token loss plus asft_alpha x the KL from the reference's next-token
distribution, the reference's logits computed micro-batch by micro-batch."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import run_config
from tunesmith.config.load import build_config
from tunesmith.config.resolve import resolve_reference
from tunesmith.data.collate import SFTBatch
from tunesmith.engines.base import StepOutput
from tunesmith.errors import ConfigError
from tunesmith.methods.base import LossOutput
from tunesmith.methods.losses import IGNORE_INDEX
from tunesmith.methods.sft import REFERENCE_LOGITS, SFTMethod
from tunesmith.models.forward import ModelOutputs
from tunesmith.train.setup import train
from tunesmith.train.steps import forward_backward


def _batch(targets):
    return SFTBatch(input_ids_BT=targets.clamp(min=0), targets_BT=targets, position_ids_BT=torch.zeros_like(targets),
                    segment_ids_BT=torch.zeros_like(targets), num_label_tokens=int((targets != IGNORE_INDEX).sum()),
                    num_samples=targets.shape[0], num_tokens=targets.numel())


def test_the_loss_is_llamafactorys_dft_plus_alpha_times_its_kl(tmp_path):
    method = SFTMethod(run_config(tmp_path, use_asft_loss=True, asft_alpha=0.05))
    assert method.outputs == "logits"
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 30, requires_grad=True)
    ref_logits = torch.randn(2, 4, 30)
    targets = torch.tensor([[3, 7, IGNORE_INDEX, 1], [IGNORE_INDEX, 2, 9, 4]])
    batch = _batch(targets)
    prepass, = method.prepasses()
    assert prepass.reference and prepass.per_micro_batch and prepass.outputs == "logits"
    batch.extra[REFERENCE_LOGITS] = prepass.fn(ModelOutputs(logits_BTV=ref_logits), batch)
    out = method.loss(ModelOutputs(logits_BTV=logits), batch, {"units": 6})  # one micro-batch: LF's token means
    valid = targets != IGNORE_INDEX
    nll = F.cross_entropy(logits[valid], targets[valid], reduction="none")
    dft = (nll * torch.exp(-nll.detach())).mean()
    # LLaMA-Factory's _kl_divergence: kl_div(log_softmax(policy), softmax(ref)) summed over the vocabulary,
    # averaged over the label tokens
    kl = F.kl_div(F.log_softmax(logits, -1), F.softmax(ref_logits, -1), reduction="none").sum(-1)[valid].mean()
    expected = dft + 0.05 * kl
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert out.sums["kl"].item() == pytest.approx(kl.item() * 6, rel=1e-5)  # logged per label token
    out.loss.backward()
    grad_expected, = torch.autograd.grad(expected, logits)
    assert torch.allclose(logits.grad, grad_expected, atol=1e-6)


class _Recorder:
    """An engine that records the order of reference forwards and forward-backward calls."""

    def __init__(self, asft=True):
        self.calls = []
        self.on_reference = False
        self.asft = asft

    def reference(self):
        engine = self

        class _Ref:
            def __enter__(self):
                engine.on_reference = True

            def __exit__(self, *exc):
                engine.on_reference = False

        return _Ref()

    def forward(self, batches, fn):
        self.calls.append(("reference" if self.on_reference else "policy", len(batches)))
        return [torch.zeros(b.num_label_tokens, 30) for b in batches]

    def forward_backward(self, batches, fn):
        self.calls.append(("forward_backward", len(batches)))
        assert all((REFERENCE_LOGITS in b.extra) == self.asft for b in batches)
        total = StepOutput()
        for b in batches:
            total.add(LossOutput(torch.tensor(1.0), {"kl": torch.tensor(2.0)}, b.num_label_tokens))
        return total


def test_each_micro_batch_has_its_reference_logits_just_before_its_forward_and_drops_them(tmp_path):
    method = SFTMethod(run_config(tmp_path, use_asft_loss=True))
    update = [_batch(torch.tensor([[1, 2, IGNORE_INDEX]])), _batch(torch.tensor([[3, IGNORE_INDEX, 4]]))]
    engine = _Recorder()
    out = forward_backward(engine, method, update)
    assert engine.calls == [("reference", 1), ("forward_backward", 1)] * 2  # never two micro-batches' logits at once
    assert all(REFERENCE_LOGITS not in b.extra for b in update)
    assert out.count == 4 and float(out.loss) == 2.0 and float(out.sums["kl"]) == 4.0
    engine = _Recorder(asft=False)
    forward_backward(engine, SFTMethod(run_config(tmp_path)), update)  # without ASFT: the whole step in one call
    assert engine.calls == [("forward_backward", 2)]


def _kl_rows(output_dir):
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "kl" in row]


@pytest.mark.parametrize("finetuning_type", ["full", "lora"])
def test_an_asft_run_starts_at_its_reference_and_moves_away(tmp_path, finetuning_type):
    """The reference is the starting model (a frozen copy, or LoRA's base with the adapters off): the first step's
    KL is 0, later ones are not; gradient accumulation runs the micro-batches one by one."""
    out = tmp_path / finetuning_type
    cfg = run_config(out, use_asft_loss=True, finetuning_type=finetuning_type, gradient_accumulation_steps=2,
                     per_device_train_batch_size=2, val_size=0.25, eval_strategy="steps", eval_steps=4)
    assert resolve_reference(cfg) == ("adapters_off" if finetuning_type == "lora" else "copy")
    result = train(cfg)
    kl = [row["kl"] for row in _kl_rows(out)]
    assert len(kl) == 4 and kl[0] == pytest.approx(0.0, abs=1e-5) and kl[-1] > 1e-4
    assert all(math.isfinite(loss) for loss in result.step_losses)
    assert math.isfinite(result.eval_metrics["eval_loss"]) and result.eval_metrics["eval_kl"] > 0


def test_asft_with_alpha_0_trains_as_dft(tmp_path):
    asft = train(run_config(tmp_path / "asft", use_asft_loss=True, asft_alpha=0.0, max_steps=3))
    dft = train(run_config(tmp_path / "dft", use_dft_loss=True, max_steps=3))
    assert asft.step_losses == pytest.approx(dft.step_losses, rel=1e-6)


@pytest.mark.parametrize("keys, message", [
    ({"use_dft_loss": True}, "set use_asft_loss alone"),
    ({"pref_reference": "precomputed"}, "pref_reference: precomputed with use_asft_loss"),
    ({"pref_reference": "none"}, "pref_reference: none with use_asft_loss"),
    ({"backend": "megatron"}, "use_asft_loss is not available on backend: megatron"),
])
def test_settings_asft_cannot_run_with_are_refused(keys, message):
    with pytest.raises(ConfigError, match=message):
        build_config(None, {"dataset": "x", "use_asft_loss": True, **keys})


def test_the_memory_estimate_counts_the_reference_logits():
    from transformers import Qwen3Config

    from tunesmith.estimate import GIB, estimate_memory

    shape = Qwen3Config(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=64, intermediate_size=512, vocab_size=32000)
    keys = {"dataset": "x", "finetuning_type": "full", "cutoff_len": 1024,
            "per_device_train_batch_size": 2}
    asft = estimate_memory(build_config(None, {**keys, "use_asft_loss": True}), 1, 80.0, hf_config=shape)
    plain = estimate_memory(build_config(None, keys), 1, 80.0, hf_config=shape)
    assert plain["logits"] == pytest.approx(2 * 1024 * 32000 * 4 * 2 / GIB)  # the policy's and their gradient
    assert asft["logits"] == pytest.approx(plain["logits"] * 5 / 2)  # + the reference's, the KL's and its gradient
    assert asft["weights"] > plain["weights"] and "frozen reference model copy" in " ".join(asft["notes"])
    assert asft["weights"] == pytest.approx(2 * plain["weights"])  # the copy: the fp32 weights again



def test_a_continued_adapter_is_off_in_the_reference_as_in_llamafactory_unless_copy_is_asked(tmp_path):
    adapter = str(tmp_path / "a")
    for keys in ({"use_asft_loss": True}, {"stage": "dpo", "dataset": "dpo_en_demo"}):
        assert resolve_reference(run_config(tmp_path, finetuning_type="lora", adapter_name_or_path=adapter,
                                            **keys)) == "adapters_off"
        assert resolve_reference(run_config(tmp_path, finetuning_type="lora", adapter_name_or_path=adapter,
                                            pref_reference="copy", **keys)) == "copy"


def test_a_copy_under_fsdp2_on_several_processes_is_refused_when_the_backend_is_resolved(tmp_path):
    from tunesmith.config.resolve import RunFacts, resolve

    with pytest.raises(ConfigError, match="FSDP2 on several processes does not keep; use DeepSpeed ZeRO stage 0-2"):
        resolve(run_config(tmp_path, use_asft_loss=True), RunFacts(world_size=2))
    with pytest.raises(ConfigError, match="use pref_reference: precomputed"):
        resolve(run_config(tmp_path, stage="dpo", dataset="dpo_en_demo"), RunFacts(world_size=2))
    with pytest.raises(ConfigError, match="use pref_reference: adapters_off"):
        resolve(run_config(tmp_path, finetuning_type="lora", pref_reference="copy", use_asft_loss=True),
                RunFacts(world_size=2))
    lora = resolve(run_config(tmp_path, finetuning_type="lora", use_asft_loss=True), RunFacts(world_size=2))
    assert lora.finetune.pref_reference == "adapters_off"


def test_the_key_on_another_stage_is_idle_and_alpha_0_is_warned(tmp_path, caplog):
    import logging

    cfg = build_config(None, {"dataset": "x", "stage": "dpo", "pref_reference": "precomputed",
                              "use_asft_loss": True})
    assert resolve_reference(cfg) == "precomputed"
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        build_config(None, {"dataset": "x", "use_asft_loss": True, "asft_alpha": 0})
    assert "use use_dft_loss: true instead" in caplog.text
