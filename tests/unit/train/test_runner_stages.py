"""Every stage goes through the one Runner and gets every loop feature: evaluation, checkpoints, exact resume
(with no step logged twice), the final model; the saved config is exactly what ran."""

import json

import pytest
import yaml

from conftest import DATA_DIR, run_config
from tunesmith.stages import ONLINE_RL_STAGES, STAGE_NAMES
from tunesmith.train import checkpoint as ckpt
from tunesmith.train.setup import set_up, train


def varied_reward(prompts, responses, samples, **kw):
    """Differs inside every group, so advantages (and losses) are not all zero."""
    return [float(len(r) % 3) + 0.1 * i for i, r in enumerate(responses)]


RL = dict(dataset="arith_rl", eval_dataset="arith_rl_eval", template="qwen3_nothink", num_generations=4,
          prompts_per_step=4, max_new_tokens=6, per_device_train_batch_size=8, eval_num_prompts=4,
          reward_funcs=["test_runner_stages:varied_reward"])
DATA = {"pt": dict(dataset="pt_demo", val_size=0.2), "sft": dict(val_size=0.2),
        "rm": dict(dataset="dpo_demo", val_size=0.2), "dpo": dict(dataset="dpo_demo", val_size=0.2),
        "kto": dict(dataset="kto_demo", val_size=0.2, per_device_train_batch_size=4), "grpo": RL}


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("stage", list(DATA))
def test_each_stage_evaluates_saves_resumes_exactly_and_saves_the_final_model(tmp_path, stage):
    out = tmp_path / stage
    common = dict(stage=stage, max_steps=4, eval_strategy="steps", eval_steps=2, save_strategy="steps",
                  save_steps=2, **DATA[stage])
    first = train(run_config(out, **common))
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["checkpoint-2", "checkpoint-4"]
    assert first.eval_metrics and (out / "train_summary.json").exists()
    assert (out / "model.safetensors").exists()
    summary = json.loads((out / "train_summary.json").read_text())
    phases, parts = summary["phases"], summary["start_up_parts"]
    assert list(phases) == ["start_up", "data", "model", "train", "final_save"] and min(phases.values()) >= 0
    assert list(parts) == ["imports", "config", "tokenizer", "to_data"] and min(parts.values()) >= 0
    assert sum(parts.values()) == pytest.approx(phases["start_up"], abs=0.03)  # the parts make up start-up
    resumed = train(run_config(out, **common, resume_from_checkpoint=str(out / "checkpoint-2")))
    assert resumed.step_losses == pytest.approx(first.step_losses[2:], abs=1e-6)
    steps = [r["step"] for r in _rows(out) if "loss" in r]
    assert steps == [1, 2, 3, 4]  # the resumed run replaced what was logged after checkpoint-2


def test_online_rl_evaluates_and_saves_by_epoch_and_saves_the_final_model(tmp_path):
    out = tmp_path / "rl"
    result = train(run_config(out, stage="grpo", **{**RL, "max_samples": 8}, max_steps=4, eval_strategy="epoch",
                              save_strategy="epoch"))
    assert result.global_step == 4
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["checkpoint-2", "checkpoint-4"]  # 8 prompts, 4 a step
    assert [r["step"] for r in _rows(out) if "eval_reward_mean" in r] == [0, 2, 4]
    assert (out / "model.safetensors").exists()


def test_save_final_model_false_writes_no_model_for_online_rl_either(tmp_path):
    out = tmp_path / "rl"
    train(run_config(out, stage="grpo", **RL, max_steps=1, save_final_model=False))
    assert not (out / "model.safetensors").exists() and (out / "train_summary.json").exists()


@pytest.mark.parametrize("stage", ONLINE_RL_STAGES)
def test_the_saved_config_of_every_online_rl_preset_is_what_runs(tmp_path, stage):
    from tunesmith.config.load import build_config
    from tunesmith.config.resolve import resolve, resolve_steps

    runner = set_up(run_config(tmp_path / stage, stage=stage, **{**RL, "max_steps": 1}))
    runner.run()  # the run writes the config it trains with
    saved_path = tmp_path / stage / "tunesmith_config.yaml"
    saved = yaml.safe_load(saved_path.read_text())
    assert saved == runner.cfg.flat()
    for key, value in __import__("tunesmith.stages", fromlist=["STAGES"]).STAGES[stage].preset.items():
        assert saved[key] == value  # the preset is recorded, not applied after saving
    again = resolve(build_config(saved_path))  # re-running the saved file resolves to the same run
    assert resolve_steps(again, runner.cfg.train.num_steps_per_epoch).flat() == runner.cfg.flat()


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_tunesmith_data_works_for_every_stage(stage, capsys):
    from tunesmith.cli import main

    data = {"pt": "pt_demo", "rm": "dpo_demo", "dpo": "dpo_demo", "kto": "kto_demo"}.get(stage, "alpaca_demo")
    if stage in ONLINE_RL_STAGES:
        data = "arith_rl"
    code = main(["data", f"stage={stage}", f"dataset={data}", f"dataset_dir={DATA_DIR}", "template=chatml",
                 "max_samples=16"])
    assert code == 0
    shown = capsys.readouterr()
    assert "samples" in shown.out + shown.err  # the console writes to stderr
