"""Who may use the web UI: local by default, a token on any other address, every request checked.

- Bound to a loopback address (127.0.0.1, ::1, localhost) no token is needed unless one is given; the Host
  header must then name a loopback host too, so a web page elsewhere cannot reach the server through a DNS
  name that resolves to 127.0.0.1 (DNS rebinding).
- Bound to any other address a token is required: --token, else TUNESMITH_WEBUI_TOKEN, else a new random one
  printed at start. A request carries it as `Authorization: Bearer <token>`, as the cookie the page sets, or
  once as `?token=` in the URL (the server then sets the cookie and drops it from the address bar).
- A request that changes something (any method but GET/HEAD) from a page of another origin is refused, and
  such requests must be JSON, which a cross-site form cannot send.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from urllib.parse import urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

TOKEN_ENV = "TUNESMITH_WEBUI_TOKEN"
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def access_token(host: str, given: str | None, environ=None) -> tuple[str | None, bool]:
    """(the token every request must carry or None, whether it was generated here and so must be printed)."""
    environ = os.environ if environ is None else environ
    token = given or environ.get(TOKEN_ENV) or None
    if token is not None or is_loopback(host):
        return token, False
    return secrets.token_urlsafe(32), True


def cookie_name(port: int) -> str:
    return f"tunesmith_webui_{port}"  # one per port: two web UIs on one host keep their own tokens


class Guard:
    """The checks every request passes before it reaches a route (an HTTP middleware)."""

    def __init__(self, host: str, port: int, token: str | None):
        self.local, self.port, self.token = is_loopback(host), port, token
        self.cookie = cookie_name(port)

    async def __call__(self, request: Request, call_next) -> Response:
        refusal = self._refusal(request)
        if refusal is not None:
            return refusal
        if (self.token is not None and self._matches(request.query_params.get("token", ""))
                and request.method == "GET" and not request.url.path.startswith("/api/")):
            return self._set_cookie(request)
        return await call_next(request)

    def _refusal(self, request: Request) -> Response | None:
        if self.local and not is_loopback(urlsplit(f"//{request.headers.get('host', '')}").hostname or ""):
            return JSONResponse({"error": "this web UI is bound to a loopback address; open it as localhost or "
                                          "127.0.0.1"}, status_code=400)
        if request.method not in _SAFE_METHODS:
            problem = self._cross_site(request)
            if problem:
                return JSONResponse({"error": problem}, status_code=403)
        if self.token is not None and not self._authorised(request):
            return self._unauthorised(request)
        return None

    def _cross_site(self, request: Request) -> str | None:
        origin = request.headers.get("origin")
        if origin and urlsplit(origin).netloc != request.headers.get("host"):
            return f"a request from another origin ({origin}) is refused"
        if not request.headers.get("content-type", "").startswith("application/json"):
            return "requests that change something must be JSON (Content-Type: application/json)"
        return None

    def _authorised(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        offered = [header[7:] if header.lower().startswith("bearer ") else "",
                   request.cookies.get(self.cookie, ""), request.query_params.get("token", "")]
        return any(self._matches(o) for o in offered)

    def _matches(self, offered: str) -> bool:
        return bool(offered) and hmac.compare_digest(offered.encode(), self.token.encode())

    def _set_cookie(self, request: Request) -> Response:
        """`?token=` worked: keep it in a cookie and send the browser to the same address without it."""
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(self.cookie, self.token, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response

    def _unauthorised(self, request: Request) -> Response:
        if request.url.path.startswith("/api/") or "text/html" not in request.headers.get("accept", ""):
            return JSONResponse({"error": "a token is needed: open the URL `tunesmith webui` printed (it ends in "
                                          "?token=...), or send Authorization: Bearer <token>"}, status_code=401)
        return HTMLResponse(_LOGIN_PAGE, status_code=401)


_LOGIN_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>tunesmith web UI: token</title>
<style>body{font:15px system-ui,sans-serif;margin:4em auto;max-width:32em}input{width:100%;padding:.4em}</style>
</head><body><h1>tunesmith web UI</h1>
<p>This web UI is reachable from the network, so it needs its access token. <code>tunesmith webui</code> printed
it when it started (also in the URL it printed), or it is the one given with <code>--token</code> /
<code>TUNESMITH_WEBUI_TOKEN</code>.</p>
<form method="get" action="/"><label>Token <input name="token" type="password" autofocus></label>
<p><button type="submit">Open</button></p></form></body></html>"""
