"""The OpenAI-compatible HTTP API over one Engine (FastAPI): wiring, errors, authentication.

Every error a client gets is OpenAI's shape, {"error": {"message", "type", "param", "code"}}, with the
HTTP status that says whose fault it is; an error inside the server is a 500 of that shape, logged,
and the server goes on serving.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass, field

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..errors import TunesmithError
from ..infer.options import GenerationKeys
from .engine import Engine
from .errors import RequestError, error_body
from .limits import Limiter
from .routes import Routes

log = logging.getLogger("tunesmith")


@dataclass(frozen=True)
class Settings:
    max_request_bytes: int = 20_000_000
    max_concurrent: int = 4
    max_queue: int = 100
    allow_local_media: bool = True
    api_key: str | None = None  # from the environment (API_KEY), never from a file
    loopback: bool = True  # bound to a loopback address: only this machine's names may be in the Host header
    generation: GenerationKeys = field(default_factory=GenerationKeys)  # what a request leaves unset


def create_app(engine: Engine, settings: Settings = Settings()) -> FastAPI:
    app = FastAPI(title="tunesmith", summary="OpenAI-compatible API of a tunesmith model", docs_url=None,
                  redoc_url=None)
    routes = Routes(engine, settings, Limiter(settings.max_concurrent, settings.max_queue))
    _install_error_handlers(app)
    app.get("/health")(routes.health)
    api = APIRouter(prefix="/v1", dependencies=[Depends(_browser_check(settings.loopback)),
                                                Depends(_api_key_check(settings.api_key))])
    api.get("/models")(routes.list_models)
    api.get("/models/{name:path}")(routes.get_model)
    api.post("/chat/completions")(routes.chat_completions)
    api.post("/completions")(routes.completions)
    app.include_router(api)
    app.state.routes = routes
    return app


def _api_key_check(api_key: str | None):
    async def check(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), api_key.encode()):
            raise RequestError("Missing or wrong API key: send the header 'Authorization: Bearer <key>' with the "
                               "key the server was started with (its API_KEY).", status=401,
                               code="invalid_api_key")

    return check


_LOCAL_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def _host_name(value: str) -> str:
    """The host of a Host header or an Origin URL, without scheme and port ('[::1]' keeps its brackets)."""
    netloc = value.split("://", 1)[-1].split("/", 1)[0].lower()
    if netloc.startswith("["):
        return netloc[:netloc.index("]") + 1] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def _browser_check(loopback: bool):
    """Web pages of other sites cannot use the server through a visitor's browser: a request with an Origin
    of another host is refused (there are no CORS headers either), and on loopback a Host header that is not
    this machine's name (DNS rebinding) is refused."""

    async def check(request: Request) -> None:
        origin = request.headers.get("origin")
        host = _host_name(request.headers.get("host", ""))
        if origin and _host_name(origin) != host:
            raise RequestError(f"requests from web pages of other sites ({origin}) are refused", status=403,
                               code="cross_origin")
        if loopback and host and host not in _LOCAL_NAMES and not host.startswith("127."):
            raise RequestError(f"Host '{host}' is not this machine's name; the server listens on loopback only",
                               status=403, code="bad_host")

    return check


def _install_error_handlers(app: FastAPI) -> None:
    async def request_error(request: Request, err: RequestError):
        return JSONResponse(err.body(), status_code=err.status)

    async def tunesmith_error(request: Request, err: TunesmithError):
        return JSONResponse(error_body(str(err)), status_code=400)

    async def http_error(request: Request, err: HTTPException):
        message = {404: f"Invalid URL ({request.method} {request.url.path})",
                   405: f"Method {request.method} is not allowed on {request.url.path}"}.get(err.status_code,
                                                                                        str(err.detail))
        return JSONResponse(error_body(message, code=None), status_code=err.status_code, headers=err.headers)

    async def validation_error(request: Request, err: RequestValidationError):
        return JSONResponse(error_body(f"invalid request: {err.errors()[:3]}"), status_code=400)

    async def server_error(request: Request, err: Exception):
        log.error("%s %s failed: %s: %s", request.method, request.url.path, type(err).__name__, err, exc_info=err)
        return JSONResponse(error_body(f"The server failed on this request ({type(err).__name__}: {err}); it "
                                       "goes on serving others.", "server_error"), status_code=500)

    app.add_exception_handler(RequestError, request_error)
    app.add_exception_handler(TunesmithError, tunesmith_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, server_error)
