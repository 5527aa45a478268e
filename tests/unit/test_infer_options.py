"""Keys of `tunesmith chat` / `tunesmith export` / `tunesmith eval`, on LLaMA-Factory's own example YAMLs."""

import logging
from pathlib import Path

import pytest

from tunesmith.config.load import read_yaml
from tunesmith.errors import ConfigError
from tunesmith.infer.options import chat_options, export_options
from tunesmith.infer.reward import eval_config

LF = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "llamafactory" / "examples"


def problems(fn, flat) -> str:
    with pytest.raises(ConfigError) as err:
        fn(flat)
    return str(err.value)


@pytest.mark.parametrize("name", ["qwen3.yaml", "qwen3_full_sft.yaml", "qwen3_lora_sft.yaml", "qwen3vl.yaml"])
def test_lf_inference_yamls_are_read(name):
    opts = chat_options(read_yaml(LF / "inference" / name))
    assert opts.model.infer_backend == "huggingface" and opts.model.trust_remote_code is True
    assert opts.model.template.startswith("qwen3")
    if name == "qwen3_lora_sft.yaml":
        assert opts.model.model_name_or_path == "Qwen/Qwen3-4B-Instruct-2507"
        assert opts.model.adapter_name_or_path == ["saves/qwen3-4b/lora/sft"]


def test_lf_template_we_do_not_have_is_named():
    text = problems(chat_options, read_yaml(LF / "inference" / "mossvl.yaml"))
    assert "Template 'moss_vl' is for MOSS-VL models" in text and "template: auto" in text
    assert "Unknown template" not in text


@pytest.mark.parametrize("name", ["qwen3_lora_sft.yaml", "qwen3_full_sft.yaml", "qwen3vl_lora_sft.yaml"])
def test_lf_merge_yamls_are_read(name):
    opts = export_options(read_yaml(LF / "merge_lora" / name))
    assert opts.export.max_shard_size == "5GB"  # LF's export_size: 5 is in GB
    assert opts.export.export_device == "cpu" and opts.export.export_legacy_format is False
    assert opts.export.export_dir.startswith("saves/")


def test_lf_gptq_export_is_refused_with_the_alternative():
    text = problems(export_options, read_yaml(LF / "merge_lora" / "qwen3_gptq.yaml"))
    assert "'export_quantization_bit': quantized (GPTQ) export is not available" in text
    assert "export_quantization_dataset" in text


BASE = {"model_name_or_path": "tiny:qwen3"}


def test_vllm_backend_says_there_is_none_and_names_huggingface():
    for backend in ("vllm", "sglang"):
        text = problems(chat_options, {**BASE, "infer_backend": backend})
        assert f"infer_backend: {backend}" in text and "infer_backend: huggingface" in text
    assert "infer_backend: huggingface" in problems(chat_options, {**BASE, "vllm_maxlen": 4096})


def test_unknown_keys_get_a_did_you_mean_and_all_problems_come_at_once():
    text = problems(chat_options, {**BASE, "tempreature": 0.5, "adapter_name_or_pth": "x", "top_p": 3})
    assert "3 problem(s)" in text
    assert "unknown key 'tempreature'; did you mean 'temperature'?" in text
    assert "did you mean 'adapter_name_or_path'?" in text
    assert "'top_p' = 3" in text
    assert "unknown key 'zzz'; see `tunesmith export --help`" in problems(export_options, {**BASE, "export_dir": "o",
                                                                                            "zzz": 1})


def test_training_only_keys_are_refused_other_known_keys_only_warned(caplog):
    assert "'learning_rate' is a training key; `tunesmith chat` does not read it" in problems(
        chat_options, {**BASE, "learning_rate": 1e-4})
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        opts = chat_options({**BASE, "export_dir": "out", "dataset": "identity", "low_cpu_mem_usage": True})
    assert opts.model.model_name_or_path == "tiny:qwen3"
    warned = caplog.text
    assert "no effect on `tunesmith chat`" in warned
    assert "export_dir (a `tunesmith export` key)" in warned and "dataset (a training key)" in warned
    assert "low_cpu_mem_usage" in warned


def test_export_refusals_name_what_to_do():
    flat = {**BASE, "export_dir": "out"}
    assert "tunesmith writes safetensors only" in problems(export_options, {**flat, "export_legacy_format": True})
    hub = problems(export_options, {**flat, "export_hub_model_id": "me/model"})
    assert "does not upload" in hub and "hf upload <repo_id> <export_dir>" in hub
    assert "'export_dir' is required" in problems(export_options, dict(BASE))
    assert "'model_name_or_path' is required" in problems(chat_options, {})


@pytest.mark.parametrize("size, expected", [(5, "5GB"), ("5", "5GB"), ("2GB", "2GB"), ("500MB", "500MB"),
                                            (0.5, "500MB")])
def test_export_size_in_gb_or_a_size_string(size, expected):
    assert export_options({**BASE, "export_dir": "o", "export_size": size}).export.max_shard_size == expected


def test_adapters_need_lora_and_a_comma_list_is_several():
    opts = chat_options({**BASE, "adapter_name_or_path": "a, b", "finetuning_type": "lora"})
    assert opts.model.adapter_name_or_path == ["a", "b"]
    assert "adapter_name_or_path needs finetuning_type: lora" in problems(
        chat_options, {**BASE, "adapter_name_or_path": "a", "finetuning_type": "full"})


def test_lf_benchmark_eval_is_refused_naming_what_eval_does():
    text = problems(eval_config, {**BASE, "task": "mmlu_test", "n_shot": 5, "lang": "en", "save_dir": "x"})
    assert "task: mmlu_test" in text and "MMLU" in text
    assert "pairwise accuracy" in text and "lm-evaluation-harness" in text
    assert "no preference data" in problems(eval_config, dict(BASE))


def test_eval_takes_eval_dataset_and_batch_size():
    from conftest import DATA_DIR

    cfg, batch = eval_config({**BASE, "eval_dataset": "dpo_demo", "dataset_dir": str(DATA_DIR), "batch_size": 4,
                              "template": "chatml"})
    assert cfg.finetune.stage == "rm" and cfg.data.dataset == ["dpo_demo"] and batch == 4


def test_missing_or_wrong_adapter_folders_are_named(tmp_path):
    from tunesmith.errors import ModelError
    from tunesmith.infer.load import resolve_sources

    with pytest.raises(ModelError, match="adapter '.*nope' not found"):
        resolve_sources("tiny:qwen3", [str(tmp_path / "nope")])
    with pytest.raises(ModelError, match="holds no adapter_config.json"):
        resolve_sources("tiny:qwen3", [str(tmp_path)])
    with pytest.raises(ModelError, match="model 'saves/qwen3-4b/full/sft' not found"):
        resolve_sources("saves/qwen3-4b/full/sft")  # LLaMA-Factory's relative output path, not a hub id
