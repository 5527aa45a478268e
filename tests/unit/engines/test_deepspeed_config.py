"""DeepSpeed configs: LLaMA-Factory-style JSON with "auto" values filled from our config (no deepspeed import)."""

import json

import pytest

from tunesmith.config.load import build_config
from tunesmith.engines.deepspeed_engine import ds_config
from tunesmith.errors import ConfigError
from tunesmith.config.resolve import RunFacts, resolve_backend

from conftest import REPO

EXAMPLES = REPO / "examples" / "deepspeed"


@pytest.fixture(autouse=True)
def _deepspeed_counts_as_installed(monkeypatch):
    """These tests check the config only; whether deepspeed is importable here does not matter."""
    monkeypatch.setattr("tunesmith.config.load.deepspeed_installed", lambda: True)


def _cfg(**flat):
    return build_config(None, {"dataset": "identity", **flat})


@pytest.mark.parametrize("name", ["ds_z0", "ds_z2", "ds_z2_offload", "ds_z3", "ds_z3_offload"])
def test_shipped_configs_fill_every_auto(name):
    cfg = _cfg(deepspeed=str(EXAMPLES / f"{name}.json"), per_device_train_batch_size=4, gradient_accumulation_steps=8,
               max_grad_norm=0.5, bf16=True)
    out = ds_config(cfg, "bf16", world=2, hidden_size=2048)
    assert "auto" not in json.dumps(out)
    assert out["train_batch_size"] == 4 * 8 * 2 and out["train_micro_batch_size_per_gpu"] == 4
    assert out["gradient_accumulation_steps"] == 8 and out["gradient_clipping"] == 0.5
    assert out["bf16"]["enabled"] is True and out["fp16"]["enabled"] is False
    assert out["managed_gradient_accumulation"] is False
    if name.startswith("ds_z3"):
        zero = out["zero_optimization"]
        assert zero["reduce_bucket_size"] == 2048 * 2048 and zero["stage3_param_persistence_threshold"] == 20480
    assert out.get("zero_force_ds_cpu_optimizer", True) is (not name.endswith("offload"))


def test_zero_stage_alone_selects_deepspeed_and_overrides_the_file():
    cfg = _cfg(zero_stage=1)
    assert resolve_backend(cfg, RunFacts()) == "deepspeed"
    assert ds_config(cfg, "fp32", world=1, hidden_size=64)["zero_optimization"]["stage"] == 1
    cfg = _cfg(deepspeed=str(EXAMPLES / "ds_z3.json"), zero_stage=2)
    assert ds_config(cfg, "bf16", world=1, hidden_size=64)["zero_optimization"]["stage"] == 2


def test_a_value_that_disagrees_with_the_run_is_named(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}))
    with pytest.raises(ConfigError, match='train_micro_batch_size_per_gpu = 2 .* disagrees .* "auto"'):
        ds_config(_cfg(deepspeed=str(path), per_device_train_batch_size=4), "bf16", world=1, hidden_size=64)


def test_an_optimizer_section_is_dropped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, "zero_optimization": {"stage": 2}}))
    out = ds_config(_cfg(deepspeed=str(path)), "bf16", world=1, hidden_size=64)
    assert "optimizer" not in out and "tunesmith builds AdamW" in caplog.text


def test_a_missing_deepspeed_is_a_clear_error(monkeypatch):
    monkeypatch.setattr("tunesmith.config.load.deepspeed_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"pip install 'tunesmith\[deepspeed\]'"):
        _cfg(zero_stage=2)


def test_bad_files_and_incompatible_keys_are_reported(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ds_config(_cfg(deepspeed=str(bad)), "bf16", world=1, hidden_size=64)
    with pytest.raises(ConfigError) as err:
        _cfg(deepspeed=str(tmp_path / "missing.json"), pure_bf16=True, skip_nonfinite=True)
    text = str(err.value)
    assert "missing.json does not exist" in text and "pure_bf16: true with backend deepspeed" in text
    assert "skip_nonfinite: true with backend deepspeed" in text
    with pytest.raises(ConfigError, match="backend is fsdp2"):
        _cfg(zero_stage=2, backend="fsdp2")


def test_a_frozen_reference_copy_under_zero3_is_refused_before_any_work():
    with pytest.raises(ConfigError, match="under ZeRO-3 cannot keep a frozen copy"):
        _cfg(stage="dpo", finetuning_type="full", deepspeed=str(EXAMPLES / "ds_z3.json"))
    _cfg(stage="dpo", finetuning_type="full", deepspeed=str(EXAMPLES / "ds_z3.json"), pref_reference="precomputed")
    _cfg(stage="dpo", finetuning_type="full", zero_stage=3, pref_loss="simpo")  # no reference at all
    _cfg(stage="dpo", finetuning_type="lora", zero_stage=3)  # adapters off
    _cfg(stage="dpo", finetuning_type="full", zero_stage=2)
