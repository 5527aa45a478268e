"""models/fp32_head.py: cast_lm_head_to_fp32, the output layer's logits in fp32 from half-precision operands."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from conftest import run_config
from tunesmith.errors import TunesmithError
from tunesmith.models.fp32_head import fp32_logits, install_fp32_head
from tunesmith.train.setup import train


def _operands(seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 5, 64, generator=gen, requires_grad=True)
    weight = torch.randn(300, 64, generator=gen).mul_(0.05).requires_grad_()
    return hidden, weight


def test_under_bf16_autocast_the_logits_are_the_bf16_operands_multiplied_in_fp32():
    hidden, weight = _operands()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = fp32_logits(hidden, weight)
    assert logits.dtype == torch.float32
    expected = F.linear(hidden.detach().bfloat16().float(), weight.detach().bfloat16().float())
    torch.testing.assert_close(logits.detach(), expected, rtol=1e-6, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rounded = F.linear(hidden, weight)  # the plain head: bf16 logits
    assert (rounded.float() - expected).abs().max() > 10 * (logits.detach() - expected).abs().max()


def test_its_gradients_are_the_autocast_heads():
    hidden, weight = _operands()
    grad = torch.randn(2, 5, 300, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fp32_logits(hidden, weight).backward(grad)
    ours = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        F.linear(hidden, weight).backward(grad.bfloat16())
    assert ours[0].dtype == hidden.dtype and ours[1].dtype == weight.dtype  # fp32 masters get fp32 gradients
    torch.testing.assert_close(ours[0], hidden.grad, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(ours[1], weight.grad, rtol=2e-2, atol=2e-3)


def test_pure_bf16_weights_and_fp32_runs():
    hidden, weight = _operands()
    logits = fp32_logits(hidden.detach().bfloat16(), weight.detach().bfloat16())  # pure_bf16: the weight's dtype
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, F.linear(hidden.detach().bfloat16().float(), weight.detach().bfloat16().float()),
                               rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fp32_logits(hidden, weight), F.linear(hidden, weight))  # fp32: unchanged


def test_the_installed_head_keeps_its_names_and_a_copy_uses_its_own_weights(tiny_qwen3):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    names = set(model.state_dict())
    install_fp32_head(model)
    assert set(model.state_dict()) == names
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids).logits
    assert logits.dtype == torch.float32
    frozen = copy.deepcopy(model)  # a reference model (engines/reference.py)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(2.0)
        assert not torch.allclose(model(ids).logits, frozen(ids).logits)


def test_a_head_that_is_not_a_plain_linear_is_refused():
    class Wrapped(torch.nn.Linear):
        pass

    model = torch.nn.Module()
    model.get_output_embeddings = lambda: Wrapped(4, 4)
    with pytest.raises(TunesmithError, match="cast_lm_head_to_fp32 needs a plain linear output layer"):
        install_fp32_head(model)


def test_vllms_logits_layer_with_the_fp32_head_computes_what_the_trainers_does():
    """vLLM 0.25's logits layer, replaced through its out-of-tree hook (rollout/vllm.py), on a stand-in base."""
    from tunesmith.rollout import vllm as rollout_vllm

    class Base(torch.nn.Module):  # the parts of vLLM's LogitsProcessor the replacement uses
        def __init__(self, vocab):
            super().__init__()
            self.org_vocab_size = vocab

        def _get_logits(self, hidden, lm_head, bias):
            return F.linear(hidden, lm_head.weight)

        def _gather_logits(self, logits):
            return logits

    hidden, weight = _operands()
    head = torch.nn.Embedding(300, 64, _weight=weight.detach().bfloat16())
    layer_class = rollout_vllm._fp32_logits_layer(Base)
    try:
        rollout_vllm._FP32_LOGITS["on"] = True
        layer = layer_class(290)  # vLLM pads the vocabulary; the padding is cut
    finally:
        rollout_vllm._FP32_LOGITS["on"] = False
    logits = layer._get_logits(hidden.detach().bfloat16(), head, None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trainer = fp32_logits(hidden.detach(), weight.detach())
    assert logits.dtype == torch.float32 and logits.shape[-1] == 290
    torch.testing.assert_close(logits, trainer[..., :290], rtol=1e-6, atol=1e-6)
    assert layer_class(290)._get_logits(hidden.detach().bfloat16(), head, None).dtype == torch.bfloat16  # off


def test_grpo_with_the_fp32_head_keeps_the_sampler_and_trainer_log_probs_together(tmp_path):
    """The hf backend samples with the same fp32 head the trainer recomputes with, under bf16 autocast."""
    out = tmp_path / "run"
    train(run_config(out, stage="grpo", dataset="arith_rl", template="qwen3_nothink", max_samples=8, max_steps=2,
                     num_generations=4, prompts_per_step=2, max_new_tokens=6, per_device_train_batch_size=8,
                     learning_rate=1e-4, logging_steps=1, bf16=True, cast_lm_head_to_fp32=True,
                     rollout_backend="hf", reward_funcs=["length"]))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    gaps = [m["rollout_logp_diff_mean"] for m in metrics if "rollout_logp_diff_mean" in m]
    assert len(gaps) == 2 and max(gaps) < 0.02
