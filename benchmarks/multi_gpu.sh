#!/usr/bin/env bash
# Issue 4's GPU figures on a 2x H200 machine (device tool, kind nvidia-h200-x2). Every run writes its log and
# RESULT line under $OUT; a failing run does not stop the others.
#   source .device-wheels/activate.sh && bash benchmarks/multi_gpu.sh text1   # 1.7B (1 GPU), 4B 1->2 GPUs, 8B FSDP2
#   source .device-wheels/activate.sh && bash benchmarks/multi_gpu.sh text2   # 8B ZeRO-2/3, loss parity, VLM FSDP2
#   source .device-wheels/activate.sh && bash benchmarks/multi_gpu.sh vlm2    # Qwen3-VL-8B ZeRO-2, GRPO on 2 GPUs
#   source .device-wheels/activate.sh && bash benchmarks/multi_gpu.sh megatron  # issue 19: 8B Megatron TP/PP vs
#        FSDP2, ZeRO-2/3; reduced Qwen3-MoE EP=2 vs FSDP2 (in parts: megatron_8b, others_8b, moe_speed)
set -uo pipefail
export HF_HUB_OFFLINE=1 TUNESMITH_CACHE=/tmp/tunesmith-cache TOKENIZERS_PARALLELISM=false
out=${OUT:-/tmp/out}
mkdir -p "$out"
DS=examples/deepspeed

bench() {  # bench NAME GPUS ARGS... : one `tunesmith bench` run, timed from the command's start
  local name=$1 gpus=$2; shift 2
  local start=$(date +%s%N)
  if [ "$gpus" = 1 ]; then
    timeout 420 python -m tunesmith bench "$@" > "$out/$name.log" 2>&1
  else
    NPROC_PER_NODE=$gpus timeout 420 python -m tunesmith bench "$@" > "$out/$name.log" 2>&1
  fi
  local rc=$? wall=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "$name rc=$rc command_ms=$wall $(grep -h '^RESULT' "$out/$name.log" | cut -c8-)" >> "$out/results.txt"
  echo "$name rc=$rc ${wall}ms"; grep -E "Error|error:" "$out/$name.log" | tail -3
}

info() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"
  python -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" >> "$out/gpu.txt"
  python -c "import deepspeed, liger_kernel; print('deepspeed', deepspeed.__version__)" >> "$out/gpu.txt" 2>&1
}

W1="--shape qwen3-1.7b --num_samples 1000 --min_len 200 --max_len 2000 bf16=true packing=true enable_liger_kernel=true"
S4="--shape qwen3-4b --num_samples 1000 --min_len 200 --max_len 2000 bf16=true packing=true cutoff_len=4096 enable_liger_kernel=true per_device_train_batch_size=2 gradient_accumulation_steps=2 max_steps=20 logging_steps=1"
S8="--shape qwen3-8b --num_samples 1000 --min_len 200 --max_len 2000 bf16=true packing=true cutoff_len=4096 enable_liger_kernel=true per_device_train_batch_size=2 gradient_accumulation_steps=2 max_steps=15 logging_steps=1"
P="--shape qwen3-0.6b --num_samples 400 --min_len 200 --max_len 2000 bf16=true packing=true cutoff_len=2048 max_steps=20 logging_steps=1 learning_rate=1e-4"

# Issue 19 item 2: Qwen3-8B shape, full SFT, packed rows of 2048, bf16 autocast over fp32 masters, 16 rows of 2048
# per optimiser step in every layout (micro-batches of 2 rows: 8 on the one TP/PP replica, 4 per FSDP2/ZeRO rank),
# each engine with its fastest settings (Liger where it applies: not under megatron-core's modules)
M8="--shape qwen3-8b --num_samples 1000 --min_len 200 --max_len 2000 bf16=true packing=true cutoff_len=2048 max_steps=15 logging_steps=1 per_device_train_batch_size=2"
MOE="--shape qwen3-30b-a3b-8l --num_samples 1000 --min_len 200 --max_len 2000 bf16=true packing=true cutoff_len=2048 max_steps=15 logging_steps=1 per_device_train_batch_size=2 gradient_accumulation_steps=4"

