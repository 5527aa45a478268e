#!/usr/bin/env bash
# tunesmith train/chat on one GPU with the tiny models, plus benchmarks/gpu_checks.py.
# On the device machine: source .device-wheels/activate.sh && bash benchmarks/gpu_smoke.sh
set -euo pipefail
export HF_HUB_OFFLINE=1 TUNESMITH_CACHE=/tmp/tunesmith-cache
out=${OUT:-/tmp/out}
python -m tunesmith env
python -m tunesmith train examples/quickstart.yaml output_dir=/tmp/q bf16=true 2>&1 | tail -4
python -m tunesmith chat --model /tmp/q --prompt "Who are you?"
python -m tunesmith train examples/quickstart.yaml output_dir=/tmp/ql finetuning_type=lora lora_rank=16 \
  bf16=true enable_liger_kernel=true max_steps=60 packing=true 2>&1 | tail -3
python -m tunesmith chat --model /tmp/ql --prompt "Who are you?"
python benchmarks/gpu_checks.py
