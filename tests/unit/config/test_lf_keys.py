"""The LLaMA-Factory key table (config/lf_keys.py) and how build_config applies it."""

import dataclasses
import logging
import subprocess
import sys

import pytest

from tunesmith.config import load
from tunesmith.config.lf_key_kinds import HANDLINGS, refused_values
from tunesmith.config.lf_keys import LF_KEYS, SOURCES, counts
from tunesmith.config.lf_translate import translate
from tunesmith.config.load import KEY_TO_GROUP, build_config
from tunesmith.errors import ConfigError


def problems_of(overrides: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        build_config(None, {"dataset": "x", **overrides})
    return info.value.problems


def idle_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("accepted without effect")]


def test_every_entry_is_well_formed():
    assert set(counts()) == set(HANDLINGS) and sum(counts().values()) == len(LF_KEYS)
    for name, entry in LF_KEYS.items():
        assert entry.name == name and entry.source in SOURCES and entry.note.strip(), name
        if entry.handling == "honoured":
            assert name in KEY_TO_GROUP, f"{name} is honoured but tunesmith has no such key"
        elif entry.handling == "mapped":
            assert entry.to is not None
            assert all(t.strip() in KEY_TO_GROUP for t in entry.target.split("/")), (name, entry.target)
        else:
            # a tunesmith key of the same name is honoured (or mapped onto itself), never idle or refused
            assert name not in KEY_TO_GROUP, f"{name} is a tunesmith key but {entry.handling} here"


def test_refusals_say_what_to_do_instead():
    for name, entry in LF_KEYS.items():
        messages = [entry.note] if entry.handling == "refused" else list(refused_values(entry).values())
        for text in messages:
            assert "; " in text or text.split()[0] in ("give", "set", "use"), f"{name}: {text!r} names no alternative"


def test_every_hugging_face_training_argument_is_in_the_table():
    transformers = pytest.importorskip("transformers")
    names = {f.name for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments) if f.init}
    assert names - set(LF_KEYS) == set()


@pytest.mark.parametrize("overrides", [
    {"use_kt": False, "use_unsloth": False},
    {"quantization_device_map": "auto", "use_kt": False},
    {"push_to_hub": False, "hub_model_id": "me/model", "save_safetensors": True, "fp16": False},
    {"expert_tensor_parallel_size": 1, "recompute_method": None, "masked_softmax_fusion": False,
     "mixed_precision": "bf16_mixed"},
    {"fsdp": "", "fsdp_config": None, "gradient_checkpointing_kwargs": {"use_reentrant": False}},
])
def test_harmless_defaults_of_refused_features_are_accepted_without_effect(overrides, caplog):
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        cfg = build_config(None, {"dataset": "x", **overrides})
    assert cfg == build_config(None, {"dataset": "x"})
    lines = idle_lines(caplog)
    assert len(lines) == 1
    idle = set(lines[0].split(": ", 1)[1].split(", "))
    assert idle == set(overrides) - {"fp16"}  # fp16 is honoured: a tunesmith key, not an idle one


@pytest.mark.parametrize("key, value, says", [
    ("use_kt", True, "KTransformers (CPU MoE experts) is not available"),
    ("quantization_method", "hqq", "only bitsandbytes quantization is available; use quantization_method: bnb"),
    ("use_unsloth", True, "enable_liger_kernel: true"),
    ("masked_softmax_fusion", True, "not available in tunesmith's Megatron-Core engine (backend: megatron"),
    ("expert_tensor_parallel_size", 2, "not available in tunesmith's Megatron-Core engine"),
    ("push_to_hub", True, "upload output_dir yourself"),
    ("stage", "ppo", "PPO with a value model is not available yet; use stage: grpo"),
    ("pref_loss", "kto_pair", "use stage: kto"),
    ("optim", "adafactor", "use optim: adamw_torch"),
    ("streaming", True, "streaming datasets are not available yet"),
    ("fsdp", "full_shard auto_wrap", "use backend: fsdp2"),
    ("adapter_name_or_path", "a,b", "tunesmith loads one adapter"),
    ("save_steps", 0.1, "give a number of steps"),
])
def test_a_value_that_needs_a_missing_feature_is_refused_with_the_alternative(key, value, says):
    text = "\n".join(problems_of({key: value}))
    assert f"'{key}' = {value!r}: " in text and says in text


