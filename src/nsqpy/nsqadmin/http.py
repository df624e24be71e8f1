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

import base64
import ipaddress
import json
import mimetypes
import posixpath
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import aiohttp
from aiohttp import hdrs, web
from aiohttp.web import ContentCoding

from .. import NSQ_VERSION
from ..internal import lg
from ..internal.flags import render_value, specs
from ..internal.http_api import (
    LOGGER,
    ApiError,
    Handler,
    RouteHandler,
    add_routes,
    go_json,
    plain_text,
    router_middleware,
    v1_errors,
    v1_json,
)
from ..internal.net import format_address
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from . import clusterinfo as cluster
from . import kick
from .metrics import cluster_metrics_handler
from .options import COMMAND_ONLY, Options

if TYPE_CHECKING:
    from .nsqadmin import NSQAdmin

PACKAGE_DIR = Path(__file__).parent
STATIC_DIR = PACKAGE_DIR / "static"
TEMPLATE_PATH = PACKAGE_DIR / "templates" / "index.html"
CONFIG_PLACEHOLDER = "__NSQADMIN_CONFIG__"
PAGE_ROUTES = (
    "/",
    "/topics",
    "/topics/{topic}",
    "/topics/{topic}/{channel}",
    "/nodes",
    "/nodes/{node}",
    "/counter",
    "/lookup",
)
_WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})
_EXTRA_TYPES = {
    ".map": "application/json",
    ".svg": "image/svg+xml",
    ".woff": "application/font-woff",
    ".ttf": "application/font-sfnt",
    ".eot": "application/vnd.ms-fontobject",
    ".woff2": "application/font-woff2",
}


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


def warning_message(messages: list[str]) -> str:
    """Go's ``maybeWarnMsg``."""
    return "WARNING: " + "; ".join(messages) if messages else ""


def is_valid_node(node: str) -> bool:
    """A node as the API names one: ``host:port`` (``[v6]:port``), port 1..65535."""
    host, _, port = node.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


#: ``n`` of ``/api/topics/:topic/:channel/inspect``: the default and the largest.
INSPECT_DEFAULT_N = 20
INSPECT_MAX_N = 100


def _inspect_limit(raw: str | None) -> int:
    if raw is None:
        return INSPECT_DEFAULT_N
    try:
        limit = int(raw)
    except ValueError:
        raise ApiError(400, "INVALID_N") from None
    if not 1 <= limit <= INSPECT_MAX_N:
        raise ApiError(400, "INVALID_N")
    return limit


def script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element (``<``, ``>``, ``&`` as ``\\u003c`` ...)."""
    return go_json(value).decode()


class Warnings:
    """The partial failures of one request: Go's message list plus nsqpy's ``unreachable``."""

    def __init__(self, logger: lg.Logger) -> None:
        self.logger = logger
        self.messages: list[str] = []
        self.failures: list[cluster.Failure] = []

    def add(self, failures: list[cluster.Failure]) -> None:
        if failures:
            text = "\n".join(f.error for f in failures)
            self.logger.warn(text)
            self.messages.append(text)
            self.failures.extend(failures)

    @property
    def message(self) -> str:
        return warning_message(self.messages)

    def unreachable(self) -> list[dict[str, str]]:
        seen: dict[str, str] = {}
        for failure in self.failures:
            seen.setdefault(failure.address, failure.error)
        return [{"address": a, "error": e} for a, e in seen.items()]


def upstream_error(logger: lg.Logger, what: str, exc: cluster.UpstreamError) -> ApiError:
    logger.error(f"failed to {what} - {exc}")
    return ApiError(502, f"UPSTREAM_ERROR: {exc}")


def _decode_json_body(raw: bytes) -> Any:
    """Go's ``json.NewDecoder(body).Decode``: the first JSON value; its error text on failure."""
    text = raw.decode("utf-8", "replace").lstrip()
    if not text:
        raise ValueError("EOF")
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text):
            raise ValueError("unexpected EOF") from None
        char = text[exc.pos]
        raise ValueError(f"invalid character {char!r} looking for beginning of value") from None
    return value


