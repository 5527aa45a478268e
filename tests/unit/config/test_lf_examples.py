"""LLaMA-Factory's own example YAMLs (tests/fixtures/llamafactory/examples, pinned) as the test corpus.

Every train config there passes build_config, or fails only with the refusals listed in REFUSED: each
names a feature tunesmith does not have and what to use instead. No config may get an "unknown key".
Validation needs neither the model nor the data files; DeepSpeed paths, which LLaMA-Factory writes
relative to its own root, are resolved against the fixture folder.
"""

import importlib.util
import logging
from pathlib import Path

import pytest
import yaml

from tunesmith.config import load
from tunesmith.config.load import build_config, deepspeed_installed
from tunesmith.errors import ConfigError

LF_ROOT = Path(__file__).resolve().parents[2] / "fixtures" / "llamafactory"
EXAMPLES = LF_ROOT / "examples"

# Not `llamafactory-cli train` configs, so not for build_config.
NOT_TRAIN = {
    "accelerate": "Accelerate launcher configs (accelerate launch --config_file)",
    "ktransformers/accelerate": "Accelerate launcher configs for KTransformers",
    "merge_lora": "export configs (llamafactory-cli export)",
    "inference": "chat configs (llamafactory-cli chat)",
    "v1": "LLaMA-Factory v1's nested config format (USE_V1=1), not its train arguments",
    "extras/multi_tokens/tokens_cfg.yaml": "a new_special_tokens_config file (token: description)",
    "extras/nlg_eval": "batch prediction (do_predict), which `tunesmith train` routes to predict_options",
}

_MEGATRON = "needs the Megatron-Core engine: set backend: megatron (or run with USE_MCA=1)"
# QLoRA runs with bitsandbytes (in the dev extras); without it, its examples are refused with the install line
_QLORA = ([] if importlib.util.find_spec("bitsandbytes")
          else ["quantization_bit needs bitsandbytes: pip install 'tunesmith[qlora]'"])
_KT = "KTransformers (CPU MoE experts) is not available; use backend: fsdp2 with fsdp_offload"

# file -> substrings: every problem of the file contains one of them, and each of them is in some problem.
_MOSS_VL = "template: Template 'moss_vl' is for MOSS-VL models, whose code is remote (trust_remote_code)"

REFUSED = {
    "train_full/mossvl_full_sft.yaml": [_MOSS_VL],
    "train_lora/mossvl_lora_sft.yaml": [_MOSS_VL],
    **({} if importlib.util.find_spec("adam_mini") else {"extras/adam_mini/qwen2_full_sft.yaml": [
        "use_adam_mini needs the adam-mini package: pip install 'tunesmith[adam-mini]'"]}),
    "extras/fp8/llama3_fp8_deepspeed_sft.yaml": ["'fp8' = True: FP8 training is not available; use bf16: true"],
    "extras/fp8/llama3_fp8_fsdp_sft.yaml": [
        "'fp8' = True: FP8 training is not available; use bf16: true",
        "'fp8_enable_fsdp_float8_all_gather' = True: FP8 training is not available",
        "'fsdp' = ['full_shard', 'auto_wrap']: HF Trainer-style FSDP settings are not read; use backend: fsdp2",
        "'fsdp_transformer_layer_cls_to_wrap' = 'LlamaDecoderLayer': HF Trainer-style FSDP settings",
    ],
    **({"extras/fsdp_qlora/llama3_lora_sft.yaml": _QLORA, "train_qlora/qwen3_lora_sft_bnb_npu.yaml": _QLORA,
        "train_qlora/qwen3_lora_sft_otfq.yaml": _QLORA} if _QLORA else {}),
    "extras/mod/llama3_full_sft.yaml": ["'mixture_of_depths' = 'convert': mixture-of-depths is not available",
                                        *(["needs the bitsandbytes package"] if _QLORA else [])],
    **({"extras/qoft/llama3_oft_sft_bnb_npu.yaml": _QLORA} if _QLORA else {}),
    "ktransformers/train_lora/deepseek_v2_lora_sft_kt.yaml": ["'use_kt' = True: " + _KT],
    "ktransformers/train_lora/deepseek_v3_int8_lora_sft_kt.yaml": [_KT],
    "ktransformers/train_lora/deepseek_v3_lora_sft_kt.yaml": [_KT],
    "ktransformers/train_lora/qwen3_5moe_lora_sft_kt.yaml": [_KT],
    "ktransformers/train_lora/qwen3moe_lora_sft_kt.yaml": ["'use_kt' = True: " + _KT],
    "ktransformers/train_lora/qwen3vlmoe_lora_sft_kt.yaml": [_KT],
    # run without USE_MCA=1 (test_megatron_examples_with_use_mca checks them with it)
    "megatron/qwen2_vl_full.yaml": ["'tensor_model_parallel_size' = 4 " + _MEGATRON,
                                    "'pipeline_model_parallel_size' = 2 " + _MEGATRON, _MEGATRON],
    "megatron/qwen3_moe_full.yaml": ["'pipeline_model_parallel_size' = 4 " + _MEGATRON,
                                     "'expert_model_parallel_size' = 2 " + _MEGATRON, _MEGATRON],
}


def _excluded(rel: str) -> bool:
    return any(rel == part or rel.startswith(part + "/") for part in NOT_TRAIN)


ALL_YAMLS = sorted(p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("*.yaml"))
TRAIN_YAMLS = [rel for rel in ALL_YAMLS if not _excluded(rel)]


