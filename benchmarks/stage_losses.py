"""Per-step losses, gradient norms (and eval losses, rewards) of every stage on the tiny models, CPU, fixed seed (the redesign's no-regression check).

    python benchmarks/stage_losses.py OUT.json        # run every case, write {case: [loss per step, ...]}
    python benchmarks/stage_losses.py OUT.json --compare BEFORE.json   # also compare, exit 1 on a difference > 1e-6

Each case runs the real CLI with logging_steps=1 and reads metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["logging_steps=1", "save_strategy=no", "overwrite_output_dir=true", "report_to=none", "plot_loss=false"]
CASES = {
    "sft_full": ["examples/quickstart.yaml", "max_steps=4"],
    "sft_lora_accum": ["examples/quickstart.yaml", "finetuning_type=lora", "per_device_train_batch_size=2",
                       "gradient_accumulation_steps=3", "max_steps=3"],
    "pt_packed": ["examples/qwen3_pt.yaml", "max_steps=3"],
    "rm": ["examples/qwen3_rm.yaml", "max_steps=3", "eval_strategy=no", "val_size=0"],
    "dpo_eval": ["examples/qwen3_dpo.yaml", "max_steps=2", "eval_strategy=steps", "eval_steps=1", "max_samples=40"],
    "dpo_sigmoid": ["examples/qwen3_dpo.yaml", "max_steps=3", "eval_strategy=no", "val_size=0"],
    "dpo_lora_ipo": ["examples/qwen3_dpo.yaml", "max_steps=3", "eval_strategy=no", "val_size=0",
                     "finetuning_type=lora", "pref_loss=ipo"],
    "dpo_simpo": ["examples/qwen3_dpo.yaml", "max_steps=3", "eval_strategy=no", "val_size=0", "pref_loss=simpo"],
    "kto": ["examples/qwen3_kto.yaml", "max_steps=3", "eval_strategy=no", "val_size=0"],
    "dpo_precomputed": ["examples/qwen3_dpo.yaml", "max_steps=2", "eval_strategy=no", "val_size=0",
                        "pref_reference=precomputed"],
    "vl_sft": ["examples/qwen3_vl_sft.yaml", "max_steps=2", "gradient_accumulation_steps=2",
               "preprocessing_num_workers=1", "dataloader_num_workers=0"],
}
GRPO = ["model_name_or_path=tiny:qwen3", "dataset=digit_sums_rl", "template=qwen3_nothink", "num_generations=4",
        "prompts_per_step=4", "max_new_tokens=6", "per_device_train_batch_size=8", "max_steps=2",
        "finetuning_type=full", "learning_rate=1e-3", "reward_funcs=[stage_losses:varied_reward]", "eval_strategy=no"]
for stage in ("grpo", "dr_grpo", "dapo", "gspo", "gspo_token", "reinforce"):
    CASES[stage] = [f"stage={stage}", *GRPO]
CASES["dapo_dynamic"] = ["stage=dapo", *GRPO, "reward_funcs=[accuracy,stage_losses:varied_reward]"]
CASES["grpo_kl_ppo2"] = ["stage=grpo", *GRPO, "kl_coef=0.05", "ppo_epochs=2", "num_mini_batches=2",
                         "finetuning_type=lora"]


def varied_reward(prompts, responses, samples, **kw):
    """Differs inside every group (the untrained tiny model earns no real reward), so the losses are not 0."""
    return [float(len(r) % 3) + 0.1 * i for i, r in enumerate(responses)]


def run_case(args: list[str], out: Path) -> list[float]:
    cmd = [sys.executable, "-m", "tunesmith", "train", *args, *COMMON, f"output_dir={out}"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT / "benchmarks")]))}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r[k] for r in rows for k in ("loss", "grad_norm", "eval_loss", "reward_mean") if k in r]


def main() -> int:
    target = Path(sys.argv[1])
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in CASES.items():
            results[name] = run_case(args, Path(tmp) / name)
            print(name, results[name], flush=True)
    target.write_text(json.dumps(results, indent=1))
    if "--compare" in sys.argv:
        before = json.loads(Path(sys.argv[sys.argv.index("--compare") + 1]).read_text())
        bad = 0
        for name, losses in results.items():
            old = before.get(name)
            diff = max((abs(a - b) for a, b in zip(old, losses)), default=0.0) if old else None
            same = old is not None and len(old) == len(losses) and diff <= 1e-6
            bad += not same
            print(f"{name:<16} {'same' if same else 'DIFFERENT'} (max |diff| {diff})")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