def _json_kind(value: Any) -> str:
    """The JSON kind as Go's decoder names it in its errors."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string" if isinstance(value, str) else "value"


def _string_field(body: Any, key: str) -> str:
    """``body[key]`` decoded into a Go string field (absent or null: ``""``)."""
    if not isinstance(body, dict):
        raise ValueError(f"json: cannot unmarshal {_json_kind(body)} into Go value")
    value = body.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(
            f"json: cannot unmarshal {_json_kind(value)} into Go struct field .{key} of type string"
        )
    return value


def _basic_auth_user(request: web.Request) -> str:
    """Go's ``basicAuthUser``: the user name of an ``Authorization: Basic`` header."""
    scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
    if scheme != "Basic" or not encoded:
        return ""
    try:
        decoded = base64.b64decode(encoded, validate=True).decode("utf-8", "replace")
    except ValueError:
        return ""
    user, sep, _ = decoded.partition(":")
    return user if sep else ""


async def _read_limited(request: web.Request, limit: int) -> bytes:
    """At most ``limit`` bytes of the body (Go: ``io.LimitReader``)."""
    body = bytearray()
    while len(body) < limit:
        chunk = await request.content.read(limit - len(body))
        if not chunk:
            break
        body += chunk
    return bytes(body)


def _remote_addr(request: web.Request) -> str:
    """Go's ``req.RemoteAddr``: ``ip:port``."""
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return format_address(peer) if peer else ""


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


