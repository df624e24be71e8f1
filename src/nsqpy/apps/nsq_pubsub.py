"""``nsq_pubsub``: NSQ channels as HTTP streams (Go: apps/nsq_pubsub, dropped after v0.3.8).

``GET /sub?topic=T&channel=C`` holds the response open and streams every message of T/C as
one line (``body\\n``), with a ``{"_heartbeat_":<unix seconds>}`` line every
``--heartbeat-interval``. Each subscriber gets its own consumer, so several subscribers on one
channel share its messages as NSQ consumers do. A message is FINished once it was written to
the subscriber's socket and REQueued (no delay, no backoff) if the subscriber went away
first, so another subscriber of the channel gets it.

Beyond the old Go tool: ``Accept: text/event-stream`` gets Server-Sent Events (a browser's
``EventSource`` can subscribe), ``max_in_flight`` is a query parameter of ``/sub``,
``POST /pub?topic=T`` publishes its body, ``/ping`` answers ``OK``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from ..client import Consumer, Message, NoConnectionsError, NSQError, Producer
from ..client.lookup import producer_addresses
from ..internal import lg
from ..internal.api_client import ApiClient, RequestError, api_url
from ..internal.durations import format_duration
from ..internal.flags import BOOL, DURATION, INT, LOG_LEVEL, STR, option
from ..internal.http_server import start_app
from ..internal.net import ListenError, format_address, listen_socket
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from . import common

PROGRAM = "nsq_pubsub"

#: on SIGINT/SIGTERM, how long in-flight messages may take to reach their subscribers
SHUTDOWN_GRACE = 2.0


@dataclass
class Options(common.ConsumerSourceFlags, common.ProducerFlags):
    version: bool = option("version", False, BOOL, "print version string")
    log_level: int = option(
        "log-level", lg.INFO, LOG_LEVEL, "set log verbosity: debug, info, warn, error, or fatal"
    )
    log_prefix: str = option("log-prefix", "[nsq_pubsub] ", STR, "log message prefix")
    http_address: str = option(
        "http-address", "0.0.0.0:8080", STR, "<addr>:<port> to listen on for HTTP clients"
    )
    max_in_flight: int = option(
        "max-in-flight",
        100,
        INT,
        "max number of messages to allow in flight (per HTTP subscriber; "
        "/sub's max_in_flight query parameter overrides it)",
    )
    heartbeat_interval: float = option(
        "heartbeat-interval",
        30.0,
        DURATION,
        'interval between {"_heartbeat_":<unix seconds>} lines sent to each HTTP subscriber',
    )
    cors_allow_origin: str = option(
        "cors-allow-origin",
        "",
        STR,
        "Access-Control-Allow-Origin for every response (e.g. '*'), so that pages of other "
        "origins can subscribe with EventSource (default: none, same origin only)",
    )


def validate(opts: Options) -> None:
    """The old Go tool's checks and texts (``log.Fatal``: one line, exit 1)."""
    if opts.max_in_flight <= 0:
        raise common.FatalError("--max-in-flight must be > 0")
    opts.check_sources(required_suffix=".")
    if opts.heartbeat_interval <= 0:
        raise common.FatalError("--heartbeat-interval must be > 0")


# --------------------------------------------------------------------------- subscribers


class Subscriber:
    """One HTTP client streaming a topic/channel: its response, its consumer, its counts."""

    __slots__ = (
        "_lock",
        "channel",
        "connected_at",
        "consumer",
        "finished",
        "gone",
        "messages",
        "remote",
        "request",
        "requeued",
        "response",
        "server",
        "sse",
        "topic",
    )

    def __init__(
        self,
        server: PubSubServer,
        remote: str,
        topic: str,
        channel: str,
        request: web.Request,
        response: web.StreamResponse,
        sse: bool,
    ) -> None:
        self.server = server
        self.request = request
        self.remote = remote
        self.topic = topic
        self.channel = channel
        self.response = response
        self.sse = sse
        self.connected_at = time.monotonic()
        self.consumer: Consumer | None = None
        self.gone = False
        self.messages = 0  # received from nsqd
        self.finished = 0  # written to the HTTP client
        self.requeued = 0  # given back because the client went away
        self._lock = asyncio.Lock()

    async def handle(self, message: Message) -> None:
        """The consumer's handler: write the message, FIN it; REQ it if the client is gone."""
        self.messages += 1
        frame = sse_message(message) if self.sse else message.body + b"\n"
        if await self.write(frame):
            message.finish()
            self.finished += 1
            self.server.message_count += 1
        else:
            # straight back to the channel for the other subscribers: no delay, no backoff
            message.requeue(0.0, backoff=False)
            self.requeued += 1
            if self.consumer is not None and self.consumer.max_in_flight:
                self.consumer.change_max_in_flight(0)  # RDY 0: stop taking messages for it

    async def heartbeat(self) -> bool:
        now = int(time.time())
        frame = sse_heartbeat(now) if self.sse else b'{"_heartbeat_":%d}\n' % now
        return await self.write(frame)

    async def write(self, frame: bytes) -> bool:
        """Write one frame; False if the client is gone (before or while writing)."""
        async with self._lock:  # whole frames, in order, one drain at a time
            if self.gone or not self._connected():
                self.gone = True
                return False
            try:
                await self.response.write(frame)
            except Exception:  # any failure to write means the client went away
                self.gone = True
                return False
            if not self._connected():  # lost while draining: the bytes may not have left
                self.gone = True
                return False
            return True

    def hang_up(self) -> None:
        """Close the client's connection: writes waiting for it fail (their messages are
        REQueued)."""
        self.gone = True
        transport = self.request.transport
        if transport is not None:
            transport.abort()

    def _connected(self) -> bool:
        transport = self.request.transport
        return transport is not None and not transport.is_closing()

    def stats_line(self, now: float) -> str:
        connected = format_duration(float(int(now - self.connected_at)))
        return (
            f"[{self.remote}] [{self.topic} : {self.channel}] msgs: {self.messages:<8d} "
            f"fin: {self.finished:<8d} re-q: {self.requeued:<8d} connected: {connected}\n"
        )


