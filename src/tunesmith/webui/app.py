"""The FastAPI app: the page (static/), the JSON API (api_*.py), and the Guard (auth.py) before all of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from ..errors import TunesmithError
from .auth import Guard
from .exporter import Exporter
from .launcher import Launcher
from .runs import RunsRoot

STATIC = Path(__file__).parent / "static"


@dataclass
class WebUIState:
    """What the routes share: the runs root, the training subprocesses, export jobs, the chat models."""

    runs_root: Path
    cwd: Path
    host: str = "127.0.0.1"
    port: int = 7860
    token: str | None = None
    root: RunsRoot = field(init=False)
    launcher: Launcher = field(init=False)
    exporter: Exporter = field(init=False)
    chat: object = field(init=False)

    def __post_init__(self):
        from .chat import ChatModels

        self.runs_root = Path(self.runs_root).resolve()
        self.runs_root.mkdir(parents=True, exist_ok=True)
        self.root = RunsRoot(self.runs_root)
        self.launcher = Launcher(self.runs_root, self.cwd)
        self.exporter = Exporter(self.runs_root)
        self.chat = ChatModels()


def build_app(state: WebUIState) -> FastAPI:
    from . import api_config, api_models, api_runs

    app = FastAPI(title="tunesmith web UI", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.webui = state
    app.middleware("http")(Guard(state.host, state.port, state.token))
    app.exception_handler(TunesmithError)(_user_error)
    for module in (api_config, api_runs, api_models):
        app.include_router(module.router(state), prefix="/api")
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.get("/", include_in_schema=False)(_index)
    return app


async def _index():
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})


async def _user_error(request: Request, err: TunesmithError):
    """A mistake the user can fix: its message, with the problems listed when there are several."""
    problems = getattr(err, "problems", None)
    return JSONResponse({"error": str(err), "problems": problems}, status_code=400)
