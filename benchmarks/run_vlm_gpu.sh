#!/usr/bin/env bash
# On the device machine: source .device-wheels/activate.sh && bash benchmarks/run_vlm_gpu.sh
# Qwen3-VL-2B-shaped full SFT on 1,000 llava-style samples, one H200; results to $OUT.
set -uo pipefail
export HF_HUB_OFFLINE=1 TUNESMITH_CACHE=/tmp/tunesmith-cache
out=${OUT:-/tmp/out}
python benchmarks/gpu_checks.py 2>&1 | grep -E "^(OK|FAIL)" | tee "$out/gpu_checks.txt"
python benchmarks/vlm_sft.py --work /tmp/vlm --samples 1000 --name probe max_steps=30 enable_liger_kernel=true \
  2>&1 | tee "$out/vlm_probe.log" | grep -E "RESULT|built|made|Error|error" | cut -c1-3000
python benchmarks/vlm_sft.py --work /tmp/vlm --samples 1000 --name epoch enable_liger_kernel=true \
  2>&1 | tee "$out/vlm_epoch.log" | grep -E "RESULT|Error|error" | cut -c1-3000
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"
python -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >> "$out/gpu.txt"
