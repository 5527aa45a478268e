#!/usr/bin/env bash
# Issue 15, FlashAttention 4 on the device machine, in the second of two calls (carry .fa4/p00 with .device-wheels
# in the first, running `bash benchmarks/fa4_bundle.sh stash`; then .fa4/p01 with this): the probe, the GPU test,
# and issue 15's YAML with flash_impl fa2 / auto (FA4) / auto / fa2, whole epochs (benchmarks/ab_gpu.sh).
source .device-wheels/activate.sh
bash benchmarks/fa4_bundle.sh stash > /dev/null
source benchmarks/fa4_bundle.sh install
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
python3 -c "import torch, transformers, flash_attn.cute, cutlass; print('torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tail -2
timeout 240 python3 benchmarks/fa4_probe.py --out $OUT/fa4-probe.json 2>&1 | grep -v Warning | tail -6
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_flash_impl_gpu.py 2>&1 | tail -2
if python3 -c "import json,sys; r=json.load(open('$OUT/fa4-probe.json')); sys.exit(0 if 'fa4' in r else 1)"; then
  unset FLASH_ATTENTION_CUTE_DSL_CACHE_DIR   # tunesmith's own default: a cold cache for the first FA4 run
  site="/tmp/fa4-site:/tmp/fa4-site/nvidia_cutlass_dsl/dsl_packages:/tmp/site"
  base=$OUT
  for run in fa2a:fa2 fa4a:auto fa4b:auto fa2b:fa2; do
    mkdir -p $base/${run%%:*}
    OUT=$base/${run%%:*} TREES="head=src" ORDER="head" STEPS=0 MICRO=0 STARTUP=0 EXTRA=flash_impl=${run#*:} SITE=$site \
      timeout 150 bash benchmarks/ab_gpu.sh 2>&1 | tail -1
    echo "${run%%:*}: $(cat $base/${run%%:*}/ab.txt)"
  done
fi
