#!/usr/bin/env bash
# A/B of two source trees on issue 15's text workload on one device machine, in the order old, new, new, old
# (the first training process on a fresh machine is the slow one), then the kernel micro-benchmark and a
# profile of the new tree's start-up. From the project root on the device machine:
#   source .device-wheels/activate.sh && OLD=.clean-old/src NEW=.clean/src STEPS=40 bash benchmarks/ab_gpu.sh
# Results to $OUT: ab.json (every run), micro.json, startup.txt.
set -uo pipefail
export HF_HUB_OFFLINE=1 TUNESMITH_CACHE=/tmp/tunesmith-cache
out=${OUT:-/tmp/out}
steps=${STEPS:-40}
extra=${EXTRA:-}  # more key=value settings for both trees, comma-separated
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"
run() {  # run NAME TREE
  PYTHONPATH="$2:/tmp/site" python3 benchmarks/lf_workload.py --work /tmp/lfw --no_as_is \
    --run "$1=max_steps=$steps${extra:+,$extra}" --out "$out/$1.json" 2>&1 | grep -v "^workload ready" | tail -4
}
run old1 "$OLD"; run new1 "$NEW"; run new2 "$NEW"; run old2 "$OLD"
python3 - "$out" <<'PY' > "$out/ab.txt"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for name in ("old1", "new1", "new2", "old2"):
    f = out / f"{name}.json"
    if f.exists():
        r = json.loads(f.read_text())["results"][0]
        print(name, r.get("tokens_per_s"), r.get("train_s"), r.get("end_to_end_s"), r.get("peak_gpu_gib"),
              r.get("final_loss"), r.get("phases"))
PY
cat "$out/ab.txt"
if [ "${MICRO:-1}" = 1 ]; then
  PYTHONPATH="$NEW:/tmp/site" timeout 120 python3 benchmarks/kernel_micro.py --out "$out/micro.json" > /dev/null 2>&1
  cat "$out/micro.json"
fi
if [ "${STARTUP:-1}" = 1 ]; then
  PYTHONPATH="$NEW:/tmp/site" timeout 150 python3 -m cProfile -o /tmp/startup.prof -m tunesmith train \
    /tmp/lfw/new1.yaml max_steps=2 output_dir=/tmp/lfw/startup > "$out/startup-run.txt" 2>&1
  python3 -c "import pstats; pstats.Stats('/tmp/startup.prof').sort_stats('cumulative').print_stats(70)" \
    > "$out/startup.txt" 2>&1
  grep -A7 phases /tmp/lfw/startup/train_summary.json >> "$out/startup.txt"
fi
