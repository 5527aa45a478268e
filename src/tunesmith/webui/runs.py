"""The runs of an output root, read from what each run writes into its output_dir while it trains.

A run is a folder holding metrics.jsonl (tunesmith's one row per logged step), trainer_log.jsonl
(LLaMA-Factory's format, which tunesmith writes too and LLaMA-Factory runs have alone), or a config saved by
tunesmith or by this web UI. Metrics are read incrementally: the page asks for the bytes after the offset it
has, and only whole lines are returned, so a line being written is read on the next poll.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..errors import TunesmithError

METRICS_FILE = "metrics.jsonl"
TRAINER_LOG = "trainer_log.jsonl"
LAUNCH_FILE = "webui_launch.yaml"  # the YAML the web UI wrote and ran
LOG_FILE = "train.log"  # the output of a run the web UI launched
CONFIG_FILES = ("tunesmith_config.yaml", LAUNCH_FILE, "training_args.yaml")  # resolved, as launched, LF's
_MARKERS = (METRICS_FILE, TRAINER_LOG, *CONFIG_FILES)
_MAX_DEPTH = 3  # LLaMA-Factory's layout is saves/<model>/<finetuning_type>/<run>
_RECENT_S = 120  # a run whose metrics changed this recently, and that this server did not launch, is running
# LLaMA-Factory's trainer_log field -> tunesmith's metric name (for runs that have no metrics.jsonl)
_LF_FIELDS = {"loss": "loss", "eval_loss": "eval_loss", "lr": "lr", "epoch": "epoch", "reward": "reward_mean",
              "accuracy": "rewards/accuracies", "throughput": "tokens_per_s"}


class RunsRoot:
    def __init__(self, root: Path):
        self.root = Path(root).resolve()

    def run_dir(self, run_id: str) -> Path:
        """The folder of a run id (its path below the root); never a path outside the root."""
        path = (self.root / run_id).resolve()
        if path != self.root and self.root not in path.parents:
            raise TunesmithError(f"run '{run_id}' is outside the runs root {self.root}")
        if not path.is_dir():
            raise TunesmithError(f"no run '{run_id}' under {self.root}")
        return path

    def run_id(self, path: Path) -> str:
        return Path(path).resolve().relative_to(self.root).as_posix() or "."

    def discover(self) -> list[Path]:
        """Every run folder below the root, newest first."""
        found: list[Path] = []
        self._walk(self.root, 0, found)
        return sorted(found, key=_last_change, reverse=True)

    def _walk(self, folder: Path, depth: int, found: list[Path]) -> None:
        if any((folder / m).is_file() for m in _MARKERS):
            found.append(folder)
            return  # a run's own sub-folders are its checkpoints, not runs
        if depth >= _MAX_DEPTH:
            return
        for child in child_dirs(folder):
            if not child.name.startswith("checkpoint-"):
                self._walk(child, depth + 1, found)


def child_dirs(folder: Path) -> list[Path]:
    """The folder's visible sub-folders, sorted; none when it cannot be listed."""
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def refusal_of(folder: Path, flat: dict) -> str | None:
    """Why `tunesmith train` would refuse to start into `folder`: it holds a finished or running run that the
    config neither resumes (it has no checkpoint) nor replaces (overwrite_output_dir). Checked before a launch,
    so the earlier run's launch file and log are not replaced by a run that would stop at once."""
    finished = (METRICS_FILE, TRAINER_LOG, "train_summary.json", "model.safetensors", "adapter_model.safetensors")
    if not any((folder / name).is_file() for name in finished) or flat.get("overwrite_output_dir") is True:
        return None
    if any(folder.glob("checkpoint-*")) and flat.get("resume_from_checkpoint") is not False:
        return None  # it resumes from its newest checkpoint, as on the command line
    return (f"output_dir {folder} already holds a run; set overwrite_output_dir: true to replace it, or choose "
            "another output_dir")


def _last_change(folder: Path) -> float:
    times = [(folder / m).stat().st_mtime for m in (*_MARKERS, LOG_FILE) if (folder / m).is_file()]
    return max(times, default=folder.stat().st_mtime)


