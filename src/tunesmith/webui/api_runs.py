"""The runs pages' API: every run of the root, one run's metrics (incrementally), config and log, Stop."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from . import runs


class RunRef(BaseModel):
    run: str


def router(state) -> APIRouter:
    api = APIRouter()

    @api.get("/runs")
    def list_runs():
        folders = state.root.discover()
        return {"runs_root": str(state.runs_root),
                "runs": [runs.summary(state.root, f, state.launcher.state(f)) for f in folders]}

    @api.get("/run/metrics")
    def metrics(run: str, offset: int = 0):
        rows, new_offset = runs.read_rows(state.root.run_dir(run), offset)
        return {"rows": rows, "offset": new_offset, "reset": new_offset < offset}

    @api.get("/run/info")
    def info(run: str):
        folder = state.root.run_dir(run)
        name, text = runs.config_text(folder)
        return {**runs.summary(state.root, folder, state.launcher.state(folder)), "config_file": name,
                "config": text, "output_dir": str(folder)}

    @api.get("/run/log")
    def log(run: str, offset: int = 0):
        folder = state.root.run_dir(run)
        text, new_offset = runs.log_chunk(folder, offset)
        return {"text": text, "offset": new_offset, "reset": new_offset < offset,
                "exists": (folder / runs.LOG_FILE).is_file()}

    @api.post("/run/stop")
    def stop(body: RunRef):
        return {"status": state.launcher.stop(state.root.run_dir(body.run))}

    return api