def test_refused_secret_values_are_redacted():
    text = "\n".join(problems_of({"hf_hub_token": "hf_secret_123", "ms_hub_token": "ms_secret_456"}))
    assert "hf_secret" not in text and "ms_secret" not in text
    assert "'hf_hub_token' = <redacted>: " in text and "HF_TOKEN" in text


def test_disable_gradient_checkpointing():
    assert build_config(None, {"dataset": "x", "gradient_checkpointing": True}).model.gradient_checkpointing
    off = build_config(None, {"dataset": "x", "disable_gradient_checkpointing": True})
    assert off.model.gradient_checkpointing is False
    # false is LF's default, often written out: it is "unset", and tunesmith's default (auto) or the user's
    # own gradient_checkpointing applies
    unset = build_config(None, {"dataset": "x", "disable_gradient_checkpointing": False})
    assert unset.model.gradient_checkpointing == "auto"
    assert unset == build_config(None, {"dataset": "x"})
    on = build_config(None, {"dataset": "x", "disable_gradient_checkpointing": False, "gradient_checkpointing": True})
    assert on.model.gradient_checkpointing is True
    text = "\n".join(problems_of({"disable_gradient_checkpointing": True, "gradient_checkpointing": True}))
    assert "means gradient_checkpointing: False, but gradient_checkpointing: True is also set; keep one" in text
    assert "expects true or false" in "\n".join(problems_of({"disable_gradient_checkpointing": "sometimes"}))


def test_mapped_keys_set_their_tunesmith_keys(monkeypatch):
    monkeypatch.setattr(load, "_check_liger", lambda: [])
    cfg = build_config(None, {"dataset": "x", "per_gpu_train_batch_size": 4, "dpo_label_smoothing": 0.1,
                              "warmup_steps": 0.05, "train_from_scratch": True, "use_liger_kernel": True,
                              "swanlab_run_name": "exp1", "sequence_packing": True})
    assert cfg.train.per_device_train_batch_size == 4
    assert cfg.finetune.pref_label_smoothing == pytest.approx(0.1)
    assert cfg.train.warmup_ratio == pytest.approx(0.05) and cfg.train.warmup_steps == 0
    assert cfg.model.random_init and cfg.model.enable_liger_kernel
    assert cfg.output.run_name == "exp1" and cfg.data.neat_packing and cfg.packing
    assert build_config(None, {"dataset": "x", "warmup_steps": 20}).train.warmup_steps == 20
    assert build_config(None, {"dataset": "x", "micro_batch_size": 2}).train.per_device_train_batch_size == 2


def test_two_mapped_keys_that_disagree_are_refused():
    text = "\n".join(problems_of({"per_gpu_train_batch_size": 4, "micro_batch_size": 2}))
    assert "both set per_device_train_batch_size, differently; keep one" in text
    same = build_config(None, {"dataset": "x", "per_gpu_train_batch_size": 2, "micro_batch_size": 2})
    assert same.train.per_device_train_batch_size == 2


def test_do_eval_needs_held_out_data_when_training():
    cfg = build_config(None, {"dataset": "x", "do_eval": True, "eval_strategy": "steps", "val_size": 0.1})
    assert cfg.train.eval_strategy == "steps" and cfg.train.do_eval
    assert any("do_eval: true evaluates after training on held-out data" in p
               for p in problems_of({"dataset": "x", "do_eval": True}))


def test_unknown_keys_still_get_a_did_you_mean():
    text = "\n".join(problems_of({"use_galor": True, "lora_rnak": 8, "disable_gradient_checkpoint": True}))
    assert "unknown key 'use_galor'; did you mean 'use_galore'?" in text
    assert "unknown key 'lora_rnak'; did you mean 'lora_rank'?" in text
    assert "did you mean 'disable_gradient_checkpointing'?" in text


