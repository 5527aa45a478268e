"""Vision-language SFT benchmark: a random-initialised Qwen3-VL-2B- or 8B-shaped model, llava-style synthetic data.

    python benchmarks/vlm_sft.py --work /tmp/vlm --samples 1000 [--shape 2b|8b] [key=value ...]
    (extra keys go to `tunesmith train`; with two GPUs visible it runs under torchrun, FSDP2 unless deepspeed=... is given)

Builds (once) the model folder and the dataset under --work, runs `tunesmith train` end to end in a subprocess,
and prints one JSON line: end-to-end seconds, training tokens/s, peak memory, and MFU with LLM and vision
FLOPs stated separately (formula in DESIGN.md: 6*N + 12*L*H*d_head*S per token, peak 989e12 bf16 FLOP/s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from child import run_child  # this folder is the script's: on sys.path

PEAK = 989e12
YAML = "benchmarks/configs/qwen3_vl_2b_sft.yaml"

# Qwen3-VL-2B-Instruct's shape: Qwen3-1.7B-like language model, 24-layer ViT with patch 16 and deepstack.
# Qwen3-VL-8B-Instruct's: Qwen3-8B-like language model (untied), 27-layer ViT of width 1152.
SHAPES = {
    "2b": (dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768),
           dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, patch_size=16, out_hidden_size=2048,
                deepstack_visual_indexes=[5, 11, 17], num_position_embeddings=2304)),
    "8b": (dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=32768),
           dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16, out_hidden_size=4096,
                deepstack_visual_indexes=[8, 16, 24], num_position_embeddings=2304)),
}
# Answer length in words: 2b as first measured (804 tokens per sample with our tokenizer); 8b sized to the
# issue's ~630 tokens per sample (about 250 of them image tokens).
ANSWER_WORDS = {"2b": (110, 440), "8b": (80, 300)}
TEXT, VISION = SHAPES["2b"]

WORDS = ("the shape image colour red blue green left right above below circle square triangle large small "
         "picture shows there is a on in of and with near far bright dark line chart bar value count").split()


def build_model(folder: Path, shape: str) -> None:
    """The shape's config and the tiny processor; 2b also writes random weights, 8b is built with random_init."""
    import torch
    from transformers import AutoConfig, AutoModelForMultimodalLM, AutoProcessor

    from tunesmith.models.tiny import build_tiny

    tiny = build_tiny("qwen3_vl")
    config = AutoConfig.from_pretrained(tiny)
    for key, value in TEXT.items():
        setattr(config.text_config, key, value)
    for key, value in VISION.items():
        setattr(config.vision_config, key, value)
    config.text_config.rope_parameters = {**config.text_config.rope_parameters, "mrope_section": [24, 20, 20]}
    config.tie_word_embeddings = TEXT["tie_word_embeddings"]
    processor = AutoProcessor.from_pretrained(tiny)
    processor.image_processor.size = {"shortest_edge": 56 * 56, "longest_edge": 1 << 21}
    processor.image_processor.patch_size = 16
    if shape == "8b":
        config.save_pretrained(folder)
        processor.save_pretrained(folder)
        return
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForMultimodalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)


