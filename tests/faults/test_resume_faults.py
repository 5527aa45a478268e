"""Faults at resume and while training: an old run behind overwrite_output_dir, a changed config, an extended
schedule, checkpoints left in output_dir, a diverging run. Each is refused with a named error or survived."""

import json

import pytest

from conftest import run_config
from tunesmith.errors import ConfigError, TunesmithError
from tunesmith.train import checkpoint as ckpt
from tunesmith.train.setup import train

SAVING = dict(save_strategy="steps", save_steps=2)


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_overwrite_output_dir_leaves_nothing_of_the_old_run_to_resume(tmp_path):
    out = tmp_path / "o"
    train(run_config(out, max_steps=8, **SAVING))
    assert ckpt.list_checkpoints(out)[-1].name == "checkpoint-8"
    (out / "notes.txt").write_text("mine")
    (out / "README.md").write_text("---\nbase_model: tiny\nlibrary_name: peft\n---\n")  # a LoRA run's model card
    (out / "training_rewards_accuracies.png").write_bytes(b"")  # an earlier dpo run's curve
    train(run_config(out, max_steps=2, overwrite_output_dir=True, **SAVING))
    assert not (out / "training_rewards_accuracies.png").exists()
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["checkpoint-2"]  # checkpoint-8 is gone
    assert (out / "notes.txt").read_text() == "mine"  # a file tunesmith did not write stays
    assert not (out / "README.md").exists() or "peft" not in (out / "README.md").read_text()
    resumed = train(run_config(out, max_steps=4, resume_from_checkpoint=True, **SAVING))
    assert resumed.global_step == 4 and len(resumed.step_losses) == 2  # continued from this run's step 2


def test_a_changed_training_setting_at_resume_is_refused_naming_it_unless_allowed(tmp_path):
    out = tmp_path / "o"
    train(run_config(out, max_steps=4, **SAVING))
    with pytest.raises(ConfigError, match=r"learning_rate: 0\.001 -> 0\.002.*resume_allow_changes"):
        train(run_config(out, max_steps=4, learning_rate=2e-3, resume_from_checkpoint=str(out / "checkpoint-2")))
    train(run_config(out, max_steps=4, learning_rate=2e-3, resume_from_checkpoint=str(out / "checkpoint-2"),
                     resume_allow_changes=["learning_rate"]))
    change = json.loads((out / "config_changes.jsonl").read_text().splitlines()[-1])
    assert change == {"resumed_at_step": 2, "changed": {"learning_rate": [0.001, 0.002]}}
    assert "learning_rate: 0.002" in (out / "tunesmith_config.yaml").read_text()


def test_a_resume_that_fails_to_restore_records_no_config_change(tmp_path):
    out = tmp_path / "o"
    train(run_config(out, max_steps=4, **SAVING))
    checkpoint = out / "checkpoint-2"
    weights = next(p for p in sorted(checkpoint.rglob("*.safetensors")))
    weights.write_bytes(weights.read_bytes()[:-8] + b"tampered")
    with pytest.raises(TunesmithError):
        train(run_config(out, max_steps=4, learning_rate=2e-3, resume_from_checkpoint=str(checkpoint),
                         resume_allow_changes=["learning_rate"]))
    assert not (out / "config_changes.jsonl").exists()


def test_harmless_changes_pass_without_a_word(tmp_path):
    out = tmp_path / "o"
    train(run_config(out, max_steps=4, **SAVING))
    train(run_config(out, max_steps=4, logging_steps=2, save_steps=3, save_strategy="steps",
                     resume_from_checkpoint=str(out / "checkpoint-2")))
    assert not (out / "config_changes.jsonl").exists()


def test_extending_max_steps_rebuilds_the_schedule_for_the_new_total(tmp_path):
    """The first resumed step's learning rate is the new schedule's value at that step, not the old one's
    (with the old total a linear schedule would be at its end, lr 0)."""
    out, fresh = tmp_path / "o", tmp_path / "fresh"
    common = dict(lr_scheduler_type="linear", learning_rate=1e-3)
    train(run_config(out, max_steps=4, save_strategy="steps", save_steps=4, **common))
    train(run_config(out, max_steps=8, resume_from_checkpoint=True, **common))
    train(run_config(fresh, max_steps=8, **common))
    resumed = {r["step"]: r["lr"] for r in _rows(out) if "lr" in r}
    straight = {r["step"]: r["lr"] for r in _rows(fresh) if "lr" in r}
    assert resumed[5] == pytest.approx(straight[5]) and resumed[5] > 0
    assert [resumed[s] for s in range(5, 9)] == pytest.approx([straight[s] for s in range(5, 9)])
    change = json.loads((out / "config_changes.jsonl").read_text())
    assert change["changed"]["max_steps"] == [4, 8]


