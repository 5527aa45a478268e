import pytest
import yaml

from tunesmith.config.load import build_config, parse_cli_items, save_config
from tunesmith.errors import ConfigError


def test_cli_items_yaml_keyvalue_and_flags():
    path, over = parse_cli_items(["cfg.yaml", "learning_rate=1e-4", "--dataset", "a,b", "--packing", "--cutoff_len=512"])
    assert path == "cfg.yaml"
    assert over == {"learning_rate": "1e-4", "dataset": "a,b", "packing": True, "cutoff_len": 512}


def test_yaml_then_overrides_win(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("dataset: identity\nlearning_rate: 1.0e-3\nstage: pt\n")
    cfg = build_config(cfg_file, {"learning_rate": "2e-4"})
    assert cfg.train.learning_rate == pytest.approx(2e-4)
    assert cfg.data.dataset == ["identity"]
    assert cfg.packing is True  # default for pt


def test_packing_default_off_for_sft_and_neat_packing_turns_it_on():
    assert build_config(None, {"dataset": "x"}).packing is False
    assert build_config(None, {"dataset": "x", "neat_packing": True}).packing is True


def test_all_problems_reported_at_once_with_suggestions():
    with pytest.raises(ConfigError) as info:
        build_config(None, {"datset": "x", "learning_rate": "fast", "tensor_model_parallel_size": 2,
                            "stage": "ppo", "bf16": True, "fp16": True})
    problems = info.value.problems
    text = "\n".join(problems)
    assert "did you mean 'dataset'" in text
    assert "'learning_rate' = 'fast'" in text
    assert "needs the Megatron-Core engine: set backend: megatron" in text
    assert "'stage' = 'ppo': PPO with a value model is not available yet; use stage: grpo" in text
    assert len(problems) >= 4


def test_wrong_type_names_key_and_value():
    with pytest.raises(ConfigError, match="'cutoff_len' = 'long'"):
        build_config(None, {"dataset": "x", "cutoff_len": "long"})


def test_missing_dataset_and_eval_without_data():
    with pytest.raises(ConfigError) as info:
        build_config(None, {"eval_strategy": "steps"})
    text = str(info.value)
    assert "no training data" in text and "needs val_size or eval_dataset" in text


@pytest.mark.parametrize("overrides, problem", [
    ({"finetuning_type": "full", "adapter_name_or_path": "/runs/lora"}, "an adapter is loaded only for finetuning_type: "
                                                                         "lora or oft, not full"),
    ({"finetuning_type": "freeze", "adapter_name_or_path": "/runs/lora"}, "lora or oft, not freeze"),
    ({"stage": "pt", "train_on_prompt": True}, "train_on_prompt: only the SFT stage chooses"),
    ({"stage": "dpo", "mask_history": True}, "mask_history: only the SFT stage chooses"),
])
def test_what_llamafactory_refuses_is_refused(overrides, problem):
    """An adapter under full or freeze fine-tuning would be ignored, and label choices outside SFT do nothing:
    LLaMA-Factory's parser refuses both, and so does tunesmith, naming the key."""
    with pytest.raises(ConfigError, match=problem):
        build_config(None, {"dataset": "x", **overrides})
    assert build_config(None, {"dataset": "x", "adapter_name_or_path": "/runs/lora", "mask_history": True})


def test_use_mca_env_selects_megatron(monkeypatch):
    monkeypatch.setenv("USE_MCA", "1")
    assert build_config(None, {"dataset": "x"}).train.backend == "megatron"  # LoRA, the default, runs there too
    with pytest.raises(ConfigError, match="finetuning_type: freeze is not available on backend: megatron"):
        build_config(None, {"dataset": "x", "finetuning_type": "freeze"})


def test_saved_config_redacts_secrets(tmp_path):
    cfg = build_config(None, {"dataset": "x", "swanlab_api_key": "sk-secret-123"})
    save_config(cfg, tmp_path / "c.yaml")
    text = (tmp_path / "c.yaml").read_text()
    assert "sk-secret-123" not in text
    assert yaml.safe_load(text)["swanlab_api_key"] == "<redacted>"


def test_llamafactory_style_yaml_is_accepted(tmp_path):
    text = """
model_name_or_path: Qwen/Qwen3-1.7B
trust_remote_code: true
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
dataset: identity,alpaca_demo
template: qwen3_nothink
cutoff_len: 2048
max_samples: 1000
overwrite_cache: true
preprocessing_num_workers: 16
dataloader_num_workers: 4
output_dir: saves/qwen3-1.7b/lora/sft
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true
save_only_model: false
report_to: none
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
ddp_timeout: 180000000
resume_from_checkpoint: null
"""
    path = tmp_path / "lf.yaml"
    path.write_text(text)
    cfg = build_config(path)
    assert cfg.finetune.lora_target == ["all"]
    assert cfg.data.dataset == ["identity", "alpaca_demo"]
    assert cfg.train.gradient_accumulation_steps == 8


def test_cross_checks_still_run_when_a_key_is_invalid():
    with pytest.raises(ConfigError) as info:
        build_config(None, {"dataset": "x", "cutoff_len": 2, "bf16": True, "fp16": True})
    text = str(info.value)
    assert "cutoff_len" in text and "bf16 and fp16" in text


def test_interleave_probs_accepts_llamafactory_string():
    cfg = build_config(None, {"dataset": "a,b", "mix_strategy": "interleave_under", "interleave_probs": "0.7,0.3"})
    assert cfg.data.interleave_probs == [0.7, 0.3]


def test_unquoted_no_strategy_means_no(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("dataset: x\nsave_strategy: no\neval_strategy: no\n")
    cfg = build_config(path)
    assert cfg.output.save_strategy == "no" and cfg.train.eval_strategy == "no"


def test_torch_compile_with_liger_is_accepted(monkeypatch):
    """The compiled blocks fuse what Liger's block kernels would (models.load leaves those out); the fused
    linear + cross-entropy still comes with enable_liger_kernel."""
    from tunesmith.config import load

    monkeypatch.setattr(load, "_check_liger", lambda: [])  # liger-kernel itself is not needed to validate
    cfg = build_config(None, {"dataset": "x", "enable_liger_kernel": True, "torch_compile": True})
    assert cfg.train.torch_compile and cfg.model.enable_liger_kernel


@pytest.mark.parametrize("settings, fragment", [
    ({"num_generations": 1}, "a group of one always gets 0"),
    ({"temperature": 0}, "temperature: 0 is greedy"),
    ({"stage": "reinforce", "ppo_epochs": 2}, "strictly on-policy"),
    ({"policy_loss": "reinforce", "num_mini_batches": 2}, "strictly on-policy"),
])
def test_online_rl_settings_that_cannot_train_are_refused(settings, fragment):
    from tunesmith.config.resolve import resolve

    cfg = build_config(None, {"dataset": "x", "stage": "grpo", **settings})
    with pytest.raises(ConfigError, match=fragment):
        resolve(cfg)


def test_online_rl_sampling_that_trains_is_accepted():
    from tunesmith.config.resolve import resolve

    resolved = resolve(build_config(None, {"dataset": "x", "stage": "reinforce", "num_generations": 2}))
    assert resolved.rl.ppo_epochs == 1 and resolved.rl.policy_loss == "reinforce"


@pytest.mark.parametrize("settings, warned", [
    ({"stage": "dpo", "kto_chosen_weight": 2.0, "num_generations": 4}, "['kto_chosen_weight', 'num_generations'] do "
     "not apply to stage: dpo"),
    ({"stage": "sft", "pref_beta": 0.2, "temperature": 0.95}, "['pref_beta'] do not apply to stage: sft"),
    ({"stage": "dpo", "pref_loss": "hinge", "pref_label_smoothing": 0.1, "simpo_gamma": 1.0},
     "['pref_label_smoothing', 'simpo_gamma'] do not apply to pref_loss: hinge"),
])
def test_keys_of_another_stage_or_loss_are_named_as_having_no_effect(settings, warned, caplog):
    with caplog.at_level("WARNING", logger="tunesmith"):
        build_config(None, {"dataset": "x", **settings})
    assert warned in caplog.text
    assert "temperature" not in caplog.text  # LLaMA-Factory YAMLs set the sampling keys for generation too


def test_keys_of_the_runs_own_stage_and_loss_raise_no_warning(caplog):
    with caplog.at_level("WARNING", logger="tunesmith"):
        build_config(None, {"dataset": "x", "stage": "dpo", "pref_loss": "simpo", "simpo_gamma": 1.0, "pref_beta": 2})
        build_config(None, {"dataset": "x", "stage": "grpo", "num_generations": 4, "kl_coef": 0.1})
    assert "no effect" not in caplog.text


def test_mask_history_with_train_on_prompt_is_refused():
    """As LLaMA-Factory: the two contradict each other."""
    with pytest.raises(ConfigError, match="mask_history and train_on_prompt are both true"):
        build_config(None, {"dataset": "x", "mask_history": True, "train_on_prompt": True})