megatron_8b() {
  bench 8b_megatron_tp2 2 $M8 gradient_accumulation_steps=8 backend=megatron tensor_model_parallel_size=2
  bench 8b_megatron_pp2 2 $M8 gradient_accumulation_steps=8 backend=megatron pipeline_model_parallel_size=2
  bench 8b_megatron_tp2_sp 2 $M8 gradient_accumulation_steps=8 backend=megatron tensor_model_parallel_size=2 \
    sequence_parallel=true
}

others_8b() {
  bench 8b_fsdp2 2 $M8 gradient_accumulation_steps=4 backend=fsdp2 enable_liger_kernel=true
  bench 8b_zero2 2 $M8 gradient_accumulation_steps=4 enable_liger_kernel=true deepspeed=$DS/ds_z2.json
  bench 8b_zero3 2 $M8 gradient_accumulation_steps=4 enable_liger_kernel=true deepspeed=$DS/ds_z3.json
}

moe_speed() {
  bench moe_megatron_ep2 2 $MOE backend=megatron expert_model_parallel_size=2
  bench moe_megatron_pp2 2 $MOE backend=megatron pipeline_model_parallel_size=2 per_device_train_batch_size=4
  bench moe_fsdp2 2 $MOE backend=fsdp2 enable_liger_kernel=true
}

megatron() { megatron_8b; others_8b; moe_speed; }

text1() {
  python -c "from tunesmith.models.tiny import build_tiny; build_tiny('qwen3')"  # once, before parallel runs
  ( python benchmarks/gpu_checks.py > "$out/gpu_checks.txt" 2>&1
    CUDA_VISIBLE_DEVICES=0 bench 1p7b_bf16_2048 1 $W1 cutoff_len=2048 per_device_train_batch_size=8
    CUDA_VISIBLE_DEVICES=0 bench 4b_1gpu 1 $S4
    CUDA_VISIBLE_DEVICES=0 bench parity_single 1 $P per_device_train_batch_size=4 ) &
  ( CUDA_VISIBLE_DEVICES=1 bench 1p7b_pure_bf16_2048 1 $W1 cutoff_len=2048 per_device_train_batch_size=8 bf16=false pure_bf16=true
    CUDA_VISIBLE_DEVICES=1 bench 1p7b_bf16_4096 1 $W1 cutoff_len=4096 per_device_train_batch_size=4
    CUDA_VISIBLE_DEVICES=1 bench 1p7b_bf16_2048_noliger 1 $W1 cutoff_len=2048 per_device_train_batch_size=8 enable_liger_kernel=false ) &
  wait
  bench 4b_fsdp2_2gpu 2 $S4
  bench 8b_fsdp2_2gpu 2 $S8
}

text2() {
  bench 8b_zero2_2gpu 2 $S8 deepspeed=$DS/ds_z2.json
  bench 8b_zero3_2gpu 2 $S8 deepspeed=$DS/ds_z3.json
  bench parity_fsdp2 2 $P per_device_train_batch_size=2
  bench parity_zero2 2 $P per_device_train_batch_size=2 deepspeed=$DS/ds_z2.json
  bench parity_zero3 2 $P per_device_train_batch_size=2 deepspeed=$DS/ds_z3.json
  vlm fsdp2
}

vlm() {  # vlm NAME [key=value ...]: Qwen3-VL-8B shape, everything trained, 1,000 llava-style samples, 2 GPUs
  local name=$1; shift
  python -m tunesmith data clean > /dev/null 2>&1  # each run tokenizes from scratch (end to end)
  local start=$(date +%s%N)
  NPROC_PER_NODE=2 timeout 400 python benchmarks/vlm_sft.py --work /tmp/vlm8 --samples 1000 --shape 8b packing=true \
    freeze_vision_tower=false freeze_multi_modal_projector=false --name "$name" "$@" > "$out/vlm8b_$name.log" 2>&1
  local rc=$? wall=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "vlm8b_$name rc=$rc command_ms=$wall $(grep -h '^RESULT' "$out/vlm8b_$name.log" | cut -c8-)" >> "$out/results.txt"
}

vlm2() {
  vlm zero2 deepspeed=$DS/ds_z2.json
  NPROC_PER_NODE=2 timeout 300 python benchmarks/grpo_bench.py --work /tmp/grpo max_steps=2 > "$out/grpo_2gpu.log" 2>&1
  echo "grpo_2gpu rc=$? $(grep -h '^RESULT' "$out/grpo_2gpu.log" | cut -c8- | tr '\n' ' ')" >> "$out/results.txt"
}

info
"$1"
cat "$out/results.txt" | cut -c1-400