def make_data(folder: Path, num: int, words: tuple[int, int]) -> None:
    """llava-style: one image of 336-672 px per side and an answer of 128-512 tokens per sample."""
    from PIL import Image, ImageDraw

    rng = random.Random(0)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(num):
        w, h = rng.randint(336, 672), rng.randint(336, 672)
        img = Image.new("RGB", (w, h), tuple(rng.randint(0, 255) for _ in range(3)))
        draw = ImageDraw.Draw(img)
        for _ in range(6):
            x, y = rng.randint(0, w - 40), rng.randint(0, h - 40)
            draw.ellipse([x, y, x + rng.randint(20, 200), y + rng.randint(20, 200)],
                         fill=tuple(rng.randint(0, 255) for _ in range(3)))
        name = f"images/{i:05d}.jpg"
        img.save(folder / name, quality=90)
        answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(*words)))
        rows.append({"messages": [{"role": "user", "content": "<image>Describe the picture in detail."},
                                  {"role": "assistant", "content": answer}], "images": [name]})
    (folder / "llava_like.json").write_text(json.dumps(rows))
    info = {"llava_like": {"file_name": "llava_like.json", "formatting": "sharegpt",
                           "columns": {"messages": "messages", "images": "images"},
                           "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                    "assistant_tag": "assistant"}}}
    (folder / "dataset_info.json").write_text(json.dumps(info))


def mfu(summary: dict, stats: dict, freeze_vision: bool, gpus: int) -> dict:
    """LLM: 6N + 12 L H d S per token (N without the input embedding). Vision: per patch, 2N forward only when
    frozen (6N when trained), attention over each image's own patches."""
    t = TEXT
    attn_mlp = t["num_hidden_layers"] * (t["hidden_size"] * t["head_dim"] * (2 * t["num_attention_heads"] +
                                                                            2 * t["num_key_value_heads"])
                                         + 3 * t["hidden_size"] * t["intermediate_size"])
    n_llm = attn_mlp + t["vocab_size"] * t["hidden_size"]  # lm_head does matmuls (tied input table excluded)
    seq = stats["tokens"] / stats["samples"]
    share = summary["train_tokens"] / stats["tokens"]  # runs shorter than an epoch see this share of the data
    llm = (6 * n_llm + 12 * t["num_hidden_layers"] * t["num_attention_heads"] * t["head_dim"] * seq) * summary["train_tokens"]
    v = VISION
    n_vis = v["depth"] * (4 * v["hidden_size"] ** 2 + 2 * v["hidden_size"] * v["intermediate_size"])
    patches = stats["image_tokens"] * 4
    per_patch = (2 if freeze_vision else 6) * n_vis
    attn_factor = 4 if freeze_vision else 12
    vision = share * (per_patch * patches + attn_factor * v["depth"] * v["hidden_size"] * stats["patches_sq_sum"])
    seconds = summary["train_seconds"] * gpus  # GPU-seconds: MFU is per GPU
    return {"gpus": gpus, "llm_tflops": llm / seconds / 1e12, "vision_tflops": vision / seconds / 1e12,
            "mfu_llm": llm / seconds / PEAK, "mfu_total": (llm + vision) / seconds / PEAK}


def data_stats(yaml_path: str, overrides: dict) -> dict:
    """Tokens, samples, image tokens and sum of squared patch counts of the run's (cached) tokenized data."""
    from tunesmith.config.load import build_config
    from tunesmith.data.pipeline import prepare_data
    from tunesmith.models.load import load_preprocessing

    cfg = build_config(yaml_path, overrides)
    tokenizer, _, media = load_preprocessing(cfg)
    data = prepare_data(cfg, tokenizer, media).train
    patches = [i["patches"] for plan in data["mm_plan"] for i in json.loads(plan)["images"]]
    return {"samples": len(data), "tokens": int(sum(data["length"])), "image_tokens": sum(patches) // 4,
            "patches_sq_sum": sum(p * p for p in patches)}


def _gpus() -> int:
    import torch

    return int(os.environ.get("NPROC_PER_NODE") or max(torch.cuda.device_count(), 1))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", default="/tmp/vlm")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--name", default="run")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="2b")
    parser.add_argument("--tiny", action="store_true", help="use tiny:qwen3_vl (a CPU check of this script)")
    args, extra = parser.parse_known_args()
    global TEXT, VISION
    TEXT, VISION = SHAPES[args.shape]
    work = Path(args.work)
    model_dir, data_dir = work / "model", work / "data"
    if args.tiny:
        from tunesmith.models.tiny import build_tiny

        model_dir = build_tiny("qwen3_vl")
    elif not (model_dir / "config.json").exists():
        t0 = time.time()
        build_model(model_dir, args.shape)
        print(f"built model in {time.time() - t0:.0f}s", flush=True)
    if not (data_dir / "dataset_info.json").exists():
        t0 = time.time()
        make_data(data_dir, args.samples, ANSWER_WORDS[args.shape])
        print(f"made data in {time.time() - t0:.0f}s", flush=True)
    out = work / f"out-{args.name}"
    overrides = {"model_name_or_path": str(model_dir), "dataset_dir": str(data_dir), "output_dir": str(out),
                 **({"random_init": "true"} if args.shape == "8b" and not args.tiny else {}),
                 **dict(item.split("=", 1) for item in extra)}
    cmd = [sys.executable, "-m", "tunesmith", "train", YAML, *(f"{k}={v}" for k, v in overrides.items())]
    t0 = time.time()
    proc = run_child(cmd, env={**os.environ, "TUNESMITH_LOG_LEVEL": "INFO"})
    end_to_end = time.time() - t0
    if proc.returncode != 0:
        return proc.returncode
    summary = json.loads((out / "train_summary.json").read_text())
    overrides.update(output_dir=str(work / "stats"), overwrite_output_dir="true")
    stats = data_stats(YAML, {k: __import__("yaml").safe_load(v) for k, v in overrides.items()})
    freeze_vision = overrides.get("freeze_vision_tower", "true") != "false"
    result = {"name": args.name, "shape": args.shape, "extra": extra, "end_to_end_s": end_to_end, **summary, **stats,
              **mfu(summary, stats, freeze_vision, _gpus())}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