def _validate(rel: str):
    data = yaml.safe_load((EXAMPLES / rel).read_text(encoding="utf-8"))
    overrides = {}
    if data.get("deepspeed"):  # LLaMA-Factory writes it relative to its own root
        overrides["deepspeed"] = str(LF_ROOT / data["deepspeed"])
    return build_config(EXAMPLES / rel, overrides)


def test_the_corpus_is_all_there():
    assert len(TRAIN_YAMLS) >= 50
    for folder in ("train_full", "train_lora", "train_qlora", "extras", "megatron", "megatron_bridge", "ascend"):
        assert any(rel.startswith(folder + "/") for rel in TRAIN_YAMLS), folder
    for part in NOT_TRAIN:
        assert (EXAMPLES / part).exists(), f"NOT_TRAIN names {part}, which is not in the fixtures"
    assert set(REFUSED) <= set(TRAIN_YAMLS), set(REFUSED) - set(TRAIN_YAMLS)


@pytest.mark.parametrize("rel", TRAIN_YAMLS)
def test_example_is_accepted_or_refused_by_name(rel):
    expected = list(REFUSED.get(rel, []))
    if not deepspeed_installed():
        expected.append("backend deepspeed needs DeepSpeed")
    try:
        _validate(rel)
        problems = []
    except ConfigError as err:
        problems = err.problems
    assert not [p for p in problems if "unknown key" in p], problems
    unexpected = [p for p in problems if not any(s in p for s in expected)]
    assert unexpected == [], f"{rel}: not a listed refusal: {unexpected}"
    if rel in REFUSED:
        missing = [s for s in REFUSED[rel] if not any(s in p for p in problems)]
        assert missing == [], f"{rel}: expected refusal missing: {missing}"


def test_accepted_examples_keep_their_settings():
    cfg = _validate("train_full/qwen3_full_sft.yaml")
    assert cfg.finetune.finetuning_type == "full" and cfg.train.wants_deepspeed
    assert cfg.data.dataset == ["identity", "alpaca_en_demo"] and cfg.train.gradient_accumulation_steps == 2
    # mossvl's keys (use_reentrant_gc: false, gradient_checkpointing_kwargs) pass; its template is refused by name
    cfg = build_config(EXAMPLES / "train_full/mossvl_full_sft.yaml",
                       {"template": "auto", "deepspeed": str(LF_ROOT / "examples/deepspeed/ds_z3_config.json")})
    assert cfg.model.gradient_checkpointing is True
    # Megatron Bridge's keys at values that need no Megatron feature (sizes 1, its defaults) change nothing
    cfg = _validate("megatron_bridge/llama3_sft.yaml")
    assert cfg.train.max_steps == 1000 and cfg.finetune.finetuning_type == "lora"


def test_the_batch_prediction_example_is_accepted_as_it_is():
    from tunesmith.infer.options import predict_options

    flat = yaml.safe_load((EXAMPLES / "extras/nlg_eval/llama3_lora_predict.yaml").read_text(encoding="utf-8"))
    options = predict_options(flat)
    assert options.predict.eval_dataset == ["identity", "alpaca_en_demo"] and options.predict.max_samples == 50
    assert options.model.adapter_name_or_path == ["saves/llama3-8b/lora/sft"] and options.model.template == "llama3"


def test_megatron_examples_with_use_mca(monkeypatch):
    """As LLaMA-Factory's users run them: USE_MCA=1 selects the engine and its keys are honoured; the degrees are
    checked against the model and world size when the engine is built (engines/megatron/degrees.py)."""
    monkeypatch.setenv("USE_MCA", "1")
    cfg = _validate("megatron/qwen3_moe_full.yaml")
    assert cfg.train.backend == "megatron" and cfg.megatron.pipeline_model_parallel_size == 4
    assert cfg.megatron.expert_model_parallel_size == 2 and cfg.megatron.moe_token_dispatcher_type == "alltoall"
    assert cfg.megatron.recompute_granularity == "full" and cfg.megatron.moe_grouped_gemm is True
    cfg = _validate("megatron/qwen2_vl_full.yaml")
    assert cfg.megatron.tensor_model_parallel_size == 4 and cfg.megatron.sequence_parallel is True


ISSUE_YAML = """\
### model
model_name_or_path: Qwen/Qwen3-4B-Instruct-2507
trust_remote_code: true
enable_liger_kernel: true
disable_gradient_checkpointing: true

### method
stage: sft
do_train: true
finetuning_type: full

### dataset
dataset: glaive_toolcall_en_demo  # sharegpt
template: qwen3_nothink
cutoff_len: 4096
neat_packing: true
preprocessing_num_workers: 16
dataloader_num_workers: 4

### output
output_dir: saves/qwen3-4b/full/sft
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true
report_to: none

### train
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-5
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
ddp_timeout: 180000000
include_effective_tokens_per_second: true
include_num_input_tokens_seen: true
dataloader_pin_memory: true
"""


def test_issue_12_full_sft_yaml(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(load, "_check_liger", lambda: [])  # validation only: liger-kernel need not be installed
    path = tmp_path / "issue12.yaml"
    path.write_text(ISSUE_YAML, encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        cfg = build_config(path)
    assert cfg.model.gradient_checkpointing is False
    assert cfg.model.enable_liger_kernel and cfg.data.neat_packing and cfg.packing
    assert cfg.data.dataset == ["glaive_toolcall_en_demo"] and cfg.finetune.finetuning_type == "full"
    lines = [r.getMessage() for r in caplog.records if "without effect" in r.getMessage()]
    assert lines == ["accepted without effect: include_effective_tokens_per_second, include_num_input_tokens_seen, "
                     "dataloader_pin_memory"]
