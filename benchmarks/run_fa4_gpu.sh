#!/usr/bin/env bash
# Issue 15: FlashAttention 4 on the device machine, in three calls on one warm machine:
#   1. carry .device-wheels and .fa4/p00:  bash benchmarks/fa4_bundle.sh stash
#   2. carry .fa4/p01:                     bash benchmarks/run_fa4_gpu.sh first    (probe, GPU test, fa2 + fa4 epochs)
#   3. (nothing more to carry):            bash benchmarks/run_fa4_gpu.sh second   (fa4 + fa2 epochs again)
# or, for the pure-bf16 stretch, call 2 as:  bash benchmarks/run_fa4_gpu.sh pure   (fa4 twice, fa2, pure_bf16)
# or, on an H200, calls 2 and 3 as:  bash benchmarks/run_fa4_gpu.sh h200a   (fa2, fa4 cold, fa4 warm)
#                                    bash benchmarks/run_fa4_gpu.sh h200b   (fa4, fa4 pure_bf16, step profile, data)
# or, with little device time left, call 2 alone as:  bash benchmarks/run_fa4_gpu.sh h200min   (fa4 cold, fa4)
# or call 2 as an A/B of two trees under FlashAttention 4 (carry .fa4/p01 and .baseline/old, the old tree's src):
#                                    bash benchmarks/run_fa4_gpu.sh ab      (the GPU tests, then new old new old;
#                                                                            AB_TREES, AB_ORDER, AB_TIMEOUT change it;
#                                                                            AB_PROFILE=1 adds a step profile,
#                                                                            AB_STARTUP=1 a start-up timeline)
# or call 2 (or 3, after ab):        bash benchmarks/run_fa4_gpu.sh host    (the host's time a step: rows of
#                                                                            HOST_CUTOFF (256) tokens, where the GPU
#                                                                            idles, for each of HOST_TREES (NAME=PATH,
#                                                                            default head=src); HOST_CPROFILE=1 adds a
#                                                                            cProfile run; an epoch first where none
#                                                                            ran)
# An epoch is issue 15's YAML as is with flash_impl fa2 or auto (benchmarks/ab_gpu.sh); the first FA4 epoch
# compiles its kernels into FlashAttention 4's default cache, the second loads them. Results under $OUT.
set -u
source .device-wheels/activate.sh
[ -f /tmp/fa4-site/.done ] || bash benchmarks/fa4_bundle.sh stash > /dev/null
source benchmarks/fa4_bundle.sh install || exit 2
site=$PYTHONPATH  # the bundle's folders, then .device-wheels' (ab_gpu.sh puts the tree in front)
out=$OUT

epoch() {  # NAME FLASH_IMPL SECONDS
  mkdir -p "$out/$1"
  OUT="$out/$1" TREES="head=src" ORDER="head" STEPS=0 MICRO=0 STARTUP=0 EXTRA="flash_impl=$2" SITE="$site" \
    timeout "$3" bash benchmarks/ab_gpu.sh > "$out/$1/log.txt" 2>&1
  local rc=$?
  pkill -f lf_workload.py; pkill -f "tunesmith train"  # what a timeout left running (it stops only the shell)
  echo "$1 (rc $rc): $(cat "$out/$1/ab.txt" 2>/dev/null || echo 'no result')"
}

