"""The shipped GRPO digits demo through the real CLI with each transformers rollout backend: both train, their
sampler log-probs equal the trainer's (fp32, CPU), and the greedy held-out reward before training is the same."""

import pytest

from test_cli import DATA, cli, metrics


@pytest.mark.slow
def test_hf_and_hf_paged_run_the_digits_demo_alike(tmp_path):
    runs = {}
    for backend in ("hf", "hf_paged"):
        out = tmp_path / backend
        cli("train", "examples/qwen3_grpo_digits.yaml", "model_name_or_path=tiny:qwen3", f"dataset_dir={DATA}",
            f"output_dir={out}", f"rollout_backend={backend}", "max_steps=3", "prompts_per_step=4",
            "num_generations=4", "eval_steps=3", "eval_num_prompts=16", "logging_steps=1")
        runs[backend] = metrics(out)
    for backend, logged in runs.items():
        steps = [m for m in logged if "rollout_logp_diff_max" in m]
        assert len(steps) == 3, backend
        assert all(m["rollout_logp_diff_max"] < 1e-4 and abs(m["rollout_kl"]) < 1e-6 for m in steps), steps
    first = {b: next(m["eval_reward_mean"] for m in logged if "eval_reward_mean" in m) for b, logged in runs.items()}
    assert first["hf"] == first["hf_paged"]
