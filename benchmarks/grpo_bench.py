"""GRPO on a random-initialised Qwen3-1.7B-shaped model, one GPU: G=8, 64 prompts per step, 512 new tokens;
or, with --shape qwen3_vl_2b, a Qwen3-VL-2B-shaped one on image prompts (G=8, 64 prompts, 256 new tokens).

    python benchmarks/grpo_bench.py --work /tmp/grpo [--shape qwen3_vl_2b] [key=value ...]
    (extra keys go to `tunesmith train`)

Prints the per-step metrics the loop logs (generation tokens/s, training tokens/s, time split) as RESULT lines.
A random model never emits its stop token, so every response runs to max_new_tokens: the worst case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from child import run_child  # this folder is the script's: on sys.path
from dpo_bench import build_model

YAMLS = {"qwen3_1p7b": "benchmarks/configs/qwen3_1p7b_grpo.yaml",
         "qwen3_vl_2b": "benchmarks/configs/qwen3_vl_2b_grpo.yaml"}


def build(folder: Path, shape: str) -> None:
    if shape == "qwen3_vl_2b":
        from vlm_sft import build_model as build_vl

        build_vl(folder, "2b")
    else:
        build_model(folder)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", default="/tmp/grpo")
    parser.add_argument("--shape", choices=sorted(YAMLS), default="qwen3_1p7b")
    args, extra = parser.parse_known_args()
    work = Path(args.work)
    if not (work / "model" / "config.json").exists():
        build(work / "model", args.shape)
    out = work / "out"
    cmd = [sys.executable, "-m", "tunesmith", "train", YAMLS[args.shape], f"model_name_or_path={work / 'model'}",
           f"output_dir={out}", *extra]
    proc = run_child(cmd, env={**os.environ, "TUNESMITH_LOG_LEVEL": "INFO"})
    if proc.returncode != 0:
        return proc.returncode
    for line in (out / "metrics.jsonl").read_text().splitlines():
        print("RESULT " + line)
    summary = json.loads((out / "train_summary.json").read_text())
    print("SUMMARY " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
