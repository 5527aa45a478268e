"""GRPO on a random-initialised Qwen3-1.7B-shaped model, one GPU: G=8, 64 prompts per step, 512 new tokens.

    python benchmarks/grpo_bench.py --work /tmp/grpo [key=value ...]     # extra keys go to `tunesmith train`

Prints the per-step metrics the loop logs (generation tokens/s, training tokens/s, time split) as RESULT lines.
A random model never emits its stop token, so every response runs to max_new_tokens: the worst case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from dpo_bench import build_model

YAML = "benchmarks/configs/qwen3_1p7b_grpo.yaml"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", default="/tmp/grpo")
    args, extra = parser.parse_known_args()
    work = Path(args.work)
    if not (work / "model" / "config.json").exists():
        build_model(work / "model")
    out = work / "out"
    cmd = [sys.executable, "-m", "tunesmith", "train", YAML, f"model_name_or_path={work / 'model'}",
           f"output_dir={out}", *extra]
    proc = subprocess.run(cmd, env={**os.environ, "TUNESMITH_LOG_LEVEL": "INFO"})
    if proc.returncode != 0:
        return proc.returncode
    for line in (out / "metrics.jsonl").read_text().splitlines():
        print("RESULT " + line)
    summary = json.loads((out / "train_summary.json").read_text())
    print("SUMMARY " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