def test_a_run_started_into_a_folder_with_checkpoints_resumes_from_the_newest(tmp_path, caplog):
    import logging
    import shutil

    caplog.set_level(logging.INFO, logger="tunesmith")
    out = tmp_path / "o"
    straight = train(run_config(out, max_steps=4, **SAVING))
    shutil.rmtree(out / "checkpoint-4")  # as if the run had been stopped after step 3
    resumed = train(run_config(out, max_steps=4, **SAVING))  # resume_from_checkpoint unset
    assert resumed.step_losses == pytest.approx(straight.step_losses[2:], abs=1e-6)
    assert any("resuming from checkpoint-2" in r.getMessage() for r in caplog.records)
    with pytest.raises(TunesmithError, match="already holds a run"):
        train(run_config(out, max_steps=4, resume_from_checkpoint=False))


def test_a_diverging_run_stops_after_max_bad_steps_and_keeps_its_checkpoint(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(TunesmithError, match="diverged"):
        train(run_config(out, max_steps=40, learning_rate=1e3, skip_nonfinite=True, max_bad_steps=3,
                         save_strategy="steps", save_steps=1))
    assert ckpt.list_checkpoints(out)  # the checkpoints written before it diverged are still there
    summary = out / "train_summary.json"
    assert not summary.exists()  # no final model pretends the run finished


def test_a_run_with_skip_bad_samples_lists_the_skipped_records_in_its_output_dir(tmp_path):
    rows = [{"instruction": f"What is {i} + 1?", "output": str(i + 1)} for i in range(8)]
    rows[3] = {"instruction": "no answer here"}  # an sft record without a response
    (tmp_path / "d.json").write_text(json.dumps(rows))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"d": {"file_name": "d.json"}}))
    out = tmp_path / "o"
    train(run_config(out, dataset="d", dataset_dir=str(tmp_path), max_steps=1, skip_bad_samples=True))
    listed = [json.loads(line) for line in (out / "skipped_records.jsonl").read_text().splitlines()]
    assert len(listed) == 1 and listed[0]["dataset"] == "d" and listed[0]["index"] == 3


@pytest.mark.parametrize("mistake", [dict(finetuning_type="freeze", freeze_trainable_layers=0),
                                     dict(finetuning_type="freeze", use_llama_pro=True, freeze_trainable_layers=4)])
def test_overwrite_output_dir_keeps_the_earlier_run_when_the_new_config_is_refused(tmp_path, mistake):
    """The earlier run goes only once set-up has passed every check (some need the model or the data)."""
    out = tmp_path / "o"
    train(run_config(out, max_steps=2, **SAVING))
    before, saved = sorted(p.name for p in out.iterdir()), (out / "tunesmith_config.yaml").read_text()
    with pytest.raises(ConfigError):
        train(run_config(out, max_steps=2, overwrite_output_dir=True, **mistake))
    assert sorted(p.name for p in out.iterdir()) == before
    assert (out / "tunesmith_config.yaml").read_text() == saved


def test_a_failed_resume_leaves_the_saved_config_as_it_was(tmp_path):
    out = tmp_path / "o"
    train(run_config(out, max_steps=4, **SAVING))
    saved = (out / "tunesmith_config.yaml").read_text()
    weights = next(p for p in sorted((out / "checkpoint-2").rglob("*.safetensors")))
    weights.write_bytes(weights.read_bytes()[:-8] + b"tampered")
    with pytest.raises(TunesmithError):
        train(run_config(out, max_steps=4, learning_rate=2e-3, resume_from_checkpoint=str(out / "checkpoint-2"),
                         resume_allow_changes=["learning_rate"]))
    assert (out / "tunesmith_config.yaml").read_text() == saved


def test_an_allowed_learning_rate_change_takes_effect_at_resume(tmp_path):
    """The resumed steps follow the new rate's schedule (the checkpoint's schedule held the old base rate)."""
    out, fresh = tmp_path / "o", tmp_path / "fresh"
    common = dict(lr_scheduler_type="linear", max_steps=4)
    train(run_config(out, learning_rate=1e-3, **common, **SAVING))
    train(run_config(out, learning_rate=2e-3, resume_from_checkpoint=str(out / "checkpoint-2"),
                     resume_allow_changes=["learning_rate"], **common))
    train(run_config(fresh, learning_rate=2e-3, **common))
    resumed = {r["step"]: r["lr"] for r in _rows(out) if "lr" in r}
    straight = {r["step"]: r["lr"] for r in _rows(fresh) if "lr" in r}
    assert [resumed[s] for s in (3, 4)] == pytest.approx([straight[s] for s in (3, 4)])


def test_keys_an_older_tunesmith_did_not_save_are_unchanged_at_their_defaults(tmp_path):
    from tunesmith.config.schema import RunConfig
    from tunesmith.train.resume import check_config

    current = RunConfig().flat()
    older = {k: v for k, v in current.items() if k not in ("quantization_type", "load_best_model_at_end")}
    (tmp_path / "trainer_state.json").write_text(json.dumps({"config": older}))
    assert check_config(tmp_path, current, []) == {}
    with pytest.raises(ConfigError, match="load_best_model_at_end: None -> True"):
        check_config(tmp_path, {**current, "load_best_model_at_end": True}, [])
