#!/usr/bin/env bash
# Issue 11's no-slowdown check: the text and the VLM benchmark, before and after the redesign, alternated,
# three runs each, in one device call per workload. "before" is the pre-redesign source tree exported to
# .baseline/src (git archive 1147776 src | tar -x -C .baseline), carried along with .device-wheels.
#   source .device-wheels/activate.sh && bash benchmarks/redesign_ab.sh text    # Qwen3-1.7B, 1.12M tokens
#   source .device-wheels/activate.sh && bash benchmarks/redesign_ab.sh vlm     # Qwen3-VL-2B, 1,000 samples
set -uo pipefail
export HF_HUB_OFFLINE=1 TUNESMITH_CACHE=/tmp/tunesmith-cache TOKENIZERS_PARALLELISM=false
out=${OUT:-/tmp/out}
mkdir -p "$out"
here=$PWD
W1="--shape qwen3-1.7b --num_samples 1000 --min_len 200 --max_len 2000 bf16=true packing=true enable_liger_kernel=true cutoff_len=2048 per_device_train_batch_size=8"
VLM="--work /tmp/vlm --samples 1000 packing=true enable_liger_kernel=true max_steps=25"

run() {  # run NAME before|after COMMAND...: one run with that source tree, timed from the command's start
  local name=$1 code=$2; shift 2
  local src="$here/src"
  [ "$code" = before ] && src="$here/.baseline/src"
  local start=$(date +%s%N)
  PYTHONPATH="/tmp/site:$src" timeout 300 "$@" > "$out/$name.log" 2>&1
  local rc=$? wall=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "$name rc=$rc command_ms=$wall $(grep -h '^RESULT' "$out/$name.log" | cut -c8-)" >> "$out/results.txt"
  echo "$name rc=$rc ${wall}ms"; grep -E "Error|error:" "$out/$name.log" | tail -3
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"
python -c "import torch, transformers, peft, liger_kernel; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" >> "$out/gpu.txt"
case "${1:-text}" in
  text)
    run warmup after python -m tunesmith bench $W1 max_steps=2  # builds the model folder and the data once
    for i in 1 2 3; do
      run "text_before_$i" before python -m tunesmith bench $W1
      run "text_after_$i" after python -m tunesmith bench $W1
    done ;;
  vlm)
    run warmup after python benchmarks/vlm_sft.py $VLM --name warmup max_steps=2
    for i in 1 2 3; do
      run "vlm_before_$i" before python benchmarks/vlm_sft.py $VLM --name "before_$i"
      run "vlm_after_$i" after python benchmarks/vlm_sft.py $VLM --name "after_$i"
    done ;;
esac
