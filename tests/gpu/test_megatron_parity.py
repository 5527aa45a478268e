"""GPU: the Megatron engine at TP=PP=1 against the single engine, same Hugging Face initialisation and data,
20 optimiser steps of full SFT in bf16 (mixed precision): every step's loss within 1% relative.

A random-initialised Qwen3 of the 1.7B shape cut to 4 layers (hidden 2048, 16 heads, 8 KV heads, head_dim 128,
MLP 6144, vocabulary 151,936) with the tiny Qwen3 tokenizer, packed rows of 1024 tokens from alpaca_demo.
Skipped without CUDA or megatron-core. On the device machine:

    source .device-wheels/activate.sh && python -m pytest -q -s tests/gpu/test_megatron_parity.py

With MEGATRON_PARITY_OUT=<file.json> the per-step losses and timings are written there too.

The MoE test (`-k moe`) does the same with a random-initialised Qwen3-MoE: Qwen3-30B-A3B's attention and expert
shapes cut to 4 layers and 32 experts (top-8), its router load-balancing loss included (MEGATRON_PARITY_MOE_OUT).

The vision-language test does the same with a random-initialised Qwen3-VL: the Qwen3-VL-2B language shape cut
to 4 layers, a 4-block vision tower of its width (1024, 16 heads, 16-pixel patches, deepstack after blocks 1 and
2), on the shipped image demo with every part trained (MEGATRON_PARITY_VL_OUT for its report).
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")
# MEGATRON_PARITY_DRY_RUN=1: the same flow on the CPU with the tiny shape (checks the test itself, not the GPU)
DRY_RUN = os.environ.get("MEGATRON_PARITY_DRY_RUN") == "1"
if not (torch.cuda.is_available() or DRY_RUN):
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
SHAPE = {"hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 8,
         "head_dim": 128, "intermediate_size": 6144, "vocab_size": 151936, "max_position_embeddings": 40960,
         "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}
STEPS = int(os.environ.get("MEGATRON_PARITY_STEPS", "20"))
SHAPE["num_hidden_layers"] = int(os.environ.get("MEGATRON_PARITY_LAYERS", "4"))  # 28: the whole 1.7B shape
COMMON = ["dataset=alpaca_demo", f"dataset_dir={REPO / 'data'}", "template=chatml", "cutoff_len=1024",
          "neat_packing=true", "finetuning_type=full", "bf16=true", "per_device_train_batch_size=4",
          "gradient_accumulation_steps=2", f"max_steps={STEPS}", "learning_rate=1e-5", "warmup_steps=2",
          "logging_steps=1", "save_strategy=no", "save_final_model=false", "max_samples=400"]


def _init_model(folder: Path) -> Path:
    """The tiny Qwen3 folder (tokenizer, template) with the bigger shape, random weights saved once, so that both
    engines start from the same Hugging Face weights."""
    import transformers

    from tunesmith.models.tiny import build_tiny

    tiny = build_tiny("qwen3")
    shutil.copytree(tiny, folder)
    values = transformers.AutoConfig.from_pretrained(folder).to_dict()
    values.pop("layer_types", None)  # derived from num_hidden_layers again
    values.update(SHAPE if not DRY_RUN else {"num_hidden_layers": 4})  # 4 layers: 2 stages x 2 virtual stages
    config = transformers.Qwen3Config(**{k: v for k, v in values.items() if k != "model_type"})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


VL_TEXT = {k: v for k, v in SHAPE.items() if k not in ("rope_parameters", "max_position_embeddings")}
VL_TEXT.update(num_hidden_layers=4, rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                                     "mrope_section": [24, 20, 20], "mrope_interleaved": True})
VL_VISION = {"depth": 4, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16, "patch_size": 16,
             "out_hidden_size": 2048, "num_position_embeddings": 2304, "deepstack_visual_indexes": [1, 2]}
VL_COMMON = ["dataset=mllm_demo", f"dataset_dir={REPO / 'data'}", "cutoff_len=2048",
             "image_max_pixels=262144", "neat_packing=true", "finetuning_type=full",
             "freeze_vision_tower=false", "freeze_multi_modal_projector=false", "bf16=true",
             "per_device_train_batch_size=2", "gradient_accumulation_steps=2", f"max_steps={STEPS}",
             "learning_rate=1e-5", "warmup_steps=2", "logging_steps=1", "save_strategy=no", "save_final_model=false"]


def _init_vl_model(folder: Path) -> Path:
    """The tiny Qwen3-VL folder (tokenizer, processor, template) with the bigger shape and random weights."""
    import transformers

    from tunesmith.models.tiny import build_tiny

    shutil.copytree(build_tiny("qwen3_vl"), folder)
    config = transformers.AutoConfig.from_pretrained(folder)
    if not DRY_RUN:
        text = {**config.text_config.to_dict(), **VL_TEXT}
        text.pop("layer_types", None)
        config.text_config = type(config.text_config)(**text)
        config.vision_config = type(config.vision_config)(**{**config.vision_config.to_dict(), **VL_VISION})
        config.tie_word_embeddings = True
    torch.manual_seed(0)
    transformers.AutoModelForImageTextToText.from_config(config).save_pretrained(folder, safe_serialization=True)
    return folder


# Qwen3-30B-A3B's attention and expert shapes (hidden 2048, 32 heads, 4 KV heads, experts of 768, top-8 routing,
# renormalised), cut to 4 layers and 32 experts so that it builds and trains in seconds. Both spellings of the
# expert count: transformers 5.25 reads num_local_experts, 5.17 num_experts
MOE_SHAPE = {"hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 4,
             "head_dim": 128, "moe_intermediate_size": 768, "num_experts": 32, "num_local_experts": 32,
             "num_experts_per_tok": 8,
             "norm_topk_prob": True, "router_aux_loss_coef": 0.001, "vocab_size": 151936,
             "max_position_embeddings": 40960, "tie_word_embeddings": False,
             "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}


def _init_moe_model(folder: Path) -> Path:
    """The tiny Qwen3-MoE folder (tokenizer, template) with MOE_SHAPE and random weights saved once."""
    import transformers

    from tunesmith.models.tiny import build_tiny

    shutil.copytree(build_tiny("qwen3_moe"), folder)
    values = transformers.AutoConfig.from_pretrained(folder).to_dict()
    values.pop("layer_types", None)
    if not DRY_RUN:
        values.update(MOE_SHAPE)
    config = transformers.Qwen3MoeConfig(**{k: v for k, v in values.items() if k != "model_type"})
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)
    return folder


def _speed(out: Path) -> dict:
    """Tokens/s over the steps after the first two (compilation, allocator warm-up), and the peak memory."""
    rates = [r["tokens_per_s"] for r in _rows(out) if "tokens_per_s" in r and "loss" in r][2:]  # logging_steps=1
    summary = json.loads((out / "train_summary.json").read_text())
    return {"tokens_per_s": sum(rates) / max(len(rates), 1), "peak_memory_gib": summary.get("peak_memory_gib")}


def _train(model: Path, out: Path, *extra, env=None, common=COMMON) -> tuple[list[float], float]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tunesmith", "train", f"model_name_or_path={model}", *common,
                           f"output_dir={out}", *extra], cwd=REPO, capture_output=True, text=True, timeout=400,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [r["loss"] for r in _rows(out) if "loss" in r], time.perf_counter() - started


def _compare(model: Path, tmp_path: Path, common: list, report_env: str, mega_extra=(), **facts) -> dict:
    """Both engines from the same folder and data (`mega_extra`: keys for the Megatron run only): every step's loss
    within 1% relative; the report to stdout and to the file named by `report_env`."""
    extra = ("max_steps=3", "bf16=false") if DRY_RUN else ()
    single, single_s = _train(model, tmp_path / "single", "backend=single", *extra, common=common)
    mega, mega_s = _train(model, tmp_path / "megatron", *extra, *mega_extra, env={"USE_MCA": "1"}, common=common)
    rel = [abs(a - b) / abs(b) for a, b in zip(mega, single)]
    aux = {name: [r["aux_loss"] for r in _rows(tmp_path / name) if "aux_loss" in r] for name in ("single", "megatron")}
    report = {"steps": STEPS, "single": single, "megatron": mega, "max_rel_diff": max(rel), "rel_diff": rel,
              **({"aux_loss": aux} if aux["single"] else {}),
              "single_seconds": single_s, "megatron_seconds": mega_s, **facts,
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (dry run)",
              "torch": torch.__version__,
              "single_speed": _speed(tmp_path / "single"), "megatron_speed": _speed(tmp_path / "megatron")}
    print(json.dumps(report))
    if os.environ.get(report_env):
        Path(os.environ[report_env]).write_text(json.dumps(report, indent=1))
    assert len(mega) == len(single) == (3 if DRY_RUN else STEPS)
    assert max(rel) < 0.01, rel
    return report


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_megatron_matches_the_single_engine_for_20_steps(tmp_path):
    _compare(_init_model(tmp_path / "qwen3_4l"), tmp_path, COMMON, "MEGATRON_PARITY_OUT",
             layers=SHAPE["num_hidden_layers"])


@pytest.mark.skipif(DRY_RUN, reason="recomputation needs CUDA (megatron-core saves CUDA RNG states)")
@pytest.mark.parametrize("granularity", ["full", "selective"])
def test_megatron_recompute_matches_the_single_engine_for_20_steps(tmp_path, granularity):
    """megatron-core's activation recomputation (`recompute_granularity`) changes memory, not the losses; the
    report (MEGATRON_PARITY_RECOMPUTE_OUT, one file per granularity) holds both engines' peak memory."""
    env = "MEGATRON_PARITY_RECOMPUTE_OUT"
    if os.environ.get(env):
        os.environ[f"{env}_{granularity}"] = os.environ[env].replace("{granularity}", granularity)
    _compare(_init_model(tmp_path / "qwen3_4l"), tmp_path, COMMON, f"{env}_{granularity}",
             mega_extra=(f"recompute_granularity={granularity}",), recompute_granularity=granularity,
             layers=SHAPE["num_hidden_layers"])


def test_megatron_qwen3_vl_matches_the_single_engine_for_20_steps(tmp_path):
    _compare(_init_vl_model(tmp_path / "qwen3_vl"), tmp_path, VL_COMMON, "MEGATRON_PARITY_VL_OUT", text=VL_TEXT,
             vision=VL_VISION)


def test_megatron_qwen3_moe_matches_the_single_engine_for_20_steps(tmp_path):
    """Routing and transformers' load-balancing loss on the Megatron engine (moe.py) against the single engine's
    Qwen3-MoE: every step's loss within 1%, and the logged aux_loss within 1% too."""
    report = _compare(_init_moe_model(tmp_path / "qwen3_moe"), tmp_path, COMMON, "MEGATRON_PARITY_MOE_OUT",
                      shape=MOE_SHAPE)
    ours, theirs = report["aux_loss"]["megatron"], report["aux_loss"]["single"]
    assert len(ours) == len(theirs) == len(report["single"])
    assert max(abs(a - b) / b for a, b in zip(ours, theirs)) < 0.01
