#!/usr/bin/env bash
# On the device machine, from the project root, with .device-wheels and .lf-wheels carried:
#   source .device-wheels/activate.sh && bash benchmarks/run_lf_workload_gpu.sh [--run NAME=k=v,...]
# Issue 15's text workload: LLaMA-Factory 0.9.5 (its pins, from .lf-wheels into /tmp/lfsite, a separate site
# directory) and tunesmith on the same YAML, then a profile of tunesmith's step. Results to $OUT.
set -uo pipefail
export HF_HUB_OFFLINE=1 TUNESMITH_CACHE=/tmp/tunesmith-cache
# The device machine sets PYTHONDONTWRITEBYTECODE=1 and its site-packages hold no .pyc files, so every process
# there compiles torch, transformers, ... from source (~10 s of each tool's start-up). A pip-installed
# environment has them: give both tools a bytecode cache, warmed below before anything is timed.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache
out=${OUT:-/tmp/out}
wheels=${LF_WHEELS:-.lf-wheels}
if [ -d "$wheels" ] && [ ! -d /tmp/lfsite/llamafactory ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/lfsite "$wheels"/*.whl
fi
lf=(); [ -d /tmp/lfsite/llamafactory ] && lf=(--llamafactory /tmp/lfsite)
python3 -c "import tunesmith.train.setup, transformers.modeling_utils, liger_kernel.transformers, datasets" 2>/dev/null
[ -d /tmp/lfsite/llamafactory ] && PYTHONPATH="/tmp/lfsite:$PYTHONPATH" DISABLE_VERSION_CHECK=1 \
  python3 -c "import llamafactory.train.tuner, transformers.modeling_utils, liger_kernel.transformers" 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"
python3 -c "import torch, transformers, liger_kernel; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$out/gpu.txt" 2>&1
python3 benchmarks/lf_workload.py --work /tmp/lfw --out "$out/lf_workload.json" "${lf[@]}" "$@" 2>&1 | tee "$out/lf_workload.txt"
cp /tmp/lfw/logs/*.log "$out/" 2>/dev/null
if [ "${PROFILE:-1}" = 1 ]; then
  timeout 150 python3 benchmarks/profile_steps.py /tmp/lfw/tunesmith-as-is.yaml output_dir=/tmp/lfw/profile \
    > "$out/profile.txt" 2>&1
  tail -60 "$out/profile.txt"
fi
