"""Export / merge jobs: `export_model` (infer/export.py, what `tunesmith export` runs) in a worker thread, so
the page stays responsive and shows the job's state."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TunesmithError

DTYPES = ("bfloat16", "float16", "float32")


@dataclass
class ExportJob:
    id: int
    model: str
    export_dir: str
    dtype: str
    state: str = "running"  # running / done / failed
    error: str = ""
    started: float = field(default_factory=time.time)
    finished: float | None = None

    def view(self) -> dict:
        return {"id": self.id, "model": self.model, "export_dir": self.export_dir, "dtype": self.dtype,
                "state": self.state, "error": self.error, "seconds": (self.finished or time.time()) - self.started}


class Exporter:
    def __init__(self, runs_root: Path):
        self.runs_root = Path(runs_root).resolve()
        self.jobs: dict[int, ExportJob] = {}
        self._ids = itertools.count(1)

    def target(self, export_dir: str) -> Path:
        """The export folder (relative to the runs root when not absolute); new or empty, inside the root."""
        path = Path(export_dir).expanduser()
        path = (path if path.is_absolute() else self.runs_root / path).resolve()
        if self.runs_root not in path.parents:
            raise TunesmithError(f"export_dir {path} is not inside the runs root {self.runs_root}")
        if path.exists() and any(path.iterdir()):
            raise TunesmithError(f"export_dir {path} is not empty; choose a new folder")
        return path

    def start(self, model_dir: Path, export_dir: str, dtype: str = "bfloat16") -> ExportJob:
        if dtype not in DTYPES:
            raise TunesmithError(f"export dtype '{dtype}' is not one of {', '.join(DTYPES)}")
        out = self.target(export_dir)
        job = ExportJob(next(self._ids), str(model_dir), str(out), dtype)
        self.jobs[job.id] = job
        threading.Thread(target=self._run, args=(job,), daemon=True, name=f"export-{job.id}").start()
        return job

    def _run(self, job: ExportJob) -> None:
        from ..infer.export import export_model

        try:
            export_model(job.model, job.export_dir, dtype=job.dtype)
            job.state = "done"
        except Exception as err:  # shown on the page; the server keeps serving
            job.state, job.error = "failed", f"{type(err).__name__}: {err}"
        job.finished = time.time()

    def get(self, job_id: int) -> ExportJob:
        if job_id not in self.jobs:
            raise TunesmithError(f"no export job {job_id}")
        return self.jobs[job_id]
