"""benchmarks/vl8b_engines.py (issue 20's benchmark): its pure parts, every run's config resolved as `tunesmith
train` would (the --dry-run), and one layout run end to end on the tiny Qwen3-VL over two CPU processes (slow): the
JSON and the markdown table are written. The GPU runs themselves are recorded under benchmarks/results/."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import vl8b_engines  # noqa: E402


def test_the_table_splits_the_phases_and_names_failed_and_skipped_runs():
    ok = {"name": "zero2", "returncode": 0, "end_to_end_s": 200.0, "peak_gpu_gib": [60.1, 61.5], "final_loss": 1.5,
          "steps": 125, "tokens_per_s": 12345.0, "mfu_llm": 0.31,
          "phases": vl8b_engines.phase_split({"start_up": 8.0, "model": 12.5, "data": 9.94, "train": 160.0,
                                              "final_save": 5.06})}
    results = [ok, {"name": "megatron_pp4", "returncode": 1},
               {"name": "zero3+packing", "returncode": "skipped", "note": "skipped: the 540 s budget"}]
    text = vl8b_engines.table(results)
    lines = text.splitlines()
    assert lines[2] == "| megatron_pp4 | failed: 1 |"  # in the order, whatever order they ran in
    assert lines[3] == ("| zero2 | 200.0 s | 20.5 s | 9.9 s | 160.0 s | 5.1 s | 12.3k | 31.0% | 61.5 GiB | 1.5000 | "
                        "125 |")
    assert lines[4] == "| zero3+packing | skipped: the 540 s budget |"


def test_every_run_resolves_as_tunesmith_train_would(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/vl8b_engines.py", "--work", str(tmp_path), "--samples", "4",
                           "--tiny", "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.split(":")[0] in vl8b_engines.ORDER]
    assert [line.split(":")[0] for line in lines] == vl8b_engines.ORDER
    engines = {line.split(":")[0]: line.rsplit("(engine: ", 1)[1].rstrip(")") for line in lines}
    assert engines["megatron_pp4"] == engines["megatron_tp2_pp2+packing"] == "megatron"
    assert engines["zero2"] == engines["zero3"] == "deepspeed" and engines["fsdp2+packing"] == "fsdp2"
    assert all("packing=true neat_packing=true" in line for line in lines if line.startswith(tuple(
        n for n in vl8b_engines.ORDER if n.endswith("+packing"))))


@pytest.mark.slow
def test_a_layout_runs_end_to_end_on_two_cpu_processes(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/vl8b_engines.py", "--work", str(tmp_path / "work"), "--out",
                           str(tmp_path / "out"), "--samples", "4", "--tiny", "--gpus", "2", "--only", "fsdp2",
                           "max_steps=1"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (result,) = json.loads((tmp_path / "out" / "vl8b.json").read_text())["results"]
    assert (result["name"], result["gpus"], result["returncode"], result["steps"]) == ("fsdp2", 2, 0, 1)
    assert result["tokens_per_s"] > 0 and set(result["phases"]) == {"start_up_and_model", "data", "train", "save"}
    assert "| fsdp2 |" in (tmp_path / "out" / "vl8b.md").read_text()
