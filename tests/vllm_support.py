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


def vllm_rollout_setup(folder, *, dtype: str, device: str, share: float, max_model_len: int, num_seqs: int):
    """The tiny model in `dtype` on `device`, a vLLM rollout engine of it, two prompts, the stop id and pad id."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tunesmith.rollout.backends import build_rollout

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device)
    rollout = build_rollout("vllm", model, media=False, world_size=1, vllm_args=lambda: {
        "model_path": str(folder), "dtype": dtype, "gpu_memory_utilization": share, "max_model_len": max_model_len,
        "seed": 0, "num_seqs": num_seqs})
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [tokenizer("What is 2 + 3?")["input_ids"], tokenizer("Say hi")["input_ids"]]
    return model, rollout, prompts, (tokenizer.convert_tokens_to_ids("<|im_end|>"),), tokenizer.pad_token_id


def check_weight_push(model, rollout, greedy, prompts, check_gap, *, scale: float, sleep_first: bool = False):
    """Perturb the model, push its weights: greedy output changes and `check_gap(out)` holds; restore and push
    again: the original output comes back (a push that does nothing fails here)."""
    import torch

    before = rollout.generate(prompts, greedy, 1)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    try:
        if sleep_first:
            rollout.sleep()  # as between steps: weights and KV cache freed, the push wakes the weights
        rollout.update_weights(model.state_dict().items())
        after = rollout.generate(prompts, greedy, 1)
        assert after.responses != before.responses
        check_gap(after)
    finally:
        model.load_state_dict(original)
        rollout.update_weights(model.state_dict().items())
    assert rollout.generate(prompts, greedy, 1).responses == before.responses


if __name__ == "__main__":
    print(tiny_qwen3_for_vllm(Path(sys.argv[1])))
