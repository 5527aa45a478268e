"""Online RL through the real loop on the tiny model: every preset runs, metrics are logged, resume is exact."""

import json

import pytest
import torch

from conftest import run_config
from tunesmith.train.setup import train

RL = dict(stage="grpo", dataset="arith_rl", template="qwen3_nothink", max_samples=32, max_steps=2, num_generations=4,
          prompts_per_step=4, max_new_tokens=6, per_device_train_batch_size=8, learning_rate=1e-4)


def varied_reward(prompts, responses, samples, **kw):
    """A reward that always differs inside a group, so advantages are not all zero."""
    return [float(len(r) % 3) + 0.1 * i for i, r in enumerate(responses)]


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_grpo_logs_the_metrics_the_issue_names(tmp_path):
    out = tmp_path / "g"
    train(run_config(out, **RL, reward_funcs=["accuracy", {"name": "test_grpo_loop:varied_reward", "weight": 0.5}],
                     eval_dataset="arith_rl_eval", eval_strategy="steps", eval_steps=2, eval_num_prompts=8))
    logged = _metrics(out)
    step = next(m for m in logged if "reward_mean" in m)
    for key in ("reward_accuracy", "reward_test_grpo_loop:varied_reward", "advantage_mean", "clip_fraction", "entropy",
                "response_length_mean", "response_length_max", "zero_variance_group_share",
                "generate_tokens_per_s", "train_tokens_per_s", "time_generate", "time_score", "time_train"):
        assert key in step, key
    assert any("eval_reward_accuracy" in m for m in logged)
    assert (out / "model.safetensors").exists()


@pytest.mark.parametrize("stage", ["dr_grpo", "dapo", "gspo", "gspo_token", "reinforce"])
def test_every_preset_trains(tmp_path, stage):
    result = train(run_config(tmp_path / stage, **{**RL, "stage": stage},
                              reward_funcs=["test_grpo_loop:varied_reward"]))
    assert result.global_step == 2 and all(torch.isfinite(torch.tensor(result.step_losses)))


def test_multi_update_mode_with_kl_to_a_frozen_copy(tmp_path):
    result = train(run_config(tmp_path / "m", **RL, ppo_epochs=2, num_mini_batches=2, kl_coef=0.05,
                              reward_funcs=["test_grpo_loop:varied_reward"]))
    assert len(result.step_losses) == 2 and all(torch.isfinite(torch.tensor(result.step_losses)))
    assert any("kl" in m for m in _metrics(tmp_path / "m"))


def test_presets_fill_only_what_the_config_leaves_unset():
    from tunesmith.config.load import build_config
    from tunesmith.config.resolve import resolve

    cfg = resolve(build_config(None, {"dataset": "x", "stage": "gspo", "clip_ratio_high": 5e-4}))
    assert cfg.rl.policy_loss == "gspo" and cfg.rl.clip_ratio_low == 3e-4 and cfg.rl.clip_ratio_high == 5e-4


def test_dynamic_sampling_gives_up_with_a_clear_error_when_every_group_is_flat(tmp_path):
    from tunesmith.errors import TunesmithError

    with pytest.raises(TunesmithError, match="dynamic_sampling"):
        train(run_config(tmp_path / "d", **{**RL, "stage": "dapo"}, reward_funcs=["accuracy"], max_resample_rounds=1))


def test_rl_resume_is_exact(tmp_path):
    common = {**RL, "max_steps": 4, "reward_funcs": ["test_grpo_loop:varied_reward"]}
    straight = train(run_config(tmp_path / "s", **common))
    train(run_config(tmp_path / "r", **common, save_strategy="steps", save_steps=2))
    resumed = train(run_config(tmp_path / "r", **common, resume_from_checkpoint=str(tmp_path / "r" / "checkpoint-2")))
    assert resumed.step_losses == pytest.approx(straight.step_losses[2:], abs=1e-6)


def test_vision_language_prompts_go_through_the_same_loop(tmp_path):
    out = tmp_path / "vl"
    result = train(run_config(out, **{**RL, "dataset": "gui_click_demo", "template": "auto"},
                              model_name_or_path="tiny:qwen2_5_vl", finetuning_type="lora", image_max_pixels=16384,
                              cutoff_len=2048, reward_funcs=["grounding", "test_grpo_loop:varied_reward"]))
    assert result.global_step == 2 and all(torch.isfinite(torch.tensor(result.step_losses)))
    assert any("reward_grounding" in m for m in _metrics(out))


def test_kl_in_reward_lowers_the_rewards_not_the_loss(tmp_path, monkeypatch):
    from tunesmith.methods.grpo import GRPOMethod

    seen = {"kl": []}
    real = GRPOMethod.sequence_kl

    def spy(self, batch):
        seen["kl"].append(real(self, batch))
        return seen["kl"][-1] + 1.0  # a visible, known KL per sequence

    monkeypatch.setattr(GRPOMethod, "sequence_kl", spy)
    out = tmp_path / "k"
    train(run_config(out, **{**RL, "max_steps": 1}, kl_coef=0.5, kl_in_reward=True,
                     reward_funcs=["test_grpo_loop:varied_reward"]))
    step = next(m for m in _metrics(out) if "reward_mean" in m)
    raw = step["reward_test_grpo_loop:varied_reward"]
    assert step["reward_mean"] == pytest.approx(raw - 0.5 * (float(torch.cat(seen["kl"]).mean()) + 1.0), abs=1e-4)
    assert "lr" in step and "grad_norm" in step


def test_a_prompt_without_the_column_its_reward_reads_is_refused_before_any_step(tmp_path):
    """accuracy reads `answer` from every prompt row: a record without one is named while the data is prepared (not
    at the step that draws it), with the ways to fix it; answer_key points the reward at another column."""
    from tunesmith.errors import DataError

    data = tmp_path / "data"
    data.mkdir()
    rows = [{"instruction": f"{i} + 1 =", "answer": str(i + 1)} for i in range(8)]
    del rows[5]["answer"]
    (data / "rl.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps(
        {"rl": {"file_name": "rl.json", "columns": {"prompt": "instruction"}}}))
    settings = {**RL, "dataset": "rl", "dataset_dir": str(data), "max_samples": None}
    with pytest.raises(DataError, match=r"dataset 'rl', record 5: reward 'accuracy' reads a 'answer' column .*"
                                        r"answer_key"):
        train(run_config(tmp_path / "o", **settings))


def test_more_prompts_per_step_than_prompts_is_refused_naming_both(tmp_path):
    from tunesmith.errors import ConfigError

    with pytest.raises(ConfigError, match=r"prompts_per_step=8 is more than the 3 training prompts.*at most 3"):
        train(run_config(tmp_path / "g", **{**RL, "max_samples": 3, "prompts_per_step": 8}, reward_funcs=["accuracy"]))
