#!/usr/bin/env bash
# LLaMA-Factory's optimizer extras on issue 15's workload (Qwen3-1.7B shape, 1,000 sharegpt samples), one GPU:
# an epoch each of BAdam (pure_bf16), per-layer GaLore (rank 128, pure_bf16, as LF's example) and bitsandbytes'
# paged 8-bit AdamW, then a BAdam resume on the GPU (4 steps, resume to 8, against 8 straight). Results under $OUT.
# On the device machine: carry .device-wheels (with bitsandbytes and galore-torch wheels), then
#   source .device-wheels/activate.sh && bash benchmarks/run_optimizers_gpu.sh
set -u
export HF_HUB_OFFLINE=1 TUNESMITH_CACHE=/tmp/tc PYTHONPATH="src:${PYTHONPATH:-}"
out=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
timeout "${EPOCHS_TIMEOUT:-330}" python3 benchmarks/lf_workload.py --work /tmp/lfw --no_as_is --out "$out/optimizers.json" \
  --run badam=use_badam=true,pure_bf16=true,badam_switch_interval=20 \
  --run galore_lw=use_galore=true,galore_layerwise=true,galore_rank=128,pure_bf16=true \
  --run adamw8=optim=paged_adamw_8bit 2>&1 | grep -v "^{" | tail -8
resume() {  # NAME KEY=VALUE...
  timeout 90 python3 -m tunesmith train /tmp/lfw/badam.yaml save_strategy=steps save_steps=4 logging_steps=1 \
    output_dir=/tmp/br-"$1" "${@:2}" > "$out/resume-$1.log" 2>&1; echo "$1 rc=$?"
}
resume straight max_steps=8
resume parted max_steps=4
resume parted max_steps=8 resume_from_checkpoint=true
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def losses(name):
    rows = [json.loads(l) for l in pathlib.Path(f"/tmp/br-{name}/metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r and "eval_loss" not in r]
straight, parted = losses("straight"), losses("parted")
print("straight", straight[4:], "\nresumed ", parted[-4:])
(out / "badam-resume.json").write_text(json.dumps({"straight": straight, "parted": parted}))
PY
