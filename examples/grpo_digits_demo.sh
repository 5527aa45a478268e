#!/usr/bin/env bash
# bash examples/grpo_digits_demo.sh
# The GRPO learning demo on CPU (a few minutes): a tiny Qwen3-architecture model is SFT-warmed on sums of two
# digits, then GRPO (exact-match accuracy reward) trains it further; held-out accuracy is printed before
# (the evaluation at step 0) and after.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
PY=${PYTHON:-python3}
$PY -m tunesmith train model_name_or_path=tiny:qwen3 stage=sft dataset=digit_sums_sft template=qwen3_nothink \
  finetuning_type=full num_train_epochs=12 learning_rate=3e-3 lr_scheduler_type=cosine warmup_ratio=0.05 \
  per_device_train_batch_size=16 logging_steps=50 save_strategy=no output_dir=saves/digits-sft overwrite_output_dir=true
$PY -m tunesmith train examples/qwen3_grpo_digits.yaml overwrite_output_dir=true
$PY - <<'PY'
import json
rows = [json.loads(l) for l in open("saves/digits-grpo/metrics.jsonl")]
evals = [(r["step"], r["eval_reward_accuracy"]) for r in rows if "eval_reward_accuracy" in r]
print("held-out exact-match accuracy by step:", ", ".join(f"{s}: {a:.2f}" for s, a in evals))
PY
