"""nsqd's HTTP routes beyond Go (docs/beyond-go.md), added to the route table by http.py.

``/metrics`` (on unless ``--metrics=false``), ``/channel/config``, ``/dead_letter`` and
``/client/kick`` (additive, inert until used), and with ``--enable-inspect`` the peek and
listing routes (behind the auth server's SUB grants when ``--auth-http-address`` is set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from ...internal.http_api import ApiError, RouteHandler, v1_json
from ...protocol.names import is_valid_channel_name, is_valid_topic_name
from ..http_params import channel_args, existing_topic, first, query
from . import inspect, kick
from .dead_letter import DeadLetters, dead_letter_topic, valid_suffix
from .metrics import metrics_route
from .queue_limits import POLICIES

if TYPE_CHECKING:
    from ..channel import Channel
    from ..nsqd import NSQD

#: Largest ``n`` a peek answers (each message is read and encoded for the response).
MAX_PEEK = 1000


def routes(nsqd: NSQD) -> list[tuple[str, str, RouteHandler]]:
    handlers = BeyondHandlers(nsqd)
    out: list[tuple[str, str, RouteHandler]] = [
        ("GET", "/channel/config", handlers.channel_config),
        ("POST", "/channel/config", handlers.channel_config),
        ("GET", "/dead_letter", handlers.dead_letter),
        ("POST", "/client/kick", handlers.client_kick),
    ]
    if nsqd.options.metrics:
        out.append(("GET", "/metrics", metrics_route(nsqd)))
    if nsqd.options.enable_inspect:
        out += [
            ("GET", "/topic/peek", handlers.topic_peek),
            ("GET", "/channel/peek", handlers.channel_peek),
            ("GET", "/channel/inflight", handlers.channel_inflight),
            ("GET", "/channel/deferred", handlers.channel_deferred),
        ]
    return out


class BeyondHandlers:
    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd

    def _channel(self, request: web.Request) -> Channel:
        topic, name = channel_args(self.nsqd, query(request))
        channel = topic.get_existing_channel(name)
        if channel is None:
            raise ApiError(404, "CHANNEL_NOT_FOUND")
        return channel

    # ------------------------------------------------------------------ dead-lettering

    async def channel_config(self, request: web.Request) -> web.Response:
        """GET: a channel's dead-letter settings (and its queue cap, if it has one or counts);
        POST with ``max_attempts`` and/or ``dead_letter_topic_suffix`` (kept in
        nsqpy.channel_config.json), ``max_queue_bytes`` and/or ``queue_full_policy`` (kept in
        nsqpy.queue_limits.json): change them."""
        params = query(request)
        channel = self._channel(request)
        if request.method == "POST":
            max_attempts = channel.max_attempts
            raw_max = first(params, "max_attempts")
            if raw_max is not None:
                try:
                    max_attempts = int(raw_max, 10)
                except ValueError:
                    raise ApiError(400, "INVALID_MAX_ATTEMPTS") from None
                if not 0 <= max_attempts <= 65535:
                    raise ApiError(400, "INVALID_MAX_ATTEMPTS")
            suffix = first(params, "dead_letter_topic_suffix")
            if suffix is None:
                suffix = channel.dead_letter_suffix
            if not valid_suffix(suffix) or dead_letter_topic(channel.topic.name, suffix) is None:
                raise ApiError(400, "INVALID_DEAD_LETTER_TOPIC_SUFFIX")
            queue_limit = self._queue_limit(params, channel)  # validated before anything changes
            dead_letter_given = raw_max is not None or "dead_letter_topic_suffix" in params
            if queue_limit is None or dead_letter_given:
                self.nsqd.dead_letters.configure(channel, max_attempts, suffix)
            if queue_limit is not None:
                self.nsqd.queue_limits.configure(channel, *queue_limit)
        settings = DeadLetters.settings(channel)
        bounded = self.nsqd.queue_limits.describe(channel)
        if bounded is not None:
            settings.update(bounded)
        return v1_json(settings)

    def _queue_limit(
        self, params: dict[str, list[str]], channel: Channel
    ) -> tuple[int, str] | None:
        """``max_queue_bytes`` and/or ``queue_full_policy`` (nsqpy --max-queue-bytes), or None
        when neither is given."""
        raw_limit = first(params, "max_queue_bytes")
        policy = first(params, "queue_full_policy")
        if raw_limit is None and policy is None:
            return None
        key = (channel.topic.name, channel.name)
        limit, current = self.nsqd.queue_limits.effective(key)
        if raw_limit is not None:
            try:
                limit = int(raw_limit, 10)
            except ValueError:
                raise ApiError(400, "INVALID_MAX_QUEUE_BYTES") from None
            if limit < 0:
                raise ApiError(400, "INVALID_MAX_QUEUE_BYTES")
        if policy is None:
            policy = current
        elif policy not in POLICIES:
            raise ApiError(400, "INVALID_QUEUE_FULL_POLICY")
        return limit, policy

    async def dead_letter(self, request: web.Request) -> web.Response:
        """The history of a dead-lettered message (``id``), or the latest of a dead-letter
        topic (``topic``, at most ``n``)."""
        params = query(request)
        msg_id = first(params, "id")
        if msg_id is not None:
            entry = self.nsqd.dead_letters.lookup(msg_id)
            if entry is None:
                raise ApiError(404, "MESSAGE_NOT_FOUND")
            return v1_json(entry)
        topic = first(params, "topic")
        if topic is None:
            raise ApiError(400, "MISSING_ARG_ID")
        limit = _count(first(params, "n"), 100)
        return v1_json({"messages": self.nsqd.dead_letters.latest(topic, limit)})

    async def client_kick(self, request: web.Request) -> web.Response:
        return await kick.client_kick(self.nsqd, query(request))

    # ------------------------------------------------------------------ inspection

    async def topic_peek(self, request: web.Request) -> web.Response:
        params = query(request)
        name = first(params, "topic")
        if name is not None and is_valid_topic_name(name):
            await inspect.require_grant(self.nsqd, request, name, None)
        topic = existing_topic(self.nsqd, params, validate=True)
        msgs = inspect.peek_topic(topic, _count(first(params, "n"), 1))
        return _messages(msgs, first(params, "format"))

    async def channel_peek(self, request: web.Request) -> web.Response:
        params = query(request)
        channel = await self._inspected_channel(request, params)
        msgs = inspect.peek_channel(channel, _count(first(params, "n"), 1))
        return _messages(msgs, first(params, "format"))

    async def channel_inflight(self, request: web.Request) -> web.Response:
        channel = await self._inspected_channel(request, query(request))
        return v1_json({"messages": inspect.in_flight(self.nsqd, channel)})

    async def channel_deferred(self, request: web.Request) -> web.Response:
        channel = await self._inspected_channel(request, query(request))
        return v1_json({"messages": inspect.deferred(self.nsqd, channel)})

    async def _inspected_channel(
        self, request: web.Request, params: dict[str, list[str]]
    ) -> Channel:
        """The channel, once the caller is known to hold a SUB grant for it (with auth on):
        whether it exists is told only to such a caller."""
        topic, channel = first(params, "topic"), first(params, "channel")
        if (
            topic is not None
            and channel is not None
            and is_valid_topic_name(topic)
            and is_valid_channel_name(channel)
        ):
            await inspect.require_grant(self.nsqd, request, topic, channel)
        return self._channel(request)


def _count(raw: str | None, default: int) -> int:
    if raw is None:
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise ApiError(400, "INVALID_N") from None
    if not 1 <= value <= MAX_PEEK:
        raise ApiError(400, "INVALID_N")
    return value


def _messages(msgs: list[inspect.Message], fmt: str | None) -> web.Response:
    if fmt == "raw":
        return web.Response(body=inspect.raw(msgs), content_type="application/octet-stream")
    return v1_json({"messages": [inspect.describe(m) for m in msgs]})
