"""Issue 20's benchmark: Qwen3-VL-8B shape, full SFT with every part trained, 1,000 llava-style samples, on 4 GPUs,
one run per engine layout (benchmarks/configs/vl8b/*.yaml), each once more with packing, and one table.

    python benchmarks/vl8b_engines.py --work /tmp/vl8b --out $OUT/vl8b [--only megatron_pp4,zero2] [--budget 540]
    python benchmarks/vl8b_engines.py --work /tmp/vl8b --dry-run        # resolve every run's config, print commands

The model folder (config and processor; the runs use random_init) and the data (synthetic images of 336-672 px a
side and answers of a few hundred tokens, benchmarks/vlm_sft.py) are made once under --work and reused. Runs go in
ORDER (the issue's first three first: Megatron PP=4, ZeRO-2, FSDP2), each `tunesmith train` under NPROC_PER_NODE
processes, and none starts past --budget seconds; results accumulate in --out/vl8b.json (a later call runs the rest
with --only) and --out/vl8b.md gets the table: end to end split into start-up + model load, data preprocessing,
training and the final save; training tokens/s; MFU of the language model (DESIGN.md's formula, vlm_sft.mfu); the
largest GPU's peak memory (nvidia-smi); the final loss. `--tiny` runs the same flow on the tiny Qwen3-VL (a CPU check
of this script, without MFU: use it with --dry-run or with a layout the tiny model's two layers allow).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from child import run_child  # this folder is the script's: on sys.path
from gpu_memory import GpuPeaks
from lf_workload import tunesmith_numbers

import vlm_sft

CONFIGS = Path(__file__).resolve().parent / "configs" / "vl8b"
ENGINES = ("megatron_pp4", "zero2", "fsdp2", "megatron_tp2_pp2", "zero3")  # the first three first
PACKING = {"packing": "true", "neat_packing": "true"}
ORDER = [*ENGINES, *(f"{engine}+packing" for engine in ENGINES)]
TINY = {"bf16": "false", "enable_liger_kernel": "false", "preprocessing_num_workers": "2",
        "dataloader_num_workers": "0"}


def run_overrides(name: str, work: Path, model: Path) -> tuple[Path, dict]:
    """(the run's YAML, its command-line keys): the paths, and packing for a "+packing" run."""
    engine, _, packed = name.partition("+")
    overrides = {"model_name_or_path": str(model), "dataset_dir": str(work / "data"),
                 "output_dir": str(work / "runs" / name), **(PACKING if packed else {})}
    return CONFIGS / f"{engine}.yaml", overrides


def phase_split(phases: dict) -> dict:
    """The issue's split of a run: start-up + model load, data preprocessing, training, save (seconds)."""
    return {"start_up_and_model": round(phases.get("start_up", 0.0) + phases.get("model", 0.0), 1),
            "data": round(phases.get("data", 0.0), 1), "train": round(phases.get("train", 0.0), 1),
            "save": round(phases.get("final_save", 0.0), 1)}


def run_one(name: str, work: Path, model: Path, gpus: int, extra: dict, logs: Path) -> dict:
    yaml, overrides = run_overrides(name, work, model)
    overrides.update(extra)
    command = [sys.executable, "-m", "tunesmith", "train", str(yaml), *(f"{k}={v}" for k, v in overrides.items())]
    env = {**os.environ, "NPROC_PER_NODE": str(gpus), **({"FORCE_TORCHRUN": "1"} if gpus > 1 else {})}
    meter = GpuPeaks()
    meter.start()
    start = time.perf_counter()
    with open(logs / f"{name}.log", "w") as log:
        code = run_child(command, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    end_to_end, exited = round(time.perf_counter() - start, 1), time.time()
    result = {"name": name, "gpus": gpus, "returncode": code, "end_to_end_s": end_to_end,
              "peak_gpu_gib": meter.stop()}
    if code == 0:
        result.update(tunesmith_numbers(Path(overrides["output_dir"]), exited),
                      yaml=str(yaml.relative_to(CONFIGS.parents[2])), overrides=overrides)
        result["phases"] = phase_split(result["phases"])
    return result


def with_mfu(result: dict, stats: dict) -> dict:
    """The run's MFU of the language model (and with the vision tower), all parts trained."""
    if result.get("returncode") == 0:
        tokens = result["train_tokens"]  # and the training seconds they took, unrounded
        summary = {"train_tokens": tokens, "train_seconds": tokens / result["tokens_per_s"]}
        numbers = vlm_sft.mfu(summary, stats, freeze_vision=False, gpus=result["gpus"])
        result.update(mfu_llm=numbers["mfu_llm"], mfu_total=numbers["mfu_total"])
    return result


def table(results: list[dict]) -> str:
    rows = ["| run | end to end | start-up + model | data | training | save | tokens/s | MFU (LLM) | peak per GPU "
            "(largest) | final loss | steps |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(results, key=lambda r: ORDER.index(r["name"]) if r["name"] in ORDER else len(ORDER)):
        if r.get("returncode") != 0:
            rows.append(f"| {r['name']} | {r.get('note') or 'failed: %s' % r.get('returncode')} |")
            continue
        p = r["phases"]
        peak = f"{max(r['peak_gpu_gib'])} GiB" if r["peak_gpu_gib"] else "n/a"
        mfu = f"{100 * r['mfu_llm']:.1f}%" if "mfu_llm" in r else "n/a"
        loss = "n/a" if r["final_loss"] is None else f"{r['final_loss']:.4f}"
        rows.append(f"| {r['name']} | {r['end_to_end_s']} s | {p['start_up_and_model']} s | {p['data']} s | "
                    f"{p['train']} s | {p['save']} s | {r['tokens_per_s'] / 1e3:.1f}k | {mfu} | "
                    f"{peak} | {loss} | {r['steps']} |")
    return "\n".join(rows) + "\n"


def prepare(work: Path, samples: int, tiny: bool) -> Path:
    """The model folder and the data under `work`, made once; returns the model folder."""
    vlm_sft.TEXT, vlm_sft.VISION = vlm_sft.SHAPES["8b"]
    if tiny:
        from tunesmith.models.tiny import build_tiny

        model = Path(build_tiny("qwen3_vl"))
    else:
        model = work / "model"
        if not (model / "config.json").exists():
            vlm_sft.build_model(model, "8b")
    if not (work / "data" / "dataset_info.json").exists():
        vlm_sft.make_data(work / "data", samples, vlm_sft.ANSWER_WORDS["8b"])
    return model


def dry_run(names: list[str], work: Path, model: Path, extra: dict, gpus: int) -> None:
    """Resolve each run's config as `tunesmith train` would (keys, engine settings) and print its command."""
    from tunesmith.config.load import build_config

    for name in names:
        yaml, overrides = run_overrides(name, work, model)
        cfg = build_config(str(yaml), parsed({**overrides, **extra}))
        engine = "deepspeed" if cfg.train.wants_deepspeed else cfg.train.backend
        print(f"{name}: NPROC_PER_NODE={gpus} tunesmith train {yaml.name} "
              f"{' '.join(f'{k}={v}' for k, v in {**overrides, **extra}.items())}  (engine: {engine})")


def parsed(overrides: dict) -> dict:
    """Command-line keys as `tunesmith train` reads them (its own parser)."""
    from tunesmith.config.load import parse_cli_items

    return parse_cli_items([f"{key}={value}" for key, value in overrides.items()])[1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", default="/tmp/vl8b")
    parser.add_argument("--out", default="/tmp/vl8b/out")
    parser.add_argument("--only", default=",".join(ORDER), help="comma-separated runs of ORDER")
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--budget", type=float, default=float("inf"), help="start no run past these seconds")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="the tiny Qwen3-VL on the CPU (a check of this script)")
    args, rest = parser.parse_known_args()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in ORDER]
    if unknown:
        parser.error(f"unknown runs {unknown}; choose from {ORDER}")
    work, out = Path(args.work), Path(args.out)
    extra = {**(TINY if args.tiny else {}), **dict(item.split("=", 1) for item in rest)}
    model = prepare(work, args.samples, args.tiny)
    if args.dry_run:
        dry_run(names, work, model, extra, args.gpus)
        return 0
    (out / "logs").mkdir(parents=True, exist_ok=True)
    report = out / "vl8b.json"
    results = {r["name"]: r for r in json.loads(report.read_text())["results"]} if report.exists() else {}
    started, stats = time.perf_counter(), None
    for name in names:
        if time.perf_counter() - started > args.budget:
            results[name] = {"name": name, "returncode": "skipped", "note": f"skipped: the {args.budget:.0f} s budget"}
            continue
        result = run_one(name, work, model, args.gpus, extra, out / "logs")
        if result["returncode"] == 0 and stats is None and not args.tiny:
            yaml, overrides = run_overrides(name, work, model)
            stats = vlm_sft.data_stats(str(yaml), parsed({**overrides, **extra, "output_dir": str(work / "stats")}))
        results[name] = with_mfu(result, stats) if stats else result
        print(json.dumps({k: v for k, v in results[name].items() if k not in ("logged_losses", "overrides")}),
              flush=True)
        report.write_text(json.dumps({"stats": stats, "results": list(results.values())}, indent=1))
    (out / "vl8b.md").write_text(table(list(results.values())))
    print(table(list(results.values())))
    return 0 if all(r.get("returncode") in (0, "skipped") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
