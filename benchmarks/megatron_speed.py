"""Issue 14 item 7: the Megatron engine against the single engine, same model, data and batch, one GPU.

    source .device-wheels/activate.sh && python benchmarks/megatron_speed.py --work /tmp/mspeed --out $OUT/mspeed
    python benchmarks/megatron_speed.py --work /tmp/mspeed-tiny --out /tmp/mspeed-tiny/out --tiny   # CPU harness check

For each shape (random-initialised Qwen3-1.7B and Qwen3-4B; `tunesmith bench`'s shapes and tokenizer) the
weights are created once and saved in bf16, so that both engines start from the same weights; the data is
`tunesmith bench`'s synthetic tokenized set (lengths uniform in 200-2,000 tokens, half of each supervised), read
through `tokenized_path`. Both engines run the real CLI in a fresh subprocess each, full SFT, bf16 autocast with
fp32 master weights and fused AdamW, packing (no attention across samples), the same rows per micro-batch,
accumulation and steps:
- single: its fastest settings: Liger kernels when installed, `flash_attn: auto` (PyTorch's varlen FlashAttention
  on packed rows), gradient checkpointing off;
- megatron: `backend: megatron` (megatron-core GPTModel, local layer spec, varlen FlashAttention on packed rows;
  Liger patches transformers modules, so it is not available there), no recomputation.
Reported per run: tokens/s over the steps after the warm-up (mean of the per-step rates, logging_steps=1) and over
the whole run, MFU (DESIGN.md: 6N + 12*L*H*d_head*S per token, S = the data's mean sample length, 989e12 bf16
FLOP/s peak), peak memory (torch's max allocated in the run, and nvidia-smi's peak for the whole device, which
includes this script's own idle CUDA context), the loss at the last step, and
the largest per-step relative loss difference between the two engines. One JSON and a markdown table go to --out;
a run that fails, or is left when the time budget (420 s from the start: runs are stopped there) is spent, is
recorded as such, and the JSON is rewritten after every run. The logs of the runs go to --out/logs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from gpu_memory import GpuPeaks, first_visible_gpu

ROOT = Path(__file__).resolve().parents[1]
PEAK = 989e12
WARMUP_STEPS = 3  # compilation, the allocator and autotuning settle in these
# rows of cutoff_len tokens per micro-batch, accumulation: 16k tokens per optimiser step for every shape; the 4B
# shape takes one row per micro-batch so that both engines fit without recomputation
PLANS = {"qwen3-1.7b": (2, 2), "qwen3-4b": (1, 4), "tiny": (2, 2)}
FULL = dict(shapes=("qwen3-1.7b", "qwen3-4b"), steps=30, cutoff_len=4096, samples=800, lengths=(200, 2000),
            budget_s=420)
# --tiny: the tiny Qwen3 on the CPU: fp32 (megatron-core's backward leaves the CPU's autocast), no Liger; a budget
# that a loaded 2-core CI machine does not run out of
TINY = dict(shapes=("tiny",), steps=6, cutoff_len=256, samples=96, lengths=(30, 200), budget_s=500)


def build_weights(shape: str, root: Path, on_gpu: bool) -> Path:
    """`tunesmith bench`'s folder of the shape (config, tiny tokenizer) with random weights saved in bf16."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tunesmith.bench import model_folder

    folder = model_folder(shape, root)
    torch.manual_seed(0)
    with torch.device("cuda" if on_gpu else "cpu"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    if on_gpu:
        torch.cuda.empty_cache()  # the runs are other processes: leave them the memory
    return folder


def build_data(root: Path, plan: dict) -> tuple[Path, float]:
    """`tunesmith bench`'s synthetic tokenized data (the same for every shape), and its mean sample length."""
    from tunesmith.bench import synthetic_data
    from tunesmith.data.cache import REPORT

    path = synthetic_data(root / "data", plan["samples"], *plan["lengths"], vocab=151936)
    report = json.loads((path / REPORT).read_text())
    return path, report["num_tokens"] / report["num_rows"]


def train_keys(model: Path, data: Path, out: Path, plan: dict, shape: str, tiny: bool) -> list[str]:
    rows, accumulation = PLANS[shape]
    return [f"model_name_or_path={model}", f"tokenized_path={data}", "dataset=synthetic", "stage=sft",
            "finetuning_type=full", f"bf16={not tiny}", "packing=true", f"cutoff_len={plan['cutoff_len']}",
            f"per_device_train_batch_size={rows}", f"gradient_accumulation_steps={accumulation}",
            f"max_steps={plan['steps']}", "learning_rate=1e-5", "warmup_steps=2", "logging_steps=1",
            "save_strategy=no", "save_final_model=false", "seed=42", "flash_attn=auto", f"output_dir={out}",
            "overwrite_output_dir=true"]


def engine_keys(engine: str, tiny: bool) -> list[str]:
    if engine == "megatron":
        return ["backend=megatron"]
    liger = importlib.util.find_spec("liger_kernel") is not None and not tiny
    return ["backend=single", f"enable_liger_kernel={str(liger).lower()}", "gradient_checkpointing=false"]


def run_one(shape: str, engine: str, keys: list[str], out: Path, log_dir: Path, timeout: float) -> dict:
    """`tunesmith train` in a fresh process; its numbers from train_summary.json and metrics.jsonl."""
    command = [sys.executable, "-m", "tunesmith", "train", *keys]
    meter = GpuPeaks(first_visible_gpu())
    meter.start()
    started = time.perf_counter()
    with open(log_dir / f"{shape}-{engine}.log", "w") as log:
        try:
            code = subprocess.run(command, cwd=ROOT, env={**os.environ, "TUNESMITH_LOG_LEVEL": "INFO"}, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    result = {"shape": shape, "engine": engine, "command": command[2:], "returncode": code,
              "end_to_end_s": round(time.perf_counter() - started, 1),
              "nvidia_smi_peak_gib": max(meter.stop(), default=0.0)}
    if code == 0:
        result.update(_numbers(out))
    shutil.rmtree(out, ignore_errors=True)
    return result


def _numbers(out: Path) -> dict:
    summary = json.loads((out / "train_summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    steady = [r["tokens_per_s"] for r in steps[WARMUP_STEPS:]] or [r["tokens_per_s"] for r in steps]
    return {"tokens_per_s": sum(steady) / len(steady), "run_tokens_per_s": summary["train_tokens_per_s"],
            "train_tokens": summary["train_tokens"], "train_s": round(summary["train_seconds"], 1),
            "steps": summary["global_step"], "losses": [r["loss"] for r in steps],
            "last_loss": steps[-1]["loss"] if steps else None, "peak_memory_gib": summary.get("peak_memory_gib"),
            "phases": summary.get("phases")}


def add_mfu(result: dict, shape_config, mean_len: float) -> None:
    from tunesmith.bench import flops_per_token

    if result.get("tokens_per_s"):
        result["flops_per_token"] = flops_per_token(shape_config, mean_len)
        result["mfu"] = result["tokens_per_s"] * result["flops_per_token"] / PEAK


def loss_agreement(results: list[dict]) -> dict:
    """Per shape: the largest relative difference of the two engines' per-step losses (same weights and data)."""
    agreement = {}
    for shape in dict.fromkeys(r["shape"] for r in results):
        runs = {r["engine"]: r.get("losses") for r in results if r["shape"] == shape}
        single, mega = runs.get("single"), runs.get("megatron")
        if single and mega and len(single) == len(mega):
            agreement[shape] = max(abs(a - b) / abs(b) for a, b in zip(mega, single))
    return agreement


def table(results: list[dict], agreement: dict) -> str:
    lines = ["| shape | engine | tokens/s (after warm-up) | tokens/s (whole run) | MFU | peak allocated | "
             "peak nvidia-smi | last loss | end to end |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if r["returncode"] != 0:
            lines.append(f"| {r['shape']} | {r['engine']} | {r.get('note') or 'failed: ' + str(r['returncode'])} "
                         f"| | | | | | {r.get('end_to_end_s', '')} s |")
            continue
        peak = f"{r['peak_memory_gib']:.1f} GiB" if r.get("peak_memory_gib") is not None else "n/a"
        smi = f"{r['nvidia_smi_peak_gib']} GiB" if r["nvidia_smi_peak_gib"] else "n/a"  # 0: no nvidia-smi
        lines.append(f"| {r['shape']} | {r['engine']} | {r['tokens_per_s'] / 1e3:.1f}k | "
                     f"{r['run_tokens_per_s'] / 1e3:.1f}k | {r['mfu']:.1%} | {peak} | {smi} | "
                     f"{r['last_loss']:.4f} | {r['end_to_end_s']} s |")
    lines += [""] + [f"- {shape}: largest per-step relative loss difference megatron vs single {diff:.2e}"
                     for shape, diff in agreement.items()]
    return "\n".join(lines)


def versions() -> dict:
    import importlib.metadata

    import torch

    found = {"python": sys.version.split()[0], "torch": torch.__version__,
             "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    for package in ("transformers", "megatron-core", "liger-kernel"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def write(out: Path, report: dict) -> None:
    report["loss_agreement"] = loss_agreement(report["results"])
    (out / "megatron_speed.json").write_text(json.dumps(report, indent=1))
    (out / "megatron_speed.md").write_text(table(report["results"], report["loss_agreement"]) + "\n")


def run_shape(shape: str, plan: dict, args, report: dict, data: Path, mean_len: float, started: float) -> None:
    """Both engines on one shape, within what is left of the time budget."""
    from transformers import AutoConfig

    model = build_weights(shape, args.work / "models", on_gpu=not args.tiny and _cuda())
    config = AutoConfig.from_pretrained(model)
    for engine in args.engines.split(","):
        left = plan["budget_s"] - (time.perf_counter() - started)
        if left < 60:
            report["results"].append({"shape": shape, "engine": engine, "returncode": "skipped",
                                      "note": f"skipped: the {plan['budget_s']} s budget was spent"})
            continue
        keys = train_keys(model, data, args.work / "runs" / f"{shape}-{engine}", plan, shape, args.tiny)
        result = run_one(shape, engine, keys + engine_keys(engine, args.tiny), args.work / "runs" / f"{shape}-{engine}",
                         args.out / "logs", timeout=left)
        add_mfu(result, config, mean_len)
        report["results"].append(result)
        write(args.out, report)
        print(json.dumps({k: v for k, v in result.items() if k not in ("command", "losses")}), flush=True)
    shutil.rmtree(model, ignore_errors=True)


def profile(shape: str, plan: dict, args, data: Path) -> None:
    """benchmarks/profile_steps.py on one engine with the benchmark's keys: where that engine's step time goes."""
    model = build_weights(shape, args.work / "models", on_gpu=not args.tiny and _cuda())
    keys = train_keys(model, data, args.work / "runs" / f"{shape}-profile", plan, shape, args.tiny)
    empty = args.work / "empty.yaml"
    empty.write_text("{}\n")
    env = {"PROFILE_TOTAL": "12", "PROFILE_STEPS": "2", **os.environ}
    with open(args.out / f"{shape}-{args.profile}-profile.txt", "w") as log:
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_steps.py"), str(empty), *keys,
                        *engine_keys(args.profile, args.tiny)], stdout=log, stderr=subprocess.STDOUT, env=env,
                       cwd=ROOT)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="scratch folder (models, data, runs)")
    parser.add_argument("--out", type=Path, required=True, help="where megatron_speed.json / .md and the logs go")
    parser.add_argument("--tiny", action="store_true", help="the tiny Qwen3 on the CPU: a check of this harness")
    parser.add_argument("--steps", type=int, help="optimiser steps per run (default 30, --tiny 6)")
    parser.add_argument("--shapes", help="comma-separated `tunesmith bench` shapes (default qwen3-1.7b,qwen3-4b)")
    parser.add_argument("--engines", default="single,megatron", help="comma-separated engines to run")
    parser.add_argument("--profile", metavar="ENGINE", choices=("single", "megatron"),
                        help="instead: profile a few steps of this engine on the first shape (profile_steps.py)")
    args = parser.parse_args()
    started = time.perf_counter()
    plan = dict(TINY if args.tiny else FULL)
    plan.update({k: v for k, v in (("steps", args.steps), ("shapes", args.shapes and args.shapes.split(",")))
                 if v})
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    data, mean_len = build_data(args.work, plan)
    if args.profile:
        profile(plan["shapes"][0], plan, args, data)
        return
    report = {"plan": {**plan, "rows_and_accumulation": {s: PLANS[s] for s in plan["shapes"]},
                       "mean_sample_tokens": mean_len}, "versions": versions(), "results": []}
    for shape in plan["shapes"]:
        run_shape(shape, plan, args, report, data, mean_len, started)
    write(args.out, report)
    print(table(report["results"], report["loss_agreement"]))
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