def test_megatron_bridge_switch_in_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv("USE_MEGATRON_BRIDGE", "1")
    assert any(p.startswith("USE_MEGATRON_BRIDGE=1 selects the Megatron Bridge engine") and "backend: megatron" in p
               for p in problems_of({}))
    monkeypatch.setenv("USE_MEGATRON_BRIDGE", "0")
    build_config(None, {"dataset": "x"})


def test_use_mca_selects_the_megatron_engine(monkeypatch):
    monkeypatch.setenv("USE_MCA", "1")
    cfg = build_config(None, {"dataset": "x", "finetuning_type": "full", "tensor_model_parallel_size": 2})
    assert cfg.train.backend == "megatron" and cfg.megatron.tensor_model_parallel_size == 2
    assert any("USE_MCA=1 selects backend: megatron, but backend: fsdp2 is set" in p
               for p in problems_of({"backend": "fsdp2", "finetuning_type": "full"}))
    monkeypatch.setenv("USE_MCA", "0")
    assert build_config(None, {"dataset": "x"}).train.backend == "auto"
    assert build_config(None, {"dataset": "x", "use_mca": True, "finetuning_type": "full"}).train.backend == "megatron"


def test_megatron_keys_need_the_megatron_backend_and_its_stages():
    text = "\n".join(problems_of({"pipeline_model_parallel_size": 4, "use_distributed_optimizer": True}))
    assert "'pipeline_model_parallel_size' = 4 needs the Megatron-Core engine: set backend: megatron" in text
    assert "use_distributed_optimizer" not in text  # Megatron Bridge's default; no effect elsewhere
    text = "\n".join(problems_of({"backend": "megatron", "stage": "grpo", "finetuning_type": "lora"}))
    assert "stage grpo is not available on backend: megatron (it trains pt, sft, rm, dpo, kto)" in text
    assert "finetuning_type" not in text  # LoRA trains on the megatron linears
    text = "\n".join(problems_of({"backend": "megatron", "stage": "rm", "finetuning_type": "lora"}))
    assert "stage rm with finetuning_type: lora is not available on backend: megatron" in text
    text = "\n".join(problems_of({"backend": "megatron", "finetuning_type": "freeze"}))
    assert "finetuning_type: freeze is not available on backend: megatron" in text
    text = "\n".join(problems_of({"backend": "megatron", "finetuning_type": "lora", "use_dora": True,
                                  "additional_target": "embed_tokens", "loraplus_lr_ratio": 16}))
    assert "'use_dora' = True is not available with LoRA on backend: megatron" in text
    assert "loraplus_lr_ratio (LoRA+) is not available on backend: megatron" in text
    assert "'additional_target' = ['embed_tokens'] is not available with LoRA" in text
    text = "\n".join(problems_of({"backend": "megatron", "finetuning_type": "full", "gradient_checkpointing": True,
                                  "fp16": True, "torch_compile": True, "neftune_noise_alpha": 5,
                                  "rope_scaling": "yarn"}))
    assert "use recompute_granularity: full" in text and "use bf16: true" in text and "torch_compile" in text
    assert "neftune_noise_alpha (NEFTune) is not available on backend: megatron" in text
    assert "rope_scaling: yarn is not available on backend: megatron" in text
    build_config(None, {"dataset": "x", "backend": "megatron", "finetuning_type": "full", "rope_scaling": "llama3"})