def sse_message(message: Message) -> bytes:
    """One Server-Sent Event: the message id as ``id:``, each body line as ``data:``."""
    lines = re.split(rb"\r\n|\r|\n", message.body)
    return (
        b"id: " + message.id + b"\n" + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"
    )


def sse_heartbeat(now: int) -> bytes:
    """A named event, so ``EventSource.onmessage`` only sees messages."""
    return b'event: heartbeat\ndata: {"_heartbeat_":%d}\n\n' % now


def wants_sse(request: web.Request) -> bool:
    return "text/event-stream" in request.headers.get("Accept", "")


# --------------------------------------------------------------------------- the server


class PubSubServer:
    def __init__(self, opts: Options, logger: lg.Logger) -> None:
        self.opts = opts
        self.logger = logger
        self.message_count = 0
        self.subscribers: list[Subscriber] = []
        self.stopping = False
        self.config = common.client_config(opts.consumer_opt)
        self.publisher = Publisher(opts, logger)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/sub", self.sub)
        app.router.add_get("/stats", self.stats)
        app.router.add_post("/pub", self.pub)
        app.router.add_put("/pub", self.pub)
        app.router.add_get("/ping", self.ping)
        if self.opts.cors_allow_origin:
            app.on_response_prepare.append(self._allow_origin)
        return app

    async def _allow_origin(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers["Access-Control-Allow-Origin"] = self.opts.cors_allow_origin

    async def close(self) -> None:
        """Stop every subscription: CLS, let in-flight writes finish for a moment, then hang
        up on subscribers that do not read so their messages are REQueued, not left to time
        out in nsqd."""
        self.stopping = True
        subscribers = [s for s in self.subscribers if s.consumer is not None]
        closing = [asyncio.ensure_future(s.consumer.close()) for s in subscribers if s.consumer]
        if closing:
            _, pending = await asyncio.wait(closing, timeout=SHUTDOWN_GRACE)
            if pending:
                for subscriber in subscribers:
                    subscriber.hang_up()
                await asyncio.gather(*pending, return_exceptions=True)
        await self.publisher.close()

    # ------------------------------------------------------------------ routes

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def stats(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        lines = [f"Total Messages: {self.message_count}\n\n"]
        lines.extend(s.stats_line(now) for s in list(self.subscribers))
        return web.Response(text="".join(lines))

    async def pub(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic")
        if topic is None:
            return text_error(400, "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(topic):
            return text_error(400, "INVALID_ARG_TOPIC")
        body = await request.read()
        if not body:
            return text_error(400, "MSG_EMPTY")
        try:
            await self.publisher.publish(topic, body)
        except (NSQError, OSError, ValueError) as exc:
            self.logger.error(f"failed to publish to {topic} - {exc}")
            return text_error(503, "PUB_FAILED")
        return web.Response(text="OK")

    async def sub(self, request: web.Request) -> web.StreamResponse:
        args = sub_args(request, self.opts.max_in_flight)
        if isinstance(args, web.Response):
            return args
        topic, channel, max_in_flight = args
        if self.stopping:
            return text_error(503, "EXITING")
        remote = format_address(
            request.transport.get_extra_info("peername") if request.transport else ""
        )
        sse = wants_sse(request)
        response = web.StreamResponse(headers=stream_headers(sse))
        await response.prepare(request)
        subscriber = Subscriber(self, remote, topic, channel, request, response, sse)
        self.logger.info(f"[{remote}] new connection ({topic}/{channel})")
        self.subscribers.append(subscriber)
        try:
            subscriber.consumer = Consumer(
                topic,
                channel,
                subscriber.handle,
                nsqd_tcp_addresses=self.opts.nsqd_tcp_address,
                lookupd_http_addresses=self.opts.lookupd_http_address,
                **self.config.consumer_options(max_in_flight, common.user_agent(PROGRAM)),
            )
            await subscriber.consumer.start()
            while not subscriber.gone and not self.stopping:
                await asyncio.sleep(self.opts.heartbeat_interval)
                if not self.stopping:
                    await subscriber.heartbeat()
        except asyncio.CancelledError:  # the client hung up (aiohttp cancels the handler)
            self.logger.info(f"[{remote}] connection closed")
            subscriber.gone = True
            await self._close_subscriber(subscriber)
            raise
        self.logger.info(f"[{remote}] connection closed")
        await self._close_subscriber(subscriber)
        return response

    async def _close_subscriber(self, subscriber: Subscriber) -> None:
        """Stop its consumer: messages still arriving are written (or REQueued if it left)."""
        with contextlib.suppress(ValueError):
            self.subscribers.remove(subscriber)
        if subscriber.consumer is not None:
            await asyncio.shield(subscriber.consumer.close())


def sub_args(
    request: web.Request, default_max_in_flight: int
) -> tuple[str, str, int] | web.Response:
    """``topic``, ``channel`` and ``max_in_flight`` from the query (nsqd's error names)."""
    topic = request.query.get("topic")
    if topic is None:
        return text_error(400, "MISSING_ARG_TOPIC")
    if not is_valid_topic_name(topic):
        return text_error(400, "INVALID_ARG_TOPIC")
    channel = request.query.get("channel")
    if channel is None:
        return text_error(400, "MISSING_ARG_CHANNEL")
    if not is_valid_channel_name(channel):
        return text_error(400, "INVALID_ARG_CHANNEL")
    text = request.query.get("max_in_flight")
    if text is None:
        return topic, channel, default_max_in_flight
    if not text.isdigit() or int(text) <= 0:
        return text_error(400, "INVALID_ARG_MAX_IN_FLIGHT")
    return topic, channel, int(text)


def stream_headers(sse: bool) -> dict[str, str]:
    if sse:
        return {
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # proxies such as nginx must not buffer the stream
        }
    return {"Content-Type": "text/plain; charset=utf-8", "Connection": "close"}


def text_error(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message + "\n")


# --------------------------------------------------------------------------- /pub


class Publisher:
    """``/pub``'s producer: over ``--nsqd-tcp-address``, or every nsqd nsqlookupd knows."""

    def __init__(self, opts: Options, logger: lg.Logger) -> None:
        self.opts = opts
        self.logger = logger
        self.config = common.client_config(opts.producer_opt, "producer-opt")
        self._producer: Producer | None = None
        self._lock = asyncio.Lock()

    async def publish(self, topic: str, body: bytes) -> None:
        producer = await self._get()
        try:
            await producer.publish(topic, body)
        except NoConnectionsError:
            if not self.opts.lookupd_http_address:
                raise
            await self._reset(producer)  # the nsqd we knew went away: ask nsqlookupd again
            await (await self._get()).publish(topic, body)

    async def close(self) -> None:
        if self._producer is not None:
            await self._reset(self._producer)

    async def _get(self) -> Producer:
        async with self._lock:
            if self._producer is None:
                addresses = self.opts.nsqd_tcp_address or await self._lookupd_nodes()
                if not addresses:
                    raise NoConnectionsError("no nsqd registered with nsqlookupd")
                options = self.config.producer_options(common.user_agent(PROGRAM))
                self._producer = Producer(addresses, **options)
            return self._producer

    async def _reset(self, producer: Producer) -> None:
        if self._producer is producer:
            self._producer = None
        await producer.close()

    async def _lookupd_nodes(self) -> list[str]:
        client = ApiClient(connect_timeout=None, request_timeout=5.0)
        found: list[str] = []
        try:
            for address in self.opts.lookupd_http_address:
                url = api_url(address, "nodes")
                try:
                    body = await client.get_v1(url)
                except RequestError as exc:
                    self.logger.error(f"error querying nsqlookupd ({url}) - {exc}")
                    continue
                if isinstance(body, dict):
                    found.extend(producer_addresses(body))
        finally:
            await client.close()
        return list(dict.fromkeys(found))


# --------------------------------------------------------------------------- the command


async def run(opts: Options) -> int:
    validate(opts)
    logger = lg.Logger(opts.log_prefix, opts.log_level)
    stopping = common.stop_event()
    server = PubSubServer(opts, logger)
    try:
        sock = listen_socket(opts.http_address)
    except ListenError as exc:
        raise common.FatalError(f"FATAL: {exc}") from None
    runner = await start_app(server.app(), sock, handler_cancellation=True)
    logger.info(f"HTTP: listening on {format_address(sock.getsockname())}")
    try:
        await stopping.wait()
    finally:
        await server.close()
        await runner.cleanup()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_app(PROGRAM, Options, argv, run)


if __name__ == "__main__":
    sys.exit(main())