case "${1:-}" in
  first)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"; cat "$out/gpu.txt"
    FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4-probe-cache timeout 120 python3 benchmarks/fa4_probe.py \
      --out "$out/fa4-probe.json" 2>&1 | grep -v Warning | tail -4
    FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4-probe-cache timeout 90 python3 -m pytest -q -p no:cacheprovider \
      tests/gpu/test_flash_impl_gpu.py 2>&1 | tail -2
    epoch fa2a fa2 200  # builds the workload (data, model) first
    epoch fa4a auto 150 ;;
  second)
    epoch fa4b auto 150
    epoch fa2b fa2 150 ;;
  pure)  # the first builds the workload and compiles FA4's kernels; the second runs them from the cache
    epoch fa4p-cold auto,pure_bf16=true 220
    epoch fa4p auto,pure_bf16=true 100
    epoch fa2p fa2,pure_bf16=true 100 ;;
  h200a)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"; cat "$out/gpu.txt"
    epoch fa2a fa2 200
    epoch fa4-cold auto 150
    epoch fa4a auto 100 ;;
  h200min)  # issue 15's figure alone, where little device time is left: the workload and FA4's kernels, then the run
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"; cat "$out/gpu.txt"
    epoch fa4-cold auto 260
    epoch fa4a auto 110 ;;
  h200b)
    epoch fa4b auto 100
    epoch fa4p auto,pure_bf16=true 100
    PYTHONPATH="src:$site" PROFILE_LOOP=1 PROFILE_TOTAL=24 HF_HUB_OFFLINE=1 timeout 120 python3 \
      benchmarks/profile_steps.py /tmp/lfw/head1.yaml max_steps=-1 save_final_model=false flash_impl=auto pure_bf16=false \
      output_dir=/tmp/lfw/profile > "$out/profile.txt" 2>&1; tail -3 "$out/profile.txt"
    PYTHONPATH="src:$site" timeout 120 python3 benchmarks/data_phase_probe.py /tmp/lfw/head1.yaml --workers 8 \
      --rows_per_convert_worker 0 1 --repeat 3 --out "$out/data-phase.json" 2>&1 | tail -4 ;;
  ab)  # the GPU tests first: they also take the fresh machine's first-process cost off the timed epochs
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"; cat "$out/gpu.txt"
    PYTHONPATH="src:$site" timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_flash_impl_gpu.py \
      tests/gpu/test_liger_rope_gpu.py tests/gpu/test_step_sync_gpu.py 2>&1 | tail -3
    OUT="$out" TREES="${AB_TREES:-old=.baseline/old/src new=src}" ORDER="${AB_ORDER:-new old new old}" STEPS=0 \
      MICRO=0 STARTUP=0 EXTRA="flash_impl=auto" SITE="$site" timeout "${AB_TIMEOUT:-450}" bash benchmarks/ab_gpu.sh \
      > "$out/ab-log.txt" 2>&1
    cat "$out/ab.txt"
    for f in /tmp/lfw/logs/*.log; do  # the rates of the first logged steps of each run
      echo "== $f"; grep "tokens_per_s=" "$f" | head -3 | tr '\n' ' '; echo
    done
    if [ "${AB_PROFILE:-0}" = 1 ]; then  # then a step profile of the first run's YAML (as h200b's)
      first=$(echo ${AB_ORDER:-new} | cut -d' ' -f1)
      PYTHONPATH="src:$site" PROFILE_LOOP=1 PROFILE_TOTAL=24 HF_HUB_OFFLINE=1 timeout 120 python3 \
        benchmarks/profile_steps.py "/tmp/lfw/${first}1.yaml" max_steps=-1 save_final_model=false flash_impl=auto \
        pure_bf16=false output_dir=/tmp/lfw/profile > "$out/profile.txt" 2>&1
      grep -E "tokens_per_s=|Runner's loop|GPU busy" "$out/profile.txt" | tr '\n' ' '; echo
    fi
    if [ "${AB_STARTUP:-0}" = 1 ]; then  # where each tree's start-up goes (set-up's steps), then the first's imports
      first=$(echo ${AB_ORDER:-new} | cut -d' ' -f1)
      for item in ${AB_TREES:-old=.baseline/old/src new=src}; do
        name=${item%%=*}
        PYTHONPATH="${item#*=}:$site" HF_HUB_OFFLINE=1 TUNESMITH_CACHE=/tmp/tunesmith-cache \
          PYTHONPYCACHEPREFIX=/tmp/pycache timeout 120 python3 benchmarks/startup_probe.py timeline \
          "/tmp/lfw/${name}1.yaml" max_steps=2 save_final_model=false output_dir=/tmp/lfw/startup \
          > "$out/startup-timeline-$name.txt" 2>&1
        echo "== $name"; grep -E "^ +[0-9]" "$out/startup-timeline-$name.txt"
      done
      PYTHONPATH="src:$site" HF_HUB_OFFLINE=1 TUNESMITH_CACHE=/tmp/tunesmith-cache PYTHONPYCACHEPREFIX=/tmp/pycache \
        timeout 120 python3 benchmarks/startup_probe.py imports "/tmp/lfw/${first}1.yaml" max_steps=2 \
        save_final_model=false output_dir=/tmp/lfw/startup > "$out/startup-imports.txt" 2>&1
      head -25 "$out/startup-imports.txt"
    fi ;;
  host)  # the host's time a step: the same launches over rows of HOST_CUTOFF (256) tokens, where the GPU idles
    yaml=$(ls /tmp/lfw/*1.yaml 2>/dev/null | head -1)
    if [ -z "$yaml" ]; then epoch head auto 220; yaml=/tmp/lfw/head1.yaml; fi  # builds the workload first
    for item in ${HOST_TREES:-head=src}; do
      name=${item%%=*}
      for prefix in "python3" ${HOST_CPROFILE:+"python3 -m cProfile -s tottime"}; do
        file="$out/host-$name${prefix#python3}.txt"; file=${file// /}
        PYTHONPATH="${item#*=}:$site" PROFILE_LOOP=1 PROFILE_TOTAL=64 HF_HUB_OFFLINE=1 \
          TUNESMITH_CACHE="/tmp/tunesmith-cache/$name" PYTHONPYCACHEPREFIX=/tmp/pycache timeout 150 $prefix \
          benchmarks/profile_steps.py "$yaml" max_steps=-1 save_final_model=false flash_impl=auto \
          cutoff_len=${HOST_CUTOFF:-256} output_dir=/tmp/lfw/host > "$file" 2>&1
        echo "== $file"; grep -E "tokens_per_s|a step|GPU busy" "$file" | tail -9 | tr '\n' ' '; echo
      done
    done ;;
  *) echo "usage: bash benchmarks/run_fa4_gpu.sh first | second | pure | h200a | h200min | h200b | ab | host" >&2; exit 2 ;;
esac
