"""Start the web UI under uvicorn: decide the token, print where to open it, serve until Ctrl-C."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import TunesmithError
from .auth import TOKEN_ENV, access_token, is_loopback

DEFAULT_PORT = 7860  # LlamaBoard's, so a LLaMA-Factory user's bookmark still works
DEFAULT_RUNS_ROOT = "saves"  # LLaMA-Factory's and the examples' output root


def check_installed() -> None:
    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise TunesmithError(f"tunesmith webui needs {' and '.join(missing)}; pip install 'tunesmith[webui]'")


def page_url(host: str, port: int, token: str | None) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def banner(host: str, port: int, runs_root: Path, token: str | None, generated: bool) -> str:
    lines = [f"tunesmith web UI: {page_url(host, port, token)}", f"runs root: {runs_root}"]
    if not is_loopback(host):
        where = "generated for this session" if generated else f"from --token or {TOKEN_ENV}"
        lines.append(f"bound to {host}: reachable from the network; every request needs the token ({where})")
    lines.append("Ctrl-C stops the web UI (runs it launched keep training)")
    return "\n".join(lines)


def run_webui(host: str, port: int, runs_root: str, token: str | None = None) -> int:
    check_installed()
    import uvicorn

    from .app import WebUIState, build_app

    token, generated = access_token(host, token)
    state = WebUIState(runs_root=Path(runs_root), cwd=Path.cwd(), host=host, port=port, token=token)
    print(banner(host, port, state.runs_root, token, generated), flush=True)
    uvicorn.run(build_app(state), host=host, port=port, log_level="warning")
    return 0