def test_rope_scaling_stretches_to_cutoff_len_unless_given_and_keeps_rollouts_off_vllm():
    from tunesmith.config.load import build_config
    from tunesmith.config.resolve import RunFacts, resolve
    from tunesmith.errors import ConfigError

    given = {"dataset": "x", "cutoff_len": 8192, "rope_scaling": "linear"}
    assert resolve(build_config(None, given)).model.rope_max_length == 8192
    assert resolve(build_config(None, {**given, "rope_max_length": 32768})).model.rope_max_length == 32768
    assert resolve(build_config(None, {"dataset": "x"})).model.rope_max_length is None
    gpu = RunFacts(device_type="cuda", has_vllm=True)
    rl = {**given, "stage": "grpo", "reward_funcs": "format"}
    assert resolve(build_config(None, rl), gpu).rl.rollout_backend == "hf"
    with pytest.raises(ConfigError, match="rollout_backend: vllm with rope_scaling: vLLM.s engine"):
        resolve(build_config(None, {**rl, "rollout_backend": "vllm"}), gpu)


def test_translate_keeps_unknown_keys_for_the_caller():
    out = translate({"learning_rate": 1e-4, "no_such_key": 1, "dataloader_pin_memory": False})
    assert out.values == {"learning_rate": 1e-4, "no_such_key": 1}
    assert out.idle == ["dataloader_pin_memory"] and out.problems == []


def test_validation_imports_no_torch():
    code = ("import sys\nfrom tunesmith.config.load import build_config\n"
            "build_config(None, {'dataset': 'x', 'use_galore': False, 'disable_gradient_checkpointing': True, "
            "'include_num_input_tokens_seen': True, 'tensor_model_parallel_size': 1})\n"
            "print(sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_loraplus_outside_lora_and_a_conflict_inside_a_group_hide_no_other_problem():
    text = "\n".join(problems_of({"finetuning_type": "full", "loraplus_lr_ratio": 16}))
    assert "loraplus_lr_ratio (LoRA+) raises the learning rate of LoRA's B matrices" in text
    # the group's cross-key check drops one key: the group's other keys still meet their own checks
    text = "\n".join(problems_of({"stage": "dpo", "packing": True, "use_dft_loss": True, "use_eaft_loss": True}))
    assert "use_dft_loss and use_eaft_loss both weight the token loss" in text
    assert "stage dpo scores whole sequences and is not packed" in text


def test_best_model_and_early_stopping_need_evaluations_saved_with_them():
    base = {"load_best_model_at_end": True, "val_size": 0.1}
    text = "\n".join(problems_of({**base, "early_stopping_steps": 3}))
    assert "load_best_model_at_end and early_stopping_steps compare the run's evaluations: set eval_strategy" in text
    text = "\n".join(problems_of({**base, "eval_strategy": "steps", "eval_steps": 30, "save_steps": 100,
                                  "save_only_model": True}))
    assert "save_steps (100) must be a multiple of eval_steps (30)" in text and "save_only_model: false" in text
    text = "\n".join(problems_of({**base, "eval_strategy": "epoch"}))
    assert "save_strategy (steps) must be eval_strategy (epoch)" in text
    text = "\n".join(problems_of({"stage": "grpo", "reward_funcs": "format", "val_size": 0.1, "eval_strategy": "steps",
                                  "early_stopping_steps": 2}))
    assert "set metric_for_best_model: reward_mean" in text
    build_config(None, {"dataset": "x", **base, "eval_strategy": "steps", "eval_steps": 50, "save_steps": 100})
    build_config(None, {"dataset": "x", "do_train": False, "do_eval": True, "early_stopping_steps": 3})


def test_null_written_for_the_new_keys_is_their_default():
    nulls = {"quantization_bit": None, "quantization_method": None, "quantization_type": None,
             "double_quantization": None, "load_best_model_at_end": None, "rope_scaling": None}
    assert build_config(None, {"dataset": "x", **nulls}) == build_config(None, {"dataset": "x"})


def test_ray_keys_are_idle_and_use_ray_is_refused():
    """LLaMA-Factory reads ray_num_workers only under USE_RAY=1; without it both tools run torchrun."""
    from tunesmith.config.lf_translate import env_problems

    build_config(None, {"dataset": "x", "ray_num_workers": 4})
    assert any("USE_RAY=1 trains on a Ray cluster" in p for p in env_problems({"USE_RAY": "1"}))
    assert env_problems({}) == []
