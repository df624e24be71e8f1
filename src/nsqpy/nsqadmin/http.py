"""nsqadmin's HTTP server: the page routes, ``/static``, ``/api`` and ``/config`` (Go:
``nsqadmin/http.go``). The route table is :meth:`AdminHTTP.routes`; every route lives under
``--base-path``.

Beyond Go (additive): ``/api/overview``, ``/api/history`` and ``/metrics`` (the poller's rates,
history and Prometheus gauges), ``/api/topics/:topic/:channel/inspect`` (nsqpy nsqd's
``--enable-inspect`` listings), an ``unreachable`` list beside Go's ``WARNING:`` message,
``total_topics`` on a node, tombstoned producers kept on topic and channel pages, refusal
of cross-site writes, and ``POST /api/topics/:topic/:channel/clients`` (kick a client, kick.py).
"""

from __future__ import annotations

import posixpath
from urllib.parse import urlsplit

from aiohttp import hdrs, web
from aiohttp.web import ContentCoding

from ..internal.http_api import (
    LOGGER,
    Handler,
    RouteHandler,
    add_routes,
    router_middleware,
    v1_errors,
    v1_json,
)
from . import kick
from .api_actions import ActionHandlers
from .api_read import ReadHandlers
from .metrics import cluster_metrics_handler
from .pages import PAGE_ROUTES, PageHandlers

_WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})


def normalize_base_path(path: str) -> str:
    """Go's ``normalizeBasePath``: a leading ``/``, then ``path.Clean``."""
    if not path:
        return "/"
    if not path.startswith("/"):
        path = "/" + path
    return clean_path(path)


def clean_path(path: str) -> str:
    """Go's ``path.Clean`` for an absolute path (one leading ``/``, no trailing one)."""
    cleaned = posixpath.normpath(path)
    return "/" + cleaned.lstrip("/") if cleaned.startswith("/") else cleaned


def join_base(base: str, path: str) -> str:
    """Go's ``path.Join(base, p)``."""
    return clean_path(f"{base}/{path}")


# --------------------------------------------------------------------------- middlewares


@web.middleware
async def compress(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Go's ``CompressHandler``: gzip or deflate, whichever ``Accept-Encoding`` names first."""
    response = await handler(request)
    if isinstance(response, web.Response) and response.body is not None:
        for token in request.headers.get(hdrs.ACCEPT_ENCODING, "").split(","):
            token = token.strip()
            if token in ("gzip", "deflate"):
                coding = ContentCoding.gzip if token == "gzip" else ContentCoding.deflate
                response.enable_compression(coding)
                response.headers.add(hdrs.VARY, "Accept-Encoding")
                break
    return response


def is_cross_site(request: web.Request) -> bool:
    """A browser's write from another origin: ``Origin``'s host:port is not ours, or the
    browser says ``Sec-Fetch-Site: cross-site``. Requests without ``Origin`` (scripts, curl)
    are not cross-site."""
    if request.headers.get("Sec-Fetch-Site", "") == "cross-site":
        return True
    origin_header = request.headers.get("Origin")
    if origin_header is None:
        return False
    scheme = urlsplit(origin_header).scheme
    default_port = 443 if scheme == "https" else 80  # a Host without a port: the same scheme
    origin = _host_and_port(origin_header.partition("://")[2], default_port)
    if not origin[0]:
        return True  # "null" and other opaque origins
    # behind a reverse proxy the browser's host may arrive as X-Forwarded-Host
    hosts = [request.host, request.headers.get("X-Forwarded-Host", "").split(",")[0].strip()]
    return all(origin != _host_and_port(host, default_port) for host in hosts if host)


def _host_and_port(host: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(f"//{host}")
    try:
        return ((parts.hostname or "").lower(), parts.port or default_port)
    except ValueError:  # a port that is not a number matches nothing
        return ("", 0)


# --------------------------------------------------------------------------- the server


class AdminHTTP(PageHandlers, ReadHandlers, ActionHandlers):
    """The route table and the app: pages (``pages.py``), the read API (``api_read.py``) and
    the actions (``api_actions.py``) under ``--base-path``."""

    def routes(self) -> list[tuple[str, str, RouteHandler]]:
        table: list[tuple[str, str, RouteHandler]] = [("GET", p, self.index) for p in PAGE_ROUTES]
        table += [
            ("GET", "/ping", self.ping),
            ("GET", "/static/{asset:.+}", self.static_asset),
            ("GET", "/fonts/{asset:.+}", self.static_asset),
            ("GET", "/api/topics", self.topics),
            ("GET", "/api/topics/{topic}", self.topic),
            ("GET", "/api/topics/{topic}/{channel}", self.channel),
            ("GET", "/api/topics/{topic}/{channel}/inspect", self.inspect_channel),
            ("GET", "/api/nodes", self.nodes),
            ("GET", "/api/nodes/{node}", self.node),
            ("POST", "/api/topics", self.create_topic_channel),
            ("POST", "/api/topics/{topic}", self.topic_action),
            ("POST", "/api/topics/{topic}/{channel}", self.channel_action),
            ("POST", "/api/topics/{topic}/{channel}/clients", self.kick_client),
            ("DELETE", "/api/nodes/{node}", self.tombstone_node_for_topic),
            ("DELETE", "/api/topics/{topic}", self.delete_topic),
            ("DELETE", "/api/topics/{topic}/{channel}", self.delete_channel),
            ("GET", "/api/counter", self.counter),
            ("GET", "/api/graphite", self.graphite),
            ("GET", "/api/overview", self.overview),
            ("GET", "/api/history", self.history),
            ("GET", "/metrics", cluster_metrics_handler(self.admin.history)),
            ("GET", "/config/{opt}", self.config),
            ("PUT", "/config/{opt}", self.config),
        ]
        if self.opts.proxy_graphite:
            table.append(("GET", "/render", self.render_proxy))
        return [(method, join_base(self.base, path), handler) for method, path, handler in table]

    def make_app(self) -> web.Application:
        app = web.Application(
            middlewares=[router_middleware(self.logger), compress, self.cross_site, v1_errors],
            client_max_size=2 * 1024 * 1024,
        )
        app[LOGGER] = self.logger
        add_routes(app, self.routes())
        return app

    @web.middleware
    async def cross_site(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method in _WRITE_METHODS and is_cross_site(request):
            self.logger.warn(
                f"refused cross-site {request.method} {request.path} "
                f"(Origin: {request.headers.get('Origin', '')})"
            )
            return v1_json({"message": "FORBIDDEN"}, 403)
        return await handler(request)

    async def kick_client(self, request: web.Request) -> web.Response:
        return await kick.kick_client(self, request)
