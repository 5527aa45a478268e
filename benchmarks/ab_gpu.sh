#!/usr/bin/env bash
# A/B(/C...) of source trees on issue 15's text workload on one device machine, then the kernel micro-benchmark
# and a profile of the last tree's start-up. From the project root on the device machine:
#   source .device-wheels/activate.sh && OLD=.clean-old/src NEW=.clean/src STEPS=40 bash benchmarks/ab_gpu.sh
#   source .device-wheels/activate.sh && TREES="old=.ab/old/src new=src" ORDER="old new new old" STEPS=0 \
#       bash benchmarks/ab_gpu.sh
# TREES names the trees (NAME=PATH ...; default old=$OLD new=$NEW); ORDER the runs, in order (default old new new
# old: the first training process on a fresh machine is the slow one); STEPS=0 runs the whole epoch.
# SITE: the packages' path after each tree (default /tmp/site, .device-wheels' folder; FlashAttention 4's bundle
# adds its own). Results to $OUT: one NAME<k>.json per run, ab.txt (every run), micro.json, startup.txt.
set -uo pipefail
export HF_HUB_OFFLINE=1 TUNESMITH_CACHE=/tmp/tunesmith-cache
unset PYTHONDONTWRITEBYTECODE  # a bytecode cache, as in run_lf_workload_gpu.sh (the device has no .pyc files)
export PYTHONPYCACHEPREFIX=/tmp/pycache
out=${OUT:-/tmp/out}
site=${SITE:-/tmp/site}
steps=${STEPS:-40}
extra=${EXTRA:-}  # more key=value settings for every tree, comma-separated
declare -A tree
for item in ${TREES:-old=${OLD:-} new=${NEW:-}}; do tree[${item%%=*}]=${item#*=}; done
order=(${ORDER:-old new new old})
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"
settings="${extra}"
[ "$steps" != 0 ] && settings="max_steps=$steps${extra:+,$extra}"
for name in "${!tree[@]}"; do  # bytecode of every tree before anything is timed
  PYTHONPATH="${tree[$name]}:$site" python3 -c "import tunesmith.train.setup, transformers.modeling_utils, liger_kernel.transformers, datasets" 2>/dev/null
done
declare -A seen
runs=()
for name in "${order[@]}"; do
  seen[$name]=$(( ${seen[$name]:-0} + 1 ))
  run="$name${seen[$name]}"
  runs+=("$run")
  # each tree its own cache folder (tokenized data, import memos): a tree's memo is not the other's to replace
  PYTHONPATH="${tree[$name]}:$site" TUNESMITH_CACHE="/tmp/tunesmith-cache/$name" python3 benchmarks/lf_workload.py --work ${WORK:-/tmp/lfw} --no_as_is ${TINY:+--tiny} \
    --run "$run=$settings" --out "$out/$run.json" 2>&1 | grep -v "^workload ready" | tail -4
done
python3 - "$out" "${runs[@]}" <<'PY' > "$out/ab.txt"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for name in sys.argv[2:]:
    f = out / f"{name}.json"
    if f.exists():
        r = json.loads(f.read_text())["results"][0]
        print(name, r.get("tokens_per_s"), r.get("train_s"), r.get("end_to_end_s"), r.get("outside_training_s"),
              r.get("peak_gpu_gib"), r.get("final_loss"), r.get("phases"), r.get("start_up_parts"))
PY
cat "$out/ab.txt"
last=${tree[${order[-1]}]}
if [ "${MICRO:-1}" = 1 ]; then
  PYTHONPATH="$last:$site" timeout 120 python3 benchmarks/kernel_micro.py --out "$out/micro.json" > /dev/null 2>&1
  cat "$out/micro.json"
fi
if [ "${STARTUP:-1}" = 1 ]; then
  PYTHONPATH="$last:$site" timeout 150 python3 -m cProfile -o /tmp/startup.prof -m tunesmith train \
    "/tmp/lfw/${runs[-1]}.yaml" max_steps=2 output_dir=/tmp/lfw/startup > "$out/startup-run.txt" 2>&1
  python3 -c "import pstats; pstats.Stats('/tmp/startup.prof').sort_stats('cumulative').print_stats(70)" \
    > "$out/startup.txt" 2>&1
  grep -A7 phases /tmp/lfw/startup/train_summary.json >> "$out/startup.txt"
fi
