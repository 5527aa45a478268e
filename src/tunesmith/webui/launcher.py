"""Training runs started from the page: `tunesmith train <output_dir>/webui_launch.yaml` in a subprocess, its
output captured to <output_dir>/train.log.

The subprocess is the CLI itself, so a run launched here is the run `tunesmith train` would make from the same
file (the YAML stays beside the run for that). Each run is its own process group, so Stop reaches the ranks a
multi-GPU launch starts; Stop sends SIGTERM, which tunesmith treats as a preemption: it saves a checkpoint at
the step boundary and exits. Closing the web UI leaves its runs training (training is the long part; the
page only watches it); a restarted web UI lists them again from their files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import TunesmithError
from .configs import export_yaml, secret_env
from .runs import LAUNCH_FILE, LOG_FILE


@dataclass
class Launched:
    process: subprocess.Popen
    output_dir: Path
    stopping: bool = False

    def state(self) -> str:
        code = self.process.poll()
        if code is None:
            return "stopping" if self.stopping else "running"
        if code == 0:
            return "finished"
        return "stopped" if self.stopping or code == 130 else "failed"


class Launcher:
    def __init__(self, runs_root: Path, cwd: Path):
        self.runs_root, self.cwd = Path(runs_root).resolve(), Path(cwd)
        self.runs: dict[Path, Launched] = {}
        self.lock = threading.Lock()

    def output_dir(self, flat: dict) -> Path:
        """The run's folder, as the subprocess will see it; it must lie inside the runs root, so the run shows
        on the Runs page and the page never writes elsewhere."""
        raw = Path(str(flat.get("output_dir") or "saves/run")).expanduser()
        path = (raw if raw.is_absolute() else self.cwd / raw).resolve()
        if path == self.runs_root or self.runs_root not in path.parents:
            raise TunesmithError(f"output_dir {path} is not inside the runs root {self.runs_root}; choose a folder "
                                 f"below it, e.g. {self.runs_root / 'my-run'}")
        return path

    def launch(self, flat: dict) -> Path:
        """Write the YAML into output_dir and start `tunesmith train` on it; returns output_dir."""
        out = self.output_dir(flat)
        with self.lock:
            current = self.runs.get(out)
            if current is not None and current.process.poll() is None:
                raise TunesmithError(f"a run is already training into {out}; stop it or choose another output_dir")
            out.mkdir(parents=True, exist_ok=True)
            config = out / LAUNCH_FILE
            config.write_text(export_yaml({**flat, "output_dir": str(out)}), encoding="utf-8")
            self.runs[out] = Launched(self._start(config, out / LOG_FILE, secret_env(flat)), out)
        return out

    def _start(self, config: Path, log_path: Path, secrets: dict[str, str]) -> subprocess.Popen:
        env = {**os.environ, **secrets, "PYTHONUNBUFFERED": "1", "COLUMNS": "120", "TERM": "dumb"}
        command = [sys.executable, "-m", "tunesmith", "train", str(config)]
        with open(log_path, "ab") as log:  # appended: a resumed run keeps the log of its first part
            log.write(f"==> {time.strftime('%Y-%m-%d %H:%M:%S')} tunesmith train {config}\n".encode())
            log.flush()
            return subprocess.Popen(command, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def state(self, output_dir: Path) -> str | None:
        launched = self.runs.get(Path(output_dir).resolve())
        return launched.state() if launched is not None else None

    def stop(self, output_dir: Path) -> str:
        """SIGTERM to the run's process group (it saves a checkpoint and exits)."""
        launched = self.runs.get(Path(output_dir).resolve())
        if launched is None or launched.process.poll() is not None:
            raise TunesmithError(f"no run launched from this page is training into {output_dir}")
        launched.stopping = True
        os.killpg(launched.process.pid, signal.SIGTERM)
        return launched.state()