def metrics_source(folder: Path) -> tuple[Path, bool]:
    """(the metrics file, whether it is LLaMA-Factory's trainer_log format)."""
    ours = folder / METRICS_FILE
    if ours.is_file() or not (folder / TRAINER_LOG).is_file():
        return ours, False
    return folder / TRAINER_LOG, True


def read_rows(folder: Path, offset: int = 0) -> tuple[list[dict], int]:
    """The metric rows written after byte `offset`, and the offset to ask from next time. A file that shrank
    (a resumed run rewrites it) is read again from the start; the caller sees `offset` go back."""
    path, lf = metrics_source(folder)
    if not path.is_file():
        return [], 0
    size = path.stat().st_size
    if offset > size:
        offset = 0
    with open(path, "rb") as fh:
        fh.seek(offset)
        chunk = fh.read(size - offset)
    whole = chunk[: chunk.rfind(b"\n") + 1]
    rows = [_row(line, lf) for line in whole.decode("utf-8", errors="replace").splitlines() if line.strip()]
    return [r for r in rows if r is not None], offset + len(whole)


def _row(line: str, lf: bool) -> dict | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(row, dict):
        return None
    if not lf:
        return row
    out = {"step": row.get("current_steps", 0)}
    out.update({ours: row[theirs] for theirs, ours in _LF_FIELDS.items() if theirs in row})
    return out


def _last_line(path: Path) -> dict | None:
    """The last whole JSON line of a file, reading only its end."""
    if not path.is_file():
        return None
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - 8192))
        lines = [ln for ln in fh.read().split(b"\n") if ln.strip()]
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


def _seconds(clock: str | None) -> float | None:
    """'1 day, 2:03:04' or '0:01:05' (trainer_log's clocks) -> seconds."""
    if not clock:
        return None
    days, _, rest = clock.rpartition(", ")
    try:
        h, m, s = (float(x) for x in rest.split(":"))
    except ValueError:
        return None
    return (int(days.split()[0]) if days else 0) * 86400 + h * 3600 + m * 60 + s


def progress(folder: Path) -> dict:
    """Step, total, percentage, elapsed and remaining seconds, from trainer_log.jsonl's last row."""
    last = _last_line(folder / TRAINER_LOG) or {}
    step, total = last.get("current_steps"), last.get("total_steps")
    if step is None:
        metrics_last = _last_line(folder / METRICS_FILE) or {}
        step = metrics_last.get("step")
    return {"step": step, "total": total or None,
            "percentage": last.get("percentage") if total else None,
            "elapsed_s": _seconds(last.get("elapsed_time")), "eta_s": _seconds(last.get("remaining_time"))}


def status(folder: Path, process_state: str | None) -> str:
    """running / finished / failed / stopped. `process_state`: what the launcher knows (None: not launched by
    this server, or before it started)."""
    if process_state is not None:
        return process_state
    if (folder / "train_summary.json").is_file() or (folder / "all_results.json").is_file():
        return "finished"
    if time.time() - _last_change(folder) < _RECENT_S:
        return "running"
    return "stopped"


def config_text(folder: Path) -> tuple[str | None, str]:
    """(which file, its text): the resolved config if the run got that far, else the one it was launched with."""
    for name in CONFIG_FILES:
        if (folder / name).is_file():
            return name, (folder / name).read_text(encoding="utf-8", errors="replace")
    return None, ""


def log_chunk(folder: Path, offset: int = 0, limit: int = 256_000) -> tuple[str, int]:
    """The log after byte `offset` (at most `limit` bytes, the newest ones when there are more)."""
    path = folder / LOG_FILE
    if not path.is_file():
        return "", 0
    size = path.stat().st_size
    offset = 0 if offset > size else offset
    start = max(offset, size - limit)
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read(size - start)
    return data.decode("utf-8", errors="replace"), size


def summary(root: RunsRoot, folder: Path, process_state: str | None) -> dict:
    """One line of the runs table."""
    last_rows, _ = read_rows(folder, max(0, _size(metrics_source(folder)[0]) - 4096))
    latest: dict = {}
    for row in last_rows:
        latest.update({k: v for k, v in row.items() if isinstance(v, (int, float))})
    return {"id": root.run_id(folder), "name": folder.name, "status": status(folder, process_state),
            "progress": progress(folder), "latest": latest, "updated": _last_change(folder),
            "has_log": (folder / LOG_FILE).is_file()}


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0