class AdminHTTP:
    """The route handlers; ``admin`` holds the options, the cluster client and the poller."""

    def __init__(self, admin: NSQAdmin) -> None:
        self.admin = admin
        self.base = admin.base_path

    @property
    def opts(self) -> Options:
        return self.admin.options

    @property
    def logger(self) -> lg.Logger:
        return self.admin.logger

    @property
    def ci(self) -> cluster.ClusterInfo:
        return self.admin.ci

    @property
    def lookupds(self) -> list[str]:
        return self.opts.nsqlookupd_http_addresses

    @property
    def nsqds(self) -> list[str]:
        return self.opts.nsqd_http_addresses

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

    # ------------------------------------------------------------------ ACL and audit

    def admin_user(self, request: web.Request) -> str:
        return request.headers.get(self.opts.acl_http_header, "")

    def is_admin(self, request: web.Request) -> bool:
        users = self.opts.admin_users
        return not users or self.admin_user(request) in users

    def require_admin(self, request: web.Request) -> None:
        if not self.is_admin(request):
            raise ApiError(403, "FORBIDDEN")

    def notify(
        self,
        action: str,
        topic: str,
        channel: str,
        node: str,
        request: web.Request,
        remote_address: str = "",
    ) -> None:
        """Go's ``notifyAdminAction``: queue the audit record; never blocks the request.
        ``remote_address``: the client a ``kick_client`` closed (nsqpy, additive)."""
        if not self.opts.notification_http_endpoint:
            return
        scheme = "https" if request.secure or request.headers.get("X-Scheme") == "https" else "http"
        query = request.rel_url.raw_query_string
        url = f"{scheme}://{request.host}{request.rel_url.raw_path}" + (
            f"?{query}" if query else ""
        )
        record: dict[str, Any] = {"action": action, "topic": topic}
        if channel:
            record["channel"] = channel
        if node:
            record["node"] = node
        if remote_address:
            record["remote_address"] = remote_address
        record["timestamp"] = int(time.time())
        user = _basic_auth_user(request)
        if user:
            record["user"] = user
        record["remote_ip"] = _remote_addr(request)
        record["user_agent"] = request.headers.get("User-Agent", "")
        record["url"] = url
        record["via"] = self.admin.hostname
        self.admin.notify(record)

    # ------------------------------------------------------------------ pages and assets

    def page_config(self, request: web.Request) -> dict[str, Any]:
        opts = self.opts
        poll_ms = round(opts.poll_interval * 1000)
        return {
            "version": NSQ_VERSION,
            "base_path": self.base,
            "graphite_url": "" if opts.proxy_graphite else opts.graphite_url,
            "graph_enabled": bool(opts.graphite_url),
            "statsd_counter_format": opts.statsd_counter_format,
            "statsd_gauge_format": opts.statsd_gauge_format,
            "statsd_interval": int(opts.statsd_interval),
            "statsd_prefix": opts.statsd_prefix,
            "nsqlookupd": list(opts.nsqlookupd_http_addresses),
            "is_admin": self.is_admin(request),
            "user": self.admin_user(request),
            "poll_interval_ms": poll_ms,
            "history_points": opts.history_points if poll_ms else 0,
        }

    def template_path(self) -> Path:
        if self.opts.dev_static_dir:
            dev = Path(self.opts.dev_static_dir) / "index.html"
            if dev.is_file():
                return dev
        return TEMPLATE_PATH

    async def index(self, request: web.Request) -> web.Response:
        path = self.template_path()
        try:
            template = path.read_text(encoding="utf-8")
        except OSError as exc:
            self.logger.error(f"failed to read template {path} - {exc}")
            return web.Response(
                status=500,
                text=f"nsqadmin: the page template {path} is missing ({exc.strerror})\n",
                content_type="text/plain",
            )
        page = template.replace(CONFIG_PLACEHOLDER, script_json(self.page_config(request)))
        return web.Response(text=page, content_type="text/html", charset="utf-8")

    async def ping(self, request: web.Request) -> web.Response:
        return plain_text("OK")

    async def static_asset(self, request: web.Request) -> web.Response:
        name = request.match_info["asset"]
        root = Path(self.opts.dev_static_dir) if self.opts.dev_static_dir else STATIC_DIR
        root = root.resolve()
        target = (root / name).resolve()
        if not target.is_relative_to(root) or not target.is_file():
            raise ApiError(404, "NOT_FOUND")
        self.logger.debug(f"serving static asset {name!r} from {root}")
        suffix = target.suffix.lower()
        content_type = mimetypes.guess_type(target.name)[0] or _EXTRA_TYPES.get(suffix)
        response = web.Response(body=target.read_bytes())
        response.headers["Content-Type"] = content_type or "application/octet-stream"
        return response

    # ------------------------------------------------------------------ reading the cluster

    async def topics(self, request: web.Request) -> web.Response:
        warnings = Warnings(self.logger)
        try:
            result = await self.ci.get_topics(self.lookupds, self.nsqds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "get topics", exc) from None
        warnings.add(result.failures)
        if request.query.get("inactive") == "true":
            inactive: dict[str, list[str] | None] = {}
            if self.lookupds:
                for topic in result.value:
                    channels = await self._inactive_channels(topic)
                    if channels is not None:
                        inactive[topic] = channels or None
            return v1_json({"topics": inactive, "message": warnings.message})
        return v1_json({"topics": result.value, "message": warnings.message})

    async def _inactive_channels(self, topic: str) -> list[str] | None:
        """The channels of a topic no nsqd produces; None when it has producers."""
        try:
            producers = await self.ci.get_lookupd_topic_producers(topic, self.lookupds)
        except cluster.UpstreamError:
            producers = cluster.Result([])
        if producers.value:
            return None
        try:
            return (await self.ci.get_lookupd_topic_channels(topic, self.lookupds)).value
        except cluster.UpstreamError:
            return []

    async def _topic_producers(
        self, topic: str, warnings: Warnings
    ) -> tuple[list[cluster.Json], set[str]]:
        """The producers of a topic, plus (lookupd mode) the nodes tombstoned for it, which
        lookupd's ``/lookup`` leaves out and Go's pages hide. Returns the tombstoned nodes'
        HTTP addresses too."""
        try:
            result = await self.ci.get_topic_producers(topic, self.lookupds, self.nsqds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "get topic producers", exc) from None
        warnings.add(result.failures)
        producers = list(result.value)
        tombstoned: set[str] = set()
        if self.lookupds:
            known = {cluster.http_address(p) for p in producers}
            try:
                nodes = await self.ci.get_lookupd_producers(self.lookupds)
            except cluster.UpstreamError:
                nodes = cluster.Result([])
            for node in nodes.value:
                for entry in node["topics"] or []:
                    if entry["topic"] == topic and entry["tombstoned"]:
                        tombstoned.add(cluster.http_address(node))
                        if cluster.http_address(node) not in known:
                            producers.append(node)
        return producers, tombstoned

    async def _stats(
        self,
        producers: list[cluster.Json],
        topic: str,
        channel: str,
        include_clients: bool,
        warnings: Warnings,
        what: str,
    ) -> cluster.NodeStats:
        if not producers:  # Go answers 502 "failed to query any nsqd: " here; nothing failed
            return cluster.NodeStats([], {})
        try:
            result = await self.ci.get_nsqd_stats(producers, topic, channel, include_clients)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, f"get {what}", exc) from None
        warnings.add(result.failures)
        return result.value

    async def topic(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        warnings = Warnings(self.logger)
        producers, tombstoned = await self._topic_producers(topic, warnings)
        stats = await self._stats(producers, topic, "", False, warnings, "topic metadata")
        total = cluster.new_topic_aggregate(topic)
        for node_stats in stats.topics:
            node_stats["tombstoned"] = node_stats["node"] in tombstoned
            cluster.topic_add(total, node_stats)
        total["message"] = warnings.message
        total["unreachable"] = warnings.unreachable()
        return v1_json(total)

    async def channel(self, request: web.Request) -> web.Response:
        topic, channel = request.match_info["topic"], request.match_info["channel"]
        warnings = Warnings(self.logger)
        producers, tombstoned = await self._topic_producers(topic, warnings)
        stats = await self._stats(producers, topic, channel, True, warnings, "channel metadata")
        body: dict[str, Any] = dict(stats.channels.get(channel) or {})
        for node_stats in body.get("nodes") or []:
            node_stats["tombstoned"] = node_stats["node"] in tombstoned
        body["message"] = warnings.message
        body["unreachable"] = warnings.unreachable()
        return v1_json(body)

    async def inspect_channel(self, request: web.Request) -> web.Response:
        """nsqpy: what a channel holds, without consuming (nsqd ``--enable-inspect``). Message
        bodies can be sensitive: with ``--admin-user`` only admins may read them."""
        self.require_admin(request)
        topic, channel = request.match_info["topic"], request.match_info["channel"]
        if not is_valid_topic_name(topic):
            raise ApiError(400, "INVALID_TOPIC")
        if not is_valid_channel_name(channel):
            raise ApiError(400, "INVALID_CHANNEL")
        limit = _inspect_limit(request.query.get("n"))
        warnings = Warnings(self.logger)
        producers, _ = await self._topic_producers(topic, warnings)
        found = cluster.Inspection([], [])
        if producers:
            try:
                result = await self.ci.inspect_channel(producers, topic, channel, limit)
            except cluster.UpstreamError as exc:
                raise upstream_error(self.logger, "inspect channel", exc) from None
            warnings.add(result.failures)
            found = result.value
        body = {
            "topic_name": topic,
            "channel_name": channel,
            "n": limit,
            "nodes": found.nodes,
            "unsupported": found.unsupported,
            "message": warnings.message,
            "unreachable": warnings.unreachable(),
        }
        return v1_json(body)

    async def _producers(self, warnings: Warnings, what: str) -> list[cluster.Json]:
        try:
            result = await self.ci.get_producers(self.lookupds, self.nsqds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, what, exc) from None
        warnings.add(result.failures)
        return result.value

    async def nodes(self, request: web.Request) -> web.Response:
        warnings = Warnings(self.logger)
        producers = await self._producers(warnings, "get nodes")
        unreachable = warnings.unreachable()
        listed = {u["address"] for u in unreachable}
        for failure in self.admin.unreachable_nodes():  # the poller's view of the nsqd
            if failure["address"] not in listed:
                unreachable.append(failure)
        body = {"nodes": producers, "message": warnings.message, "unreachable": unreachable}
        return v1_json(body)

    async def node(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        warnings = Warnings(self.logger)
        producers = await self._producers(warnings, "get producers")
        producer = next((p for p in producers if cluster.http_address(p) == node), None)
        if producer is None:
            raise ApiError(404, "NODE_NOT_FOUND")
        try:
            result = await self.ci.get_nsqd_stats([producer], "", "", True)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "get nsqd stats", exc) from None
        topics = result.value.topics
        total_clients = sum(len(c["clients"] or []) for t in topics for c in t["channels"] or [])
        body = {
            "node": node,
            "topics": topics,
            "total_messages": sum(t["message_count"] for t in topics),
            "total_clients": total_clients,
            "message": warnings.message,
            "total_topics": len(topics),
            "unreachable": warnings.unreachable(),
        }
        return v1_json(body)

    async def counter(self, request: web.Request) -> web.Response:
        warnings = Warnings(self.logger)
        producers = await self._producers(warnings, "get counter producer list")
        stats = await self._stats(producers, "", "", False, warnings, "nsqd stats")
        counters: dict[str, dict[str, Any]] = {}
        for aggregate in stats.channels.values():
            for node_stats in aggregate["nodes"] or []:
                key = f"{aggregate['topic_name']}:{aggregate['channel_name']}:{node_stats['node']}"
                entry = counters.setdefault(
                    key,
                    {
                        "node": node_stats["node"],
                        "topic_name": aggregate["topic_name"],
                        "channel_name": aggregate["channel_name"],
                        "message_count": 0,
                    },
                )
                entry["message_count"] += node_stats["message_count"]
        return v1_json({"stats": counters, "message": warnings.message})

    # ------------------------------------------------------------------ admin actions

    async def _json_body(self, request: web.Request) -> Any:
        try:
            return _decode_json_body(await request.read())
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None

    def _action_response(self, failures: list[cluster.Failure]) -> web.Response:
        warnings = Warnings(self.logger)
        warnings.add(failures)
        return v1_json({"message": warnings.message})

    async def tombstone_node_for_topic(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        node = request.match_info["node"]
        try:
            topic = _string_field(_decode_json_body(await request.read()), "topic")
        except ValueError:
            raise ApiError(400, "INVALID_BODY") from None
        if not is_valid_topic_name(topic):
            raise ApiError(400, "INVALID_TOPIC")
        try:
            failures = await self.ci.tombstone_node_for_topic(topic, node, self.lookupds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "tombstone node for topic", exc) from None
        self.notify("tombstone_topic_producer", topic, "", node, request)
        return self._action_response(failures)

    async def create_topic_channel(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        body = await self._json_body(request)
        try:
            topic, channel = _string_field(body, "topic"), _string_field(body, "channel")
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        if not is_valid_topic_name(topic):
            raise ApiError(400, "INVALID_TOPIC")
        if channel and not is_valid_channel_name(channel):
            raise ApiError(400, "INVALID_CHANNEL")
        try:
            failures = await self.ci.create_topic_channel(topic, channel, self.lookupds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "create topic/channel", exc) from None
        self.notify("create_topic", topic, "", "", request)
        if channel:
            self.notify("create_channel", topic, channel, "", request)
        return self._action_response(failures)

    async def delete_topic(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        topic = request.match_info["topic"]
        try:
            failures = await self.ci.delete_topic(topic, self.lookupds, self.nsqds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "delete topic", exc) from None
        self.notify("delete_topic", topic, "", "", request)
        return self._action_response(failures)

    async def delete_channel(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        topic, channel = request.match_info["topic"], request.match_info["channel"]
        try:
            failures = await self.ci.delete_channel(topic, channel, self.lookupds, self.nsqds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "delete channel", exc) from None
        self.notify("delete_channel", topic, channel, "", request)
        return self._action_response(failures)

    async def topic_action(self, request: web.Request) -> web.Response:
        return await self._topic_channel_action(request, request.match_info["topic"], "")

    async def channel_action(self, request: web.Request) -> web.Response:
        match = request.match_info
        return await self._topic_channel_action(request, match["topic"], match["channel"])

    async def _topic_channel_action(
        self, request: web.Request, topic: str, channel: str
    ) -> web.Response:
        self.require_admin(request)
        body = await self._json_body(request)
        try:
            action = _string_field(body, "action")
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        if action not in ("pause", "unpause", "empty"):
            raise ApiError(400, "INVALID_ACTION")
        kind = "channel" if channel else "topic"
        failures: list[cluster.Failure] = []
        error: cluster.UpstreamError | None = None
        try:
            failures = await self.ci.topic_channel_action(
                f"{kind}/{action}", topic, channel, self.lookupds, self.nsqds
            )
        except cluster.UpstreamError as exc:
            error = exc
        # Go notifies before it looks at the outcome: even a failed action is audited
        self.notify(f"{action}_{kind}", topic, channel, "", request)
        if error is not None:
            raise upstream_error(self.logger, f"{action} topic/channel", error)
        return self._action_response(failures)

    async def kick_client(self, request: web.Request) -> web.Response:
        return await kick.kick_client(self, request)

    # ------------------------------------------------------------------ graphite

    async def graphite(self, request: web.Request) -> web.Response:
        if request.query.get("metric") != "rate":
            raise ApiError(400, "INVALID_ARG_METRIC")
        target = request.query.get("target")
        if target is None:
            raise ApiError(400, "INVALID_ARG_TARGET")
        interval = int(self.opts.statsd_interval)
        params = {
            "format": "json",
            "from": f"-{interval * 2}sec",
            "target": target,
            "until": f"-{interval}sec",
        }
        url = f"{self.opts.graphite_url}/render?{urlencode(params)}"
        self.logger.info(f"GRAPHITE: {url}")
        try:
            response = await self.ci.client.get_v1(url)
            rate = float(response[0]["datapoints"][0][0])
        except (cluster.RequestError, ValueError, TypeError, KeyError, IndexError) as exc:
            self.logger.error(f"graphite request failed - {exc}")
            raise ApiError(500, "INTERNAL_ERROR") from None
        text = "N/A" if rate < 0 else f"{rate / interval:.2f}"
        return v1_json({"rate": text})

    async def render_proxy(self, request: web.Request) -> web.Response:
        """``--proxy-graphite``: ``GET <base>/render`` forwarded to Graphite, with the basic
        auth of the Graphite URL's user info."""
        target = urlsplit(self.opts.graphite_url)
        url = f"{target.scheme}://{target.hostname}"
        if target.port:
            url += f":{target.port}"
        url += request.rel_url.raw_path
        if request.rel_url.raw_query_string:
            url += "?" + request.rel_url.raw_query_string
        auth = None
        if target.username is not None:
            auth = aiohttp.BasicAuth(target.username, target.password or "")
        session = self.ci.client.session()
        try:
            async with session.get(url, auth=auth) as upstream:
                body = await upstream.read()
                content_type = upstream.headers.get("Content-Type", "")
                status = upstream.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.logger.error(f"graphite proxy error - {exc}")
            return web.Response(status=502)
        response = web.Response(body=body, status=status)
        if content_type:
            response.headers["Content-Type"] = content_type
        return response

    # ------------------------------------------------------------------ nsqpy: the poller

    async def overview(self, request: web.Request) -> web.Response:
        return v1_json(self.admin.history.overview())

    async def history(self, request: web.Request) -> web.Response:
        """A series' points; a well-formed name the poller has not met (yet) has none: 200
        with ``[]``, so a page opened on a new topic does not see an error."""
        query = request.query
        history = self.admin.history
        if "node" in query:
            if not is_valid_node(query["node"]):
                raise ApiError(400, "INVALID_NODE")
            points = history.node_points(query["node"])
        elif "topic" in query:
            if not is_valid_topic_name(query["topic"]):
                raise ApiError(400, "INVALID_TOPIC")
            if "channel" in query:
                if not is_valid_channel_name(query["channel"]):
                    raise ApiError(400, "INVALID_CHANNEL")
                points = history.channel_points(query["topic"], query["channel"])
            else:
                points = history.topic_points(query["topic"])
        else:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        return v1_json({"interval_ms": history.interval_ms, "points": points or []})

    # ------------------------------------------------------------------ /config

    def _check_config_cidr(self, request: web.Request) -> None:
        cidr = self.opts.allow_config_from_cidr
        if not cidr:
            return
        network = ipaddress.ip_network(cidr, strict=False)
        try:
            remote = ipaddress.ip_address((request.remote or "").split("%")[0])
        except ValueError:
            self.logger.error(f"failed to parse RemoteAddr {request.remote}")
            raise ApiError(400, "INVALID_REMOTE_ADDR") from None
        if isinstance(remote, ipaddress.IPv6Address) and remote.ipv4_mapped is not None:
            remote = remote.ipv4_mapped
        if remote.version != network.version or remote not in network:
            raise ApiError(403, "FORBIDDEN")

    async def config(self, request: web.Request) -> web.Response:
        opt = request.match_info["opt"]
        self._check_config_cidr(request)
        if request.method == "PUT":
            body = await _read_limited(request, 1024 * 1024 + 1)
            if len(body) > 1024 * 1024 or not body:
                raise ApiError(413, "INVALID_VALUE")
            self._put_config(opt, body)
        for spec in specs(Options):
            if spec.cfg == opt and spec.attr not in COMMAND_ONLY:
                return v1_json(render_value(spec.kind, getattr(self.opts, spec.attr)))
        raise ApiError(400, "INVALID_OPTION")

    def _put_config(self, opt: str, body: bytes) -> None:
        if opt == "nsqlookupd_http_addresses":
            try:
                addresses = json.loads(body)
            except ValueError:
                raise ApiError(400, "INVALID_VALUE") from None
            if addresses is None:
                addresses = []
            if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
                raise ApiError(400, "INVALID_VALUE")
            self.admin.set_lookupd_addresses(addresses)
        elif opt == "log_level":
            try:
                level = lg.parse_level(body.decode("utf-8", "replace"))
            except ValueError:
                raise ApiError(400, "INVALID_VALUE") from None
            self.admin.set_log_level(level)
        else:
            raise ApiError(400, "INVALID_OPTION")
