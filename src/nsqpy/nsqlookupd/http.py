"""nsqlookupd's HTTP API (Go: nsqlookupd/http.go).

The route table is :func:`make_app`. Responses follow the V1 conventions of
:mod:`nsqpy.internal.http_api`; lists are ``[]``, never ``null``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

from aiohttp import web

from .. import NSQ_VERSION
from ..internal.http_api import (
    LOGGER,
    ApiError,
    add_routes,
    plain_text,
    router_middleware,
    v1_empty,
    v1_errors,
    v1_json,
)
from ..internal.metrics import metrics_handler
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from .metrics import build_registry
from .registration_db import GO_ZERO_TIME_NS, Registration, filter_active
from .tcp import CLIENT_REGISTRATION

if TYPE_CHECKING:
    from .nsqlookupd import NSQLookupd

_HEX = frozenset(b"0123456789abcdefABCDEF")


# --------------------------------------------------------------------------- Go-style query


def _query_unescape(text: str) -> str:
    """Go's ``url.QueryUnescape``: ``+`` is a space, ``%`` must be followed by two hex digits."""
    raw = text.encode("utf-8", "surrogateescape")
    pos = raw.find(b"%")
    while pos >= 0:
        if pos + 2 >= len(raw) or raw[pos + 1] not in _HEX or raw[pos + 2] not in _HEX:
            raise ValueError("invalid URL escape")
        pos = raw.find(b"%", pos + 3)
    return unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8", "replace")


def parse_go_query(raw_query: str) -> dict[str, list[str]]:
    """Go's ``url.ParseQuery``: ValueError for a ``;`` separator or a bad escape (the other
    pairs are still parsed in Go, but the handlers then refuse the request anyway)."""
    values: dict[str, list[str]] = {}
    error: ValueError | None = None
    for pair in raw_query.split("&"):
        if ";" in pair:
            error = error or ValueError("invalid semicolon separator in query")
            continue
        if not pair:
            continue
        key, _, value = pair.partition("=")
        try:
            key, value = _query_unescape(key), _query_unescape(value)
        except ValueError as exc:
            error = error or exc
            continue
        values.setdefault(key, []).append(value)
    if error is not None:
        raise error
    return values


