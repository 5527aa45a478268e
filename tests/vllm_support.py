"""A tiny Qwen3 (and Qwen3-VL) that vLLM's CPU build can run, for the vLLM tests and the CPU benchmark.

The shared tiny models (models/tiny/) have head_dim 16; vLLM's CPU attention takes 32 and up. This copies
tiny:qwen3 (its tokenizer, chat template, generation config) and writes a random-initialised model of the same
shape with head_dim 32, seeded, so every build gives the same bytes.

    python tests/vllm_support.py OUT_DIR      # writes the folder, prints its path
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HEAD_DIM = 32


def tiny_qwen3_for_vllm(out: Path, cache_dir: Path | None = None) -> Path:
    return tiny_for_vllm("qwen3", out, cache_dir)


def tiny_for_vllm(name: str, out: Path, cache_dir: Path | None = None) -> Path:
    """The shared tiny build `name` (qwen3, qwen3_vl) with its language model's head_dim raised to 32 (the
    multimodal RoPE sections scaled with it): tokenizer, processor and chat template copied as they are."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from tunesmith.models.tiny import build_tiny

    out = Path(out)
    if (out / "model.safetensors").exists():
        return out
    source = build_tiny(name, cache_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    config = AutoConfig.from_pretrained(source)
    text = getattr(config, "text_config", config)
    scale = HEAD_DIM // text.head_dim
    text.head_dim = HEAD_DIM
    rope = getattr(text, "rope_parameters", None) or {}
    if "mrope_section" in rope:
        rope["mrope_section"] = [s * scale for s in rope["mrope_section"]]
    torch.manual_seed(0)
    auto = AutoModelForImageTextToText if text is not config else AutoModelForCausalLM
    auto.from_config(config, dtype=torch.float32).save_pretrained(tmp)
    (tmp / "tunesmith_tiny.json").unlink(missing_ok=True)  # not the recipe of the shared tiny build any more
    tmp.rename(out)
    return out


if __name__ == "__main__":
    print(tiny_qwen3_for_vllm(Path(sys.argv[1])))
