#!/usr/bin/env bash
# On the device machine: source .device-wheels/activate.sh && bash benchmarks/run_vlm_gpu.sh [frozen|item4]
# Qwen3-VL-2B-shaped full SFT on 1,000 llava-style samples, one H200; results to $OUT.
#   frozen (default): LLaMA-Factory's default freezing (tower and projector frozen), Liger; a probe and the epoch.
#   item4: issue 15 item 4, every part trained, Liger: the YAML as is (unpacked; merge_micro_batches on, the
#          default) and with neat_packing, whole epochs, then a profile of two neat-packed steps with the forward
#          time of the tower's parts (patch embedding, blocks, mergers); PROFILE=0 leaves the profile out.
set -uo pipefail
export HF_HUB_OFFLINE=1 TUNESMITH_CACHE=/tmp/tunesmith-cache
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache  # the device ships no .pyc files: compile once, not in every process
out=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"
python -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >> "$out/gpu.txt"
if [ "${1:-frozen}" = item4 ]; then
  all="freeze_vision_tower=false freeze_multi_modal_projector=false enable_liger_kernel=true"
  # shellcheck disable=SC2086
  python benchmarks/vlm_sft.py --work /tmp/vlm --samples 1000 --name asis $all 2>&1 | tee "$out/vlm_asis.log" \
    | grep -E "RESULT|merge_micro|Error" | cut -c1-3000
  # shellcheck disable=SC2086
  python benchmarks/vlm_sft.py --work /tmp/vlm --samples 1000 --name neat $all neat_packing=true 2>&1 \
    | tee "$out/vlm_neat.log" | grep -E "RESULT|Error" | cut -c1-3000
  [ "${PROFILE:-1}" = 1 ] || exit 0
  # shellcheck disable=SC2086
  PROFILE_STEPS=2 timeout 240 python benchmarks/profile_steps.py benchmarks/configs/qwen3_vl_2b_sft.yaml \
    model_name_or_path=/tmp/vlm/model dataset_dir=/tmp/vlm/data output_dir=/tmp/vlm/prof $all neat_packing=true \
    > "$out/vlm_profile.txt" 2>&1
  grep -A14 "per optimiser" "$out/vlm_profile.txt"
  exit 0
fi
python benchmarks/gpu_checks.py 2>&1 | grep -E "^(OK|FAIL)" | tee "$out/gpu_checks.txt"
python benchmarks/vlm_sft.py --work /tmp/vlm --samples 1000 --name probe max_steps=30 enable_liger_kernel=true \
  2>&1 | tee "$out/vlm_probe.log" | grep -E "RESULT|built|made|Error|error" | cut -c1-3000
python benchmarks/vlm_sft.py --work /tmp/vlm --samples 1000 --name epoch enable_liger_kernel=true \
  2>&1 | tee "$out/vlm_epoch.log" | grep -E "RESULT|Error|error" | cut -c1-3000