class Params:
    """Request parameters from the URL query only; the first value of a key wins."""

    __slots__ = ("_values",)

    def __init__(self, request: web.Request) -> None:
        try:
            self._values = parse_go_query(request.rel_url.raw_query_string)
        except ValueError:
            raise ApiError(400, "INVALID_REQUEST") from None

    def get(self, key: str) -> str | None:
        values = self._values.get(key)
        return values[0] if values else None

    def require(self, key: str, missing: str) -> str:
        value = self.get(key)
        if value is None:
            raise ApiError(400, missing)
        return value

    def topic_and_channel(self) -> tuple[str, str]:
        """Go's ``http_api.GetTopicChannelArgs``."""
        topic = self.require("topic", "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(topic):
            raise ApiError(400, "INVALID_ARG_TOPIC")
        channel = self.require("channel", "MISSING_ARG_CHANNEL")
        if not is_valid_channel_name(channel):
            raise ApiError(400, "INVALID_ARG_CHANNEL")
        return topic, channel


# --------------------------------------------------------------------------- middlewares


# --------------------------------------------------------------------------- handlers


class LookupdHTTP:
    """The route handlers, bound to one :class:`NSQLookupd`."""

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db

    async def ping(self, request: web.Request) -> web.Response:
        return plain_text("OK")

    async def info(self, request: web.Request) -> web.Response:
        return v1_json({"version": NSQ_VERSION})

    async def topics(self, request: web.Request) -> web.Response:
        topics = [key for _, key, _ in self.db.find_registrations("topic", "*", "")]
        return v1_json({"topics": topics})

    async def channels(self, request: web.Request) -> web.Response:
        topic = Params(request).require("topic", "MISSING_ARG_TOPIC")
        channels = [sub for _, _, sub in self.db.find_registrations("channel", topic, "*")]
        return v1_json({"channels": channels})

    async def lookup(self, request: web.Request) -> web.Response:
        topic = Params(request).require("topic", "MISSING_ARG_TOPIC")
        db = self.db
        if not db.find_registrations("topic", topic, ""):
            raise ApiError(404, "TOPIC_NOT_FOUND")
        channels = [sub for _, _, sub in db.find_registrations("channel", topic, "*")]
        opts = self.lookupd.options
        producers = filter_active(
            db.find_producers("topic", topic, ""),
            opts.inactive_producer_timeout,
            opts.tombstone_lifetime,
            self.lookupd.clock(),
        )
        return v1_json({"channels": channels, "producers": [p.peer.to_json() for p in producers]})

    async def nodes(self, request: web.Request) -> web.Response:
        db = self.db
        opts = self.lookupd.options
        now = self.lookupd.clock()
        # tombstoned nodes are listed (lifetime 0), with their tombstones per topic
        peers = filter_active(
            db.find_producers(*CLIENT_REGISTRATION), opts.inactive_producer_timeout, 0.0, now
        )
        nodes = []
        for client in peers:
            peer = client.peer
            registrations = db.lookup_registrations(peer.id)
            topics = [
                key for category, key, sub in registrations if category == "topic" and not sub
            ]
            tombstones = []
            for topic in topics:
                record = db.producer(("topic", topic, ""), peer.id)
                tombstones.append(
                    record is not None
                    and record.peer is peer
                    and record.is_tombstoned(opts.tombstone_lifetime, now)
                )
            nodes.append(
                {
                    **peer.to_json(),
                    "tombstones": tombstones,
                    "topics": topics,
                }
            )
        return v1_json({"producers": nodes})

    async def debug(self, request: web.Request) -> web.Response:
        data: dict[str, list[dict[str, Any]]] = {}
        for (category, key, subkey), producers in sorted(self.db.items()):
            if not producers:
                continue  # Go builds the map from producers, so empty keys never appear
            entries = []
            for p in producers:
                peer = p.peer
                at = p.tombstoned_at
                # a Go map marshals with its keys sorted
                entries.append(
                    {
                        "broadcast_address": peer.broadcast_address,
                        "hostname": peer.hostname,
                        "http_port": peer.http_port,
                        "id": peer.id,
                        "last_update": round(peer.last_update * 1e9),
                        "tcp_port": peer.tcp_port,
                        "tombstoned": p.tombstoned,
                        "tombstoned_at": GO_ZERO_TIME_NS if at is None else round(at * 1e9),
                        "version": peer.version,
                    }
                )
            data[f"{category}:{key}:{subkey}"] = entries
        return v1_json(dict(sorted(data.items())))

    async def create_topic(self, request: web.Request) -> web.Response:
        topic = Params(request).require("topic", "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(topic):
            raise ApiError(400, "INVALID_ARG_TOPIC")
        self.lookupd.logger.info(f"DB: adding topic({topic})")
        self.db.add_registration(("topic", topic, ""))
        return v1_empty()

    async def delete_topic(self, request: web.Request) -> web.Response:
        topic = Params(request).require("topic", "MISSING_ARG_TOPIC")
        db = self.db
        logger = self.lookupd.logger
        for registration in db.find_registrations("channel", topic, "*"):
            logger.info(f"DB: removing channel({registration[2]}) from topic({topic})")
            db.remove_registration(registration)
        for registration in db.find_registrations("topic", topic, ""):
            logger.info(f"DB: removing topic({topic})")
            db.remove_registration(registration)
        return v1_empty()

    async def tombstone_topic_producer(self, request: web.Request) -> web.Response:
        params = Params(request)
        topic = params.require("topic", "MISSING_ARG_TOPIC")
        node = params.require("node", "MISSING_ARG_NODE")
        self.lookupd.logger.info(f"DB: setting tombstone for producer@{node} of topic({topic})")
        now = self.lookupd.clock()
        for producer in self.db.find_producers("topic", topic, ""):
            if producer.peer.http_node == node:
                producer.tombstone(now)
        return v1_empty()

    async def create_channel(self, request: web.Request) -> web.Response:
        topic, channel = Params(request).topic_and_channel()
        logger = self.lookupd.logger
        logger.info(f"DB: adding channel({channel}) in topic({topic})")
        self.db.add_registration(("channel", topic, channel))
        logger.info(f"DB: adding topic({topic})")
        self.db.add_registration(("topic", topic, ""))
        return v1_empty()

    async def delete_channel(self, request: web.Request) -> web.Response:
        topic, channel = Params(request).topic_and_channel()
        registrations: list[Registration] = self.db.find_registrations("channel", topic, channel)
        if not registrations:
            raise ApiError(404, "CHANNEL_NOT_FOUND")
        self.lookupd.logger.info(f"DB: removing channel({channel}) from topic({topic})")
        for registration in registrations:
            self.db.remove_registration(registration)
        return v1_empty()


def make_app(lookupd: NSQLookupd) -> web.Application:
    """The route table, as Go's ``newHTTPServer``."""
    api = LookupdHTTP(lookupd)
    app = web.Application(middlewares=[router_middleware(lookupd.logger), v1_errors])
    app[LOGGER] = lookupd.logger
    add_routes(
        app,
        [
            ("GET", "/ping", api.ping),
            ("GET", "/info", api.info),
            ("GET", "/debug", api.debug),
            ("GET", "/lookup", api.lookup),
            ("GET", "/topics", api.topics),
            ("GET", "/channels", api.channels),
            ("GET", "/nodes", api.nodes),
            ("POST", "/topic/create", api.create_topic),
            ("POST", "/topic/delete", api.delete_topic),
            ("POST", "/channel/create", api.create_channel),
            ("POST", "/channel/delete", api.delete_channel),
            ("POST", "/topic/tombstone", api.tombstone_topic_producer),
        ],
    )
    # nsqpy addition (docs/beyond-go.md): an additive route; the flag set stays Go's
    add_routes(app, [("GET", "/metrics", metrics_handler(build_registry(lookupd)))])
    return app
