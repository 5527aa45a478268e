"""DPO on a random-initialised Qwen3-1.7B-shaped model, 20 steps, reference log-probs precomputed.

    python benchmarks/dpo_bench.py --work /tmp/dpo [key=value ...]     # extra keys go to `tunesmith train`

Prints one JSON line: training tokens/s (chosen + rejected tokens), step time, peak memory, and the time of the
one reference pass before training.
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
from vlm_sft import TEXT, WORDS

YAML = "benchmarks/configs/qwen3_1p7b_dpo.yaml"


def build_model(folder: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from tunesmith.models.tiny import build_tiny

    tiny = build_tiny("qwen3")
    config = AutoConfig.from_pretrained(tiny)
    for key, value in TEXT.items():
        setattr(config, key, value)
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(folder)


def make_pairs(folder: Path, num: int) -> None:
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)

    def words(lo, hi):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    rows = [{"instruction": words(40, 120), "chosen": words(150, 400), "rejected": words(150, 400)} for _ in range(num)]
    (folder / "pairs.json").write_text(json.dumps(rows))
    (folder / "dataset_info.json").write_text(json.dumps({"bench_pairs": {
        "file_name": "pairs.json", "ranking": True,
        "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}}}))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", default="/tmp/dpo")
    parser.add_argument("--pairs", type=int, default=160)
    parser.add_argument("--name", default="run")
    args, extra = parser.parse_known_args()
    work = Path(args.work)
    if not (work / "model" / "config.json").exists():
        build_model(work / "model")
    if not (work / "data" / "dataset_info.json").exists():
        make_pairs(work / "data", args.pairs)
    out = work / f"out-{args.name}"
    cmd = [sys.executable, "-m", "tunesmith", "train", YAML, f"model_name_or_path={work / 'model'}",
           f"dataset_dir={work / 'data'}", f"output_dir={out}", *extra]
    started = time.time()
    proc = run_child(cmd, env={**os.environ, "TUNESMITH_LOG_LEVEL": "INFO"})
    if proc.returncode != 0:
        return proc.returncode
    summary = json.loads((out / "train_summary.json").read_text())
    summary["step_seconds"] = summary["train_seconds"] / max(summary["global_step"], 1)
    print("RESULT " + json.dumps({"name": args.name, "extra": extra, "end_to_end_s": time.time() - started, **summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
