#!/usr/bin/env bash
# Issue 16: the sampler/trainer log-prob gap of GRPO through vLLM on the 1.7B shape, with and without
# cast_lm_head_to_fp32 (the output layer's logits in fp32 on both sides), on one warm device machine:
#   1. carry .device-wheels and .vllm/p00:  bash benchmarks/vllm_bundle.sh stash
#   2. carry .vllm/p01:                     bash benchmarks/vllm_bundle.sh stash
#   3. carry .vllm/p02 and .vllm/p03:       bash benchmarks/run_vllm_gap_gpu.sh
# Checkpointing on and vLLM at 40% of the GPU fit an 80 GB H100 (an H200 fits the YAML's defaults). Logs and a
# summary line per step under $OUT (the gap: rollout_logp_diff_mean / _max, rollout_kl). HEADS="true" runs only the
# fp32-head run (default: "true false").
source .device-wheels/activate.sh
export HF_HUB_OFFLINE=1
bash benchmarks/vllm_bundle.sh stash > /dev/null
source benchmarks/vllm_bundle.sh install > /dev/null 2>&1 || { echo "the vLLM bundle did not install"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
python3 -c "import torch, transformers, vllm; print('torch', torch.__version__, 'transformers', transformers.__version__,
'vllm', vllm.__version__)" >> "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
for head in ${HEADS:-true false}; do  # the fp32 head first: the figure the bound is about
  steps=2; [ $head = false ] && steps=1
  rm -rf /tmp/grpo/out
  log="$OUT/grpo-vllm-fp32head-$head.log"
  timeout -k 10 250 python3 benchmarks/grpo_bench.py --work /tmp/grpo rollout_backend=vllm max_steps=$steps \
    cast_lm_head_to_fp32=$head gradient_checkpointing=true rollout_gpu_memory_utilization=0.4 > "$log" 2>&1
  pkill -f "tunesmith train"; sleep 2  # what a timeout left running
  grep -E "non-finite|checkpointing:" "$log" | head -3
  grep -E "^RESULT" "$log" | HEAD=$head python3 -c "
import json, os, sys
for line in sys.stdin:
    m = json.loads(line[7:])
    print('fp32 head', os.environ['HEAD'], 'step', m['step'], 'loss', m.get('loss'), 'gen tok/s',
          round(m.get('generate_tokens_per_s', 0)), 'gap mean', m.get('rollout_logp_diff_mean'), 'max',
          m.get('rollout_logp_diff_max'), 'kl', m.get('rollout_kl'), 't_gen', m.get('time_generate'),
          't_train', m.get('time_train'))
"
done
