"""The LLaMA-Factory text-SFT workload of issue 15, run with tunesmith and (when installed) LLaMA-Factory.

    python benchmarks/lf_workload.py --work /tmp/lfw --out results.json            # tunesmith, the YAML as is
    python benchmarks/lf_workload.py --work /tmp/lfw --run pure=pure_bf16=true ...  # named variants: NAME=k=v,k=v
    python benchmarks/lf_workload.py --work /tmp/lfw --llamafactory /path/to/site   # + LLaMA-Factory, same YAML
    python benchmarks/lf_workload.py --work /tmp/lfw-tiny --tiny                    # a CPU check of the harness

Builds once under --work: a random-initialised Qwen3-1.7B-shaped model saved as a Hugging Face folder (the
tiny tokenizer; bf16 safetensors, as a downloaded checkpoint is), 1,000 sharegpt conversations whose rendered
lengths are uniform in 200-2,000 tokens (~1.1M tokens), a dataset_info.json, and the YAML below: the issue's
LLaMA-Factory YAML with only the paths filled in. Every run is a fresh subprocess, `tunesmith train <yaml>` or
`llamafactory-cli train <yaml>` (LLaMA-Factory from its own site directory, put first on PYTHONPATH), timed from
start to exit. Reported per run: end to end, training seconds and training tokens/s (all non-padding input tokens
/ training seconds: tunesmith's train_summary.json; LLaMA-Factory's effective_tokens_per_sec and train_runtime),
MFU (DESIGN.md: 6N + 12*L*H*d_head*S per token, S = mean sample length, 989 TFLOP/s bf16 peak), peak GPU memory
(nvidia-smi memory.used of the device, sampled every 0.2 s: the same meter for both tools), steps, final loss.
Results go to --out (JSON) and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from child import run_child  # this folder is the script's: on sys.path
from dpo_bench import build_model as build_random_model
from gpu_memory import GpuPeaks, first_visible_gpu
from vlm_sft import TEXT

PEAK = 989e12
SHAPE = TEXT  # the Qwen3-1.7B shape
YAML = """\
model_name_or_path: {model}
flash_attn: sdpa
stage: sft
do_train: true
finetuning_type: full
dataset: lf_sharegpt
dataset_dir: {data}
template: qwen3_nothink
cutoff_len: 2048
overwrite_cache: true
preprocessing_num_workers: 8
dataloader_num_workers: 4
packing: true
neat_packing: true
output_dir: {output}
overwrite_output_dir: true
logging_steps: 5
save_strategy: "no"
report_to: none
include_effective_tokens_per_second: true
include_num_input_tokens_seen: "true"
per_device_train_batch_size: 4
gradient_accumulation_steps: 1
learning_rate: 1.0e-5
num_train_epochs: 1
lr_scheduler_type: cosine
bf16: true
pure_bf16: false
enable_liger_kernel: true
disable_gradient_checkpointing: false
seed: 42
"""
WORDS = ("the model data train step loss token batch layer value time answer question result number system "
         "input output memory speed first second third place point line group order word sentence page").split()


def build_model(folder: Path, tiny: bool) -> None:
    """The Qwen3-1.7B shape with random bf16 weights (dpo_bench's), or a copy of the tiny model (--tiny)."""
    if not tiny:
        build_random_model(folder)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from tunesmith.models.tiny import build_tiny

    shutil.copytree(build_tiny("qwen3"), folder)


def build_data(folder: Path, model: Path, num: int, lengths: tuple[int, int], seed: int = 0) -> dict:
    """sharegpt conversations whose rendered length (qwen3_nothink) is uniform in `lengths` tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    cost = {w: len(tok(" " + w, add_special_tokens=False)["input_ids"]) for w in WORDS}
    frame = len(tok.apply_chat_template([{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
                                        tokenize=True, enable_thinking=False))
    rng = random.Random(seed)

    def text(tokens: int) -> str:
        words, used = [], 0
        while used < tokens:
            word = rng.choice(WORDS)
            words.append(word)
            used += cost[word]
        return " ".join(words)

    records, total = [], 0
    for _ in range(num):
        length = rng.randint(*lengths)
        prompt = rng.randint(length // 8, length // 3)
        records.append({"conversations": [{"from": "human", "value": text(prompt)},
                                          {"from": "gpt", "value": text(max(1, length - prompt - frame))}]})
        total += length
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lf_sharegpt.json").write_text(json.dumps(records))
    (folder / "dataset_info.json").write_text(json.dumps({"lf_sharegpt": {
        "file_name": "lf_sharegpt.json", "formatting": "sharegpt", "columns": {"messages": "conversations"}}}))
    return {"samples": num, "target_tokens": total, "mean_len": total / num}


def prepare(work: Path, samples: int, tiny: bool) -> dict:
    model, data = work / "model", work / "data"
    if not (model / "config.json").exists():
        build_model(model, tiny)
    facts_file = work / "data_facts.json"
    if not facts_file.exists():
        facts_file.write_text(json.dumps(build_data(data, model, samples, (60, 300) if tiny else (200, 2000))))
    return json.loads(facts_file.read_text())


def write_yaml(work: Path, name: str, overrides: dict) -> tuple[Path, Path]:
    output = work / "runs" / name
    text = YAML.format(model=work / "model", data=work / "data", output=output)
    lines = [line for line in text.splitlines() if line.split(":")[0] not in overrides]
    lines += [f"{key}: {value}" for key, value in overrides.items()]
    path = work / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path, output


# --tiny: the tiny model on the CPU (no bf16 autocast, no Liger there); everything else as the YAML says
TINY_OVERRIDES = {"bf16": "false", "enable_liger_kernel": "false", "preprocessing_num_workers": "2",
                  "dataloader_num_workers": "0"}


def run_one(work: Path, name: str, tool: str, overrides: dict, lf_site: str | None, log_dir: Path) -> dict:
    yaml_path, output = write_yaml(work, name, overrides)
    env = dict(os.environ)
    if tool == "llamafactory":
        env["PYTHONPATH"] = f"{lf_site}:{env.get('PYTHONPATH', '')}"
        env.setdefault("DISABLE_VERSION_CHECK", "1")
        command = [sys.executable, "-m", "llamafactory.cli", "train", str(yaml_path)]
    else:
        command = [sys.executable, "-m", "tunesmith", "train", str(yaml_path)]
    meter = GpuPeaks(first_visible_gpu())
    meter.start()
    start = time.perf_counter()
    with open(log_dir / f"{name}.log", "w") as log:
        code = run_child(command, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    end_to_end, exited = time.perf_counter() - start, time.time()
    peak = max(meter.stop(), default=0.0)
    result = {"name": name, "tool": tool, "overrides": overrides, "returncode": code,
              "end_to_end_s": round(end_to_end, 1), "peak_gpu_gib": round(peak, 1)}
    if code == 0:
        result.update(tunesmith_numbers(output, exited) if tool == "tunesmith" else _lf_numbers(output))
    if "phases" in result:  # the wall clock's, as issue 15 counts it: command start to exit, less the training
        result["outside_training_s"] = round(end_to_end - result["phases"]["train"], 2)
    return result


def tunesmith_numbers(output: Path, exited: float) -> dict:
    """A finished `tunesmith train` run's figures from its output folder (train_summary.json, metrics.jsonl);
    `exited`: when its process ended (the exit phase runs from the summary's writing to then)."""
    summary = output / "train_summary.json"  # written right after the final save
    s = json.loads(summary.read_text())
    losses = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    return {"train_s": round(s["train_seconds"], 1), "train_tokens": s["train_tokens"],
            "tokens_per_s": s["train_tokens_per_s"], "steps": s["global_step"],
            "final_loss": losses[-1]["loss"] if losses else None, "logged_losses": [m["loss"] for m in losses],
            "allocated_peak_gib": s.get("peak_memory_gib"),
            "phases": {**s.get("phases", {}), "exit": round(exited - summary.stat().st_mtime, 2)},
            "start_up_parts": s.get("start_up_parts")}


def _lf_numbers(output: Path) -> dict:
    r = json.loads((output / "train_results.json").read_text())
    state = json.loads((output / "trainer_state.json").read_text()) if (output / "trainer_state.json").exists() else {}
    losses = [h["loss"] for h in state.get("log_history", []) if "loss" in h]
    # LLaMA-Factory's effective_tokens_per_sec counts every position of a packed row, padding included
    # (num_input_tokens_seen = steps x batch x cutoff): kept as reported_tokens_per_s; tokens_per_s is set from
    # the non-padding count of the same data (same_data_tokens) once a tunesmith run has counted it.
    return {"train_s": round(r["train_runtime"], 1), "reported_tokens_per_s": r.get("effective_tokens_per_sec"),
            "tokens_per_s": r.get("effective_tokens_per_sec"), "steps": state.get("global_step"),
            "final_loss": losses[-1] if losses else None}


def same_data_tokens(results: list[dict]) -> None:
    """LLaMA-Factory rows: training tokens/s = the non-padding tokens of the data (counted by tunesmith's run of
    the same YAML: same data, template and cutoff) / LLaMA-Factory's training seconds."""
    counted = next((r["train_tokens"] for r in results if r["tool"] == "tunesmith" and r.get("train_tokens")), None)
    for r in results:
        if r["tool"] == "llamafactory" and r["returncode"] == 0 and counted:
            r["train_tokens"], r["tokens_per_s"] = counted, counted / r["train_s"]


def flops_per_token(mean_len: float) -> float:
    """DESIGN.md's FLOPs per token of SHAPE, by `tunesmith bench`'s formula."""
    import types

    from tunesmith.bench import flops_per_token as of_config

    return of_config(types.SimpleNamespace(**SHAPE), mean_len)


def table(results: list[dict], mean_len: float) -> str:
    rows = ["| run | tool | training tokens/s | MFU | training | end to end | peak (nvidia-smi) | steps | final loss |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if r["returncode"] != 0:
            rows.append(f"| {r['name']} | {r['tool']} | failed (exit {r['returncode']}) | | | {r['end_to_end_s']} s | | | |")
            continue
        mfu = (r["tokens_per_s"] or 0) * flops_per_token(mean_len) / PEAK
        rows.append(f"| {r['name']} | {r['tool']} | {r['tokens_per_s'] / 1e3:.1f}k | {mfu:.0%} | {r['train_s']} s | "
                    f"{r['end_to_end_s']} s | {r['peak_gpu_gib']} GiB | {r['steps']} | {r['final_loss']:.4f} |")
    phases = [f"- {r['name']}: outside training {r['outside_training_s']} s (end to end less training); "
              + ", ".join(f"{k} {v} s" for k, v in r["phases"].items()) for r in results if r.get("phases")]
    return "\n".join(rows + ([""] + phases if phases else []))


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, settings = text.partition("=")
    pairs = [item.split("=", 1) for item in settings.split(",") if item]
    return name, {key: value for key, value in pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--run", action="append", default=[], help="NAME=key=value,key=value (tunesmith variant)")
    parser.add_argument("--no_as_is", action="store_true", help="skip the tunesmith run of the YAML as is")
    parser.add_argument("--llamafactory", metavar="SITE", help="a site directory holding LLaMA-Factory and its pins")
    parser.add_argument("--tiny", action="store_true", help="the tiny model and short samples, on the CPU")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    facts = prepare(args.work, args.samples, args.tiny)
    print(f"workload ready in {time.perf_counter() - t0:.0f} s: {facts}", flush=True)
    log_dir = args.work / "logs"
    log_dir.mkdir(exist_ok=True)
    plan = ([] if args.no_as_is else [("tunesmith-as-is", "tunesmith", {})])
    plan += [(name, "tunesmith", o) for name, o in map(parse_variant, args.run)]
    if args.llamafactory:
        plan.insert(0, ("llamafactory-as-is", "llamafactory", {}))
    if args.tiny:
        plan = [(name, tool, {**TINY_OVERRIDES, **o}) for name, tool, o in plan]
    results = []
    for name, tool, overrides in plan:
        results.append(run_one(args.work, name, tool, overrides, args.llamafactory, log_dir))
        print(json.dumps(results[-1]), flush=True)
        if args.out:
            args.out.write_text(json.dumps({"data": facts, "results": results}, indent=1))
    same_data_tokens(results)
    if args.out:
        args.out.write_text(json.dumps({"data": facts, "results": results}, indent=1))
    print(table(results, facts["mean_len"]))
    shutil.rmtree(args.work / "runs", ignore_errors=True)


if __name__ == "__main__":
    main()
