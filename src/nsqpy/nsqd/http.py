"""nsqd's HTTP API (Go: nsqd/http.go), routes in one table."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .. import NSQ_VERSION, version_line
from ..internal import lg
from ..internal.flags import TLS_REQUIRED_ALL, render_value, specs
from ..internal.http_api import (
    JSON_CONTENT_TYPE,
    LOGGER,
    V1_HEADERS,
    ApiError,
    RouteHandler,
    add_routes,
    go_json,
    plain_text,
    router_middleware,
    v1_empty,
    v1_errors,
    v1_json,
    v1_text,
)
from ..protocol import is_valid_topic_name
from ..protocol.replica import OP_EMPTY
from .beyond import http as beyond_http
from .beyond.queue_limits import QueueFullError
from .errors import BackendWriteError
from .http_mpub import MpubBodyError, binary_bodies, lines_of, text_regions
from .http_mpub import publish as publish_chunks
from .http_params import channel_args, existing_topic, first, query
from .options import Options, max_defer_ms
from .replica.group import ReplicasShort
from .stats import (
    get_stats_sliced,
    memory_stats,
    run_sliced,
    stats_json,
    stats_json_steps,
    stats_text_steps,
)
from .topic import TopicError

if TYPE_CHECKING:
    from .nsqd import NSQD
    from .topic import Topic

_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}
_OPTION_SPECS = {spec.cfg: spec for spec in specs(Options)}


class HTTPServer:
    def __init__(self, nsqd: NSQD, tls_listener: bool = False) -> None:
        self.nsqd = nsqd
        self.tls_listener = tls_listener

    def routes(self) -> list[tuple[str, str, RouteHandler]]:
        """Go's newHTTPServer route table."""
        return [
            ("GET", "/ping", self.ping),
            ("GET", "/info", self.info),
            ("POST", "/pub", self.pub),
            ("POST", "/mpub", self.mpub),
            ("GET", "/stats", self.stats),
            ("POST", "/topic/create", self.topic_create),
            ("POST", "/topic/delete", self.topic_delete),
            ("POST", "/topic/empty", self.topic_empty),
            ("POST", "/topic/pause", self.topic_pause),
            ("POST", "/topic/unpause", self.topic_pause),
            ("POST", "/channel/create", self.channel_create),
            ("POST", "/channel/delete", self.channel_delete),
            ("POST", "/channel/empty", self.channel_empty),
            ("POST", "/channel/pause", self.channel_pause),
            ("POST", "/channel/unpause", self.channel_pause),
            ("GET", "/config/{opt}", self.config),
            ("PUT", "/config/{opt}", self.config),
            ("PUT", "/debug/setblockrate", self.debug_noop),
            ("POST", "/debug/freememory", self.debug_noop),
            *beyond_http.routes(self.nsqd),  # nsqpy additions (docs/beyond-go.md)
        ]

    # ------------------------------------------------------------------ basics

    async def ping(self, request: web.Request) -> web.Response:
        health = self.nsqd.writes.health_error
        if self.nsqd.draining:  # nsqpy --drain-timeout: readiness probes see it (beyond/drain.py)
            return plain_text("DRAINING", 503)
        if health is not None:
            return plain_text(f"NOK - {health}", 500)
        return plain_text("OK")

    async def info(self, request: web.Request) -> web.Response:
        opts = self.nsqd.options
        return v1_json(
            {
                "version": NSQ_VERSION,
                "broadcast_address": opts.broadcast_address,
                "hostname": self.nsqd.hostname,
                "http_port": self.nsqd.http_port,
                "tcp_port": self.nsqd.tcp_port,
                "start_time": self.nsqd.start_time,
                "max_heartbeat_interval": round(opts.max_heartbeat_interval * 1e9),
                "max_output_buffer_size": opts.max_output_buffer_size,
                "max_output_buffer_timeout": round(opts.max_output_buffer_timeout * 1e9),
                "max_deflate_level": opts.max_deflate_level,
            }
        )

    async def debug_noop(self, request: web.Request) -> web.Response:
        return plain_text("")

    # ------------------------------------------------------------------ publishing

    def _topic_from_query(self, params: dict[str, list[str]]) -> Topic:
        name = first(params, "topic")
        if name is None:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(name):
            raise ApiError(400, "INVALID_TOPIC")
        return self.nsqd.get_topic(name)

    async def _read_limited(self, request: web.Request, limit: int, too_big: str) -> bytes:
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(413, too_big)
        body = bytearray()
        async for chunk in request.content.iter_chunked(65536):
            body += chunk
            if len(body) > limit:
                raise ApiError(413, too_big)
        return bytes(body)

    async def pub(self, request: web.Request) -> web.Response:
        opts = self.nsqd.options
        body = await self._read_limited(request, opts.max_msg_size, "MSG_TOO_BIG")
        if not body:
            raise ApiError(400, "MSG_EMPTY")
        params = query(request)
        topic = self._topic_from_query(params)
        delay = 0.0
        raw_defer = first(params, "defer")
        if raw_defer is not None:
            try:
                defer_ms = int(raw_defer, 10)
            except ValueError:
                raise ApiError(400, "INVALID_DEFER") from None
            if defer_ms < 0 or defer_ms > max_defer_ms(opts):
                raise ApiError(400, "INVALID_DEFER")
            delay = defer_ms / 1000
        if self.nsqd.draining:  # nsqpy --drain-timeout (nsqd/beyond/drain.py)
            raise ApiError(503, "DRAINING")
        self._refuse_if_replicas_short()
        msg = topic.new_message(body)
        msg.deferred = delay
        syncs = self.nsqd.writes.running_syncs(topic)
        try:
            topic.put_message(msg)
        except QueueFullError:  # nsqpy --max-queue-bytes (beyond/queue_limits.py)
            raise ApiError(503, "QUEUE_FULL") from None
        except (TopicError, BackendWriteError):
            raise ApiError(503, "EXITING") from None
        await self._settled(syncs + self.nsqd.topic_starting(topic))
        await self._replicated()
        return v1_text("OK")

    def _refuse_if_replicas_short(self) -> None:
        """Too few --replica-peer reachable for --replica-acks (docs/replication.md)."""
        replication = self.nsqd.replication
        if replication is not None and replication.shortage() is not None:
            raise ApiError(503, "NOT_ENOUGH_REPLICAS")

    async def _replicated(self) -> None:
        """acks-1 peers stored what was put (docs/replication.md, "The OK rule")."""
        replication = self.nsqd.replication
        if replication is not None:
            try:
                await replication.wait_acked(replication.stream.last)
            except ReplicasShort:
                raise ApiError(503, "NOT_ENOUGH_REPLICAS") from None

    @staticmethod
    async def _settled(tasks: tuple[asyncio.Task[None], ...]) -> None:
        """Answer after earlier due fsyncs (--sync-every) and a new topic's channel
        pre-creation, as Go does."""
        if tasks:
            await asyncio.wait(tasks)

    async def mpub(self, request: web.Request) -> web.Response:
        opts = self.nsqd.options
        if request.content_length is not None and request.content_length > opts.max_body_size:
            raise ApiError(413, "BODY_TOO_BIG")
        params = query(request)
        topic = self._topic_from_query(params)
        raw_binary = first(params, "binary")
        binary = False
        if raw_binary is not None:
            binary = _BOOL_PARAMS.get(raw_binary, True)
            if raw_binary not in _BOOL_PARAMS:
                self.nsqd.logger.warn(
                    f"deprecated value '{raw_binary}' used for /mpub binary param"
                )
        body = await self._read_limited(request, opts.max_body_size, "BODY_TOO_BIG")
        # checked whole before anything is published, then published in slices (http_mpub.py)
        try:
            if binary:
                chunks = await binary_bodies(body, opts.max_msg_size, opts.max_body_size)
            else:
                regions = await text_regions(body, opts.max_msg_size)
        except MpubBodyError as err:
            raise ApiError(413, err.code) from None
        del body  # the chunks hold what is published
        if self.nsqd.draining:  # nsqpy --drain-timeout (nsqd/beyond/drain.py)
            raise ApiError(503, "DRAINING")
        self._refuse_if_replicas_short()
        try:
            if binary:
                syncs = await publish_chunks(self.nsqd, topic, chunks, list)
            else:
                syncs = await publish_chunks(self.nsqd, topic, regions, lines_of)
        except QueueFullError:  # nsqpy --max-queue-bytes (beyond/queue_limits.py)
            raise ApiError(503, "QUEUE_FULL") from None
        except (TopicError, BackendWriteError):
            raise ApiError(503, "EXITING") from None
        await self._settled(syncs + self.nsqd.topic_starting(topic))
        await self._replicated()
        return v1_text("OK")

    # ------------------------------------------------------------------ stats

    async def stats(self, request: web.Request) -> web.Response:
        params = query(request)
        json_format = first(params, "format") == "json"
        topic_name = first(params, "topic") or ""
        channel_name = first(params, "channel") or ""
        include_clients = _BOOL_PARAMS.get(first(params, "include_clients") or "", True)
        include_mem = _BOOL_PARAMS.get(first(params, "include_mem") or "", True)
        topics, producers = await get_stats_sliced(
            self.nsqd, topic_name, channel_name, include_clients
        )
        memory = memory_stats() if include_mem else None
        # formatting thousands of channels is loop work too: in slices as well
        if not json_format:
            text: list[str] = []
            version = version_line("nsqd")
            await run_sliced(stats_text_steps(self.nsqd, version, topics, producers, memory, text))
            return v1_text("".join(text))
        body = stats_json(topics, producers, memory, self.nsqd.writes.health, self.nsqd.start_time)
        if self.nsqd.replication is not None:  # docs/replication.md: only when replicating
            body["replication"] = self.nsqd.replication.stats()
        data: list[bytes] = []
        await run_sliced(stats_json_steps(body, data))
        return web.Response(body=data[0], headers={**V1_HEADERS, "Content-Type": JSON_CONTENT_TYPE})

    # ------------------------------------------------------------------ topics

    async def topic_create(self, request: web.Request) -> web.Response:
        topic = self._topic_from_query(query(request))
        await self._settled(self.nsqd.topic_starting(topic))
        return v1_empty()

    async def topic_delete(self, request: web.Request) -> web.Response:
        params = query(request)
        topic = existing_topic(self.nsqd, params, validate=False)
        self.nsqd.delete_existing_topic(topic.name)
        return v1_empty()

    async def topic_empty(self, request: web.Request) -> web.Response:
        topic = existing_topic(self.nsqd, query(request), validate=True)
        topic.empty()
        if self.nsqd.replication is not None:  # group-wide (a peer's empty is not echoed)
            self.nsqd.replication.topic_op(topic.name, OP_EMPTY)
        return v1_empty()

    async def topic_pause(self, request: web.Request) -> web.Response:
        topic = existing_topic(self.nsqd, query(request), validate=False)
        if "unpause" in request.path:
            topic.unpause()
        else:
            topic.pause()
        self.nsqd.persistence.persist_metadata()
        return v1_empty()

    # ------------------------------------------------------------------ channels

    async def channel_create(self, request: web.Request) -> web.Response:
        topic, name = channel_args(self.nsqd, query(request))
        topic.get_channel(name)
        return v1_empty()

    async def channel_delete(self, request: web.Request) -> web.Response:
        topic, name = channel_args(self.nsqd, query(request))
        try:
            topic.delete_existing_channel(name)
        except TopicError:
            raise ApiError(404, "CHANNEL_NOT_FOUND") from None
        return v1_empty()

    async def channel_empty(self, request: web.Request) -> web.Response:
        topic, name = channel_args(self.nsqd, query(request))
        channel = topic.get_existing_channel(name)
        if channel is None:
            raise ApiError(404, "CHANNEL_NOT_FOUND")
        channel.empty()
        if self.nsqd.replication is not None:  # group-wide (a peer's empty is not echoed)
            self.nsqd.replication.channel_op(topic.name, name, OP_EMPTY)
        return v1_empty()

    async def channel_pause(self, request: web.Request) -> web.Response:
        topic, name = channel_args(self.nsqd, query(request))
        channel = topic.get_existing_channel(name)
        if channel is None:
            raise ApiError(404, "CHANNEL_NOT_FOUND")
        if "unpause" in request.path:
            channel.unpause()
        else:
            channel.pause()
        self.nsqd.persistence.persist_metadata()
        return v1_empty()

    # ------------------------------------------------------------------ config

    async def config(self, request: web.Request) -> web.Response:
        name = request.match_info["opt"]
        opts = self.nsqd.options
        if request.method == "PUT":
            body = await request.content.read(opts.max_msg_size + 1)
            if len(body) > opts.max_msg_size or not body:
                raise ApiError(413, "INVALID_VALUE")
            self._set_option(name, body)
        spec = _OPTION_SPECS.get(name)
        if spec is None:
            raise ApiError(400, "INVALID_OPTION")
        return v1_json(render_value(spec.kind, getattr(opts, spec.attr)))

    def _set_option(self, name: str, body: bytes) -> None:
        opts = self.nsqd.options
        if name == "nsqlookupd_tcp_addresses":
            try:
                value: Any = json.loads(body)
            except ValueError:
                raise ApiError(400, "INVALID_VALUE") from None
            if value is None:
                value = []
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ApiError(400, "INVALID_VALUE")
            opts.nsqlookupd_tcp_addresses = value
            self.nsqd.lookupd_addresses_changed()
        elif name == "log_level":
            try:
                level = lg.parse_level(body.decode(errors="replace"))
            except ValueError:
                raise ApiError(400, "INVALID_VALUE") from None
            opts.log_level = level
            self.nsqd.logger.level = level
        else:
            raise ApiError(400, "INVALID_OPTION")


