"""HTTP conventions shared by nsqd, nsqlookupd and nsqadmin (Go: internal/http_api).

"V1" responses carry ``X-NSQ-Content-Type: nsq; version=1.0``; a string is sent raw, a structure
as compact Go-style JSON, an error as ``{"message": "<TEXT>"}`` with its status code.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web, web_protocol
from aiohttp.http import HttpVersion10, HttpVersion11

from . import lg
from .durations import format_duration
from .net import format_address

# Go answers a request it cannot parse with "HTTP/1.1 400 Bad Request"; aiohttp's template for
# such requests says HTTP/1.0. Peer tools match the status line, so use Go's version.
if hasattr(web_protocol, "ERROR") and hasattr(web_protocol.ERROR, "_replace"):
    web_protocol.ERROR = web_protocol.ERROR._replace(version=HttpVersion11)

V1_HEADERS = {"X-NSQ-Content-Type": "nsq; version=1.0"}
JSON_CONTENT_TYPE = "application/json; charset=utf-8"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RouteHandler = Callable[[web.Request], Awaitable[web.Response]]

#: The daemon's logger, for the middlewares below.
LOGGER: web.AppKey[lg.Logger] = web.AppKey("nsqpy_logger", lg.Logger)


def _go_floats(value: Any) -> Any:
    """Go prints integral floats without ``.0``; convert them so json emits ``1`` not ``1.0``."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {k: _go_floats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_go_floats(v) for v in value]
    return value


def go_json(value: Any) -> bytes:
    """Compact JSON escaped like Go's encoding/json (``<``, ``>``, ``&``, U+2028, U+2029)."""
    text = json.dumps(_go_floats(value), separators=(",", ":"), ensure_ascii=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return text.encode()


def v1_text(text: str | bytes, status: int = 200) -> web.Response:
    body = text.encode() if isinstance(text, str) else text
    return web.Response(
        body=body, status=status, headers=V1_HEADERS, content_type="text/plain", charset="utf-8"
    )


def v1_empty() -> web.Response:
    return web.Response(status=200, headers=V1_HEADERS)


def v1_json(value: Any, status: int = 200) -> web.Response:
    headers = {**V1_HEADERS, "Content-Type": JSON_CONTENT_TYPE}
    return web.Response(body=go_json(value), status=status, headers=headers)


def v1_error(status: int, message: str) -> web.Response:
    return v1_json({"message": message}, status)


def plain_text(text: str, status: int = 200) -> web.Response:
    """A non-V1 plain response (``/ping``)."""
    return web.Response(text=text, status=status, content_type="text/plain", charset="utf-8")


class ApiError(Exception):
    """Raised by handlers: becomes a V1 error response."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_bool_param(value: str | None, default: bool) -> bool | None:
    """``true``/``1``/``false``/``0``; anything else is None (the caller decides)."""
    if value is None:
        return default
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    return None


@web.middleware
async def v1_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Go's router behaviour: JSON 404/405, redirects for trailing slashes, 500 on a crash."""
    try:
        return await handler(request)
    except ApiError as exc:
        return v1_error(exc.status, exc.message)
    except web.HTTPMethodNotAllowed:
        return v1_error(405, "METHOD_NOT_ALLOWED")
    except web.HTTPNotFound:
        path = request.path
        if path.endswith("/") and len(path) > 1:
            target = path.rstrip("/")
            if _route_exists(request.app, target):
                raise _redirect(request, target) from None
        return v1_error(404, "NOT_FOUND")
    except web.HTTPException:
        raise
    except Exception:
        logger = request.app.get(LOGGER)
        if logger is not None:
            logger.error(f"HTTP: panic in {request.raw_path}")  # percent-encoded: no raw bytes
        return v1_error(500, "INTERNAL_ERROR")


def _route_exists(app: web.Application, path: str) -> bool:
    return any(getattr(resource, "canonical", None) == path for resource in app.router.resources())


def _redirect(request: web.Request, target: str) -> web.HTTPException:
    location = target + (f"?{request.query_string}" if request.query_string else "")
    if request.method == "GET":
        return web.HTTPMovedPermanently(location)
    return web.HTTPPermanentRedirect(location)


# --------------------------------------------------------------------------- Go's router


def add_routes(app: web.Application, routes: Iterable[tuple[str, str, RouteHandler]]) -> None:
    """Routes as httprouter has them: GET routes do not answer HEAD implicitly."""
    for method, path, handler in routes:
        if method == "GET":
            app.router.add_get(path, handler, allow_head=False)
        else:
            app.router.add_route(method, path, handler)


def allowed_methods(app: web.Application, path: str, exclude: str) -> str:
    """httprouter's ``Allow`` header value for a path: its methods, then OPTIONS."""
    methods: set[str] = set()
    for resource in app.router.resources():
        if not _resource_matches(resource, path):
            continue
        for route in resource:
            methods.add(route.method)
    methods.discard(exclude)
    methods.discard("OPTIONS")
    return ", ".join([*sorted(methods), "OPTIONS"]) if methods else ""


_GO_BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\n400 Bad Request"
)


def _malformed_request(request: web.Request) -> web.StreamResponse:
    """A request line without an HTTP version: aiohttp takes it for HTTP/0.9 and would answer
    in kind; Go's net/http calls it malformed. Answer as Go does and close."""
    transport = request.transport
    if transport is not None and not transport.is_closing():
        transport.write(_GO_BAD_REQUEST)
        transport.close()
    return web.Response(status=400)


def _resource_matches(resource: web.AbstractResource, path: str) -> bool:
    info = resource.get_info()
    pattern = info.get("pattern")
    if pattern is not None:  # a dynamic route such as /config/{opt}
        return pattern.fullmatch(path) is not None
    return info.get("path") == path


def router_middleware(logger: lg.Logger, unlogged: frozenset[str] = frozenset()) -> Any:
    """httprouter's OPTIONS answers and ``Allow`` on 405, and Go's ``http_api.Log`` line
    (``200 GET /stats (127.0.0.1:5000) 1.2ms``) for every path not in ``unlogged``."""

    @web.middleware
    async def router(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.version < HttpVersion10:
            return _malformed_request(request)
        start = time.perf_counter()
        if request.method == "OPTIONS":
            allow = allowed_methods(request.app, request.path, "OPTIONS")
            if allow:
                return web.Response(status=200, headers={"Allow": allow})
        response = await handler(request)
        if response.status == 405:
            allow = allowed_methods(request.app, request.path, request.method)
            if allow:
                response.headers["Allow"] = allow
        if request.path not in unlogged and logger.enabled(lg.INFO):
            elapsed = format_duration(time.perf_counter() - start)
            transport = request.transport
            remote = format_address(transport.get_extra_info("peername") if transport else "")
            line = f"{response.status} {request.method} {request.raw_path} ({remote}) {elapsed}"
            logger.info(line)
        return response

    return router
