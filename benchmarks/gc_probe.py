"""Python's cyclic garbage collector in a training run: its collections and their seconds, before training and in it.

    python benchmarks/gc_probe.py cfg.yaml [key=value ...]              # as `tunesmith train` runs it
    python benchmarks/gc_probe.py --no-pause cfg.yaml [key=value ...]   # the collector left on through set-up

Runs `tunesmith train` in this process with a gc callback and prints one JSON line: per generation, the number of
collections and their seconds before the training clock started and after it, with the run's phases
(train_summary.json). `--no-pause` makes tunesmith.collector.pause a no-op, as trees before it ran.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

_events: list[tuple[float, int, float]] = []  # (wall clock at the end, generation, seconds)
_began: list[float] = []


def _record(phase: str, info: dict) -> None:
    if phase == "start":
        _began.append(time.perf_counter())
    elif _began:
        _events.append((time.time(), info["generation"], time.perf_counter() - _began.pop()))


def _totals(events) -> dict:
    return {f"gen{g}": {"collections": sum(1 for e in events if e[1] == g),
                        "seconds": round(sum(e[2] for e in events if e[1] == g), 4)} for g in (0, 1, 2)}


def main(argv: list[str]) -> None:
    from tunesmith import cli, collector  # light: the libraries are imported inside cli.main, as the command does

    if argv and argv[0] == "--no-pause":
        collector.pause = lambda: None
        argv = argv[1:]
    gc.callbacks.append(_record)
    code = cli.main(["train", *argv])
    from tunesmith.config.load import build_config, parse_cli_items

    yaml_path, overrides = parse_cli_items(argv)
    output_dir = Path(build_config(yaml_path, overrides).output.output_dir)
    summary = json.loads((output_dir / "train_summary.json").read_text())
    from tunesmith.started import process_start

    train_start = process_start() + sum(summary["phases"][p] for p in ("start_up", "data", "model"))
    print(json.dumps({"returncode": code, "phases": summary["phases"],
                      "before_training": _totals([e for e in _events if e[0] < train_start]),
                      "in_training": _totals([e for e in _events if e[0] >= train_start])}))


if __name__ == "__main__":
    main(sys.argv[1:])