def tls_required_middleware(nsqd: NSQD) -> Any:
    """--tls-required=true: the plain listener answers every request with Go's 403 body."""

    @web.middleware
    async def require_tls(request: web.Request, handler: Any) -> web.StreamResponse:
        body = f'{{"message": "TLS_REQUIRED", "https_port": {nsqd.https_port}}}'
        headers = {**V1_HEADERS, "Content-Type": JSON_CONTENT_TYPE}
        return web.Response(status=403, body=body.encode(), headers=headers)

    return require_tls


def build_app(nsqd: NSQD, tls_listener: bool = False) -> web.Application:
    server = HTTPServer(nsqd, tls_listener)
    # Go logs every request but /pub and /mpub (the hot path)
    middlewares = [router_middleware(nsqd.logger, frozenset({"/pub", "/mpub"})), v1_errors]
    if not tls_listener and nsqd.options.tls_required == TLS_REQUIRED_ALL:
        middlewares.insert(0, tls_required_middleware(nsqd))
    app = web.Application(
        middlewares=middlewares, client_max_size=max(nsqd.options.max_body_size, 1 << 20) + 1
    )
    app[LOGGER] = nsqd.logger
    add_routes(app, server.routes())
    return app


__all__ = ["HTTPServer", "build_app", "go_json"]
