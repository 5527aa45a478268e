"""`tunesmith serve`: load the engine once, then serve the API with uvicorn until interrupted.

Where it listens: the host/port keys (or --host/--port), else LLaMA-Factory's API_HOST/API_PORT
environment variables, else 127.0.0.1:8000. On a loopback address only this machine can connect;
any other address needs an API key (the API_KEY environment variable; never a YAML key, so it is
not saved or logged), and local-file image URLs are off there unless allow_local_media says so.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import logging
import os

from ..errors import ConfigError, TunesmithError
from ..infer.options import ServeOptions
from .backends import load_engine
from .engine import Engine

log = logging.getLogger("tunesmith")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen_address(options: ServeOptions, env: dict | None = None) -> tuple[str, int]:
    env = os.environ if env is None else env
    host = options.serve.host or env.get("API_HOST") or "127.0.0.1"
    port = options.serve.port
    if port is None:
        raw = env.get("API_PORT") or "8000"
        if not raw.isdigit() or int(raw) > 65535:
            raise ConfigError([f"API_PORT={raw!r} is not a port number (0-65535)"])
        port = int(raw)
    return host, port


def check_installed() -> None:
    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise TunesmithError(f"`tunesmith serve` needs {' and '.join(missing)}: pip install 'tunesmith[serve]'")


def settings_for(options: ServeOptions, host: str, env: dict | None = None):
    """The server's limits and access rules; an address beyond this machine without API_KEY is refused."""
    from .app import Settings

    env = os.environ if env is None else env
    api_key = env.get("API_KEY") or None
    local = is_loopback(host)
    if not local and api_key is None:
        raise ConfigError([f"host {host} accepts connections from other machines, so the server needs an API key: "
                           "set the API_KEY environment variable (clients send it as 'Authorization: Bearer "
                           "<key>'), or bind 127.0.0.1"])
    keys = options.serve
    return Settings(max_request_bytes=int(keys.max_request_mb * 1e6), max_concurrent=keys.max_concurrent,
                    max_queue=keys.max_queue, api_key=api_key, generation=options.generation, loopback=local,
                    allow_local_media=keys.allow_local_media if keys.allow_local_media is not None else local)


def build(options: ServeOptions, env: dict | None = None):
    """(engine, app, host, port); everything a bad config can refuse is refused before the model loads."""
    check_installed()
    from .app import create_app

    host, port = listen_address(options, env)
    settings = settings_for(options, host, env)
    engine: Engine = load_engine(options, options.serve.adapters(), options.serve.served_model_name)
    return engine, create_app(engine, settings), host, port


def serve(options: ServeOptions) -> None:
    import uvicorn

    engine, app, host, port = build(options)
    config = uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    names = ", ".join(engine.models)
    log.info("serving %s with %s; OpenAI API at http://%s:%s/v1 (Ctrl-C stops)", names,
             options.model.infer_backend, host if ":" not in host else f"[{host}]", port)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C / SIGINT after its graceful shutdown: the normal stop
        log.info("server stopped")
    finally:
        engine.close()
