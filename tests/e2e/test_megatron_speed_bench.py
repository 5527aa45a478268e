"""benchmarks/megatron_speed.py: its pure parts on vectors, and its --tiny mode on the CPU end to end (slow): both
engines run through the real CLI, the JSON and the markdown table are written, and the two engines' per-step
losses agree (same weights, data and batch). The GPU run itself is recorded under benchmarks/results/."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import megatron_speed  # noqa: E402


def test_loss_agreement_and_the_table_name_failed_and_skipped_runs():
    results = [{"shape": "s", "engine": "single", "returncode": 0, "losses": [2.0, 1.0], "tokens_per_s": 2000.0,
                "run_tokens_per_s": 1500.0, "mfu": 0.4, "peak_memory_gib": 10.0, "nvidia_smi_peak_gib": 12.5,
                "last_loss": 1.0, "end_to_end_s": 30.0},
               {"shape": "s", "engine": "megatron", "returncode": 0, "losses": [2.0, 1.01], "tokens_per_s": 1000.0,
                "run_tokens_per_s": 900.0, "mfu": 0.2, "peak_memory_gib": None, "nvidia_smi_peak_gib": 0.0,
                "last_loss": 1.01, "end_to_end_s": 40.0},
               {"shape": "b", "engine": "single", "returncode": 1, "end_to_end_s": 5.0},
               {"shape": "b", "engine": "megatron", "returncode": "skipped", "note": "skipped: the 420 s budget"}]
    agreement = megatron_speed.loss_agreement(results)
    assert agreement == {"s": pytest.approx(0.01)}
    text = megatron_speed.table(results, agreement)
    assert "| s | single | 2.0k | 1.5k | 40.0% | 10.0 GiB | 12.5 GiB | 1.0000 | 30.0 s |" in text
    assert "| s | megatron | 1.0k | 0.9k | 20.0% | n/a | n/a | 1.0100 |" in text
    assert "| b | single | failed: 1 |" in text and "| b | megatron | skipped: the 420 s budget |" in text


@pytest.mark.slow
def test_the_tiny_mode_runs_both_engines_and_writes_the_report(tmp_path):
    pytest.importorskip("megatron.core")
    proc = subprocess.run([sys.executable, "benchmarks/megatron_speed.py", "--work", str(tmp_path / "work"), "--out",
                           str(tmp_path / "out"), "--tiny", "--steps", "3"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "megatron_speed.json").read_text())
    assert [(r["engine"], r["returncode"], r["steps"]) for r in report["results"]] == [("single", 0, 3),
                                                                                        ("megatron", 0, 3)]
    assert report["loss_agreement"]["tiny"] < 1e-4 and all(r["tokens_per_s"] > 0 for r in report["results"])
    assert "| tiny | megatron |" in (tmp_path / "out" / "megatron_speed.md").read_text()
    assert "Megatron-Core engine" in (tmp_path / "out" / "logs" / "tiny-megatron.log").read_text()
