"""Publishing: a pipelined TCP producer over a pool of nsqd, and HTTP publish helpers."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import aiohttp

from ..protocol import commands
from ..protocol.names import is_valid_topic_name
from .backoff import ReconnectDelay
from .connection import Connection, ConnectionOptions
from .errors import (
    ClosedError,
    ConnectionClosedError,
    HTTPPublishError,
    IdentifyError,
    NoConnectionsError,
    ServerError,
)
from .message import Message

__all__ = ["Producer", "http_multi_publish", "http_publish"]

log = logging.getLogger("nsqpy.client")

#: nsqd could not store the message (e.g. it is exiting): another nsqd may
_FAILOVER_CODES = frozenset({"E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED"})


class _Slot:
    """One nsqd of the pool: its connection (if any) and when to try it again after failing."""

    __slots__ = ("address", "conn", "connecting", "delays", "last_error", "retry_at")

    def __init__(self, address: str, delays: ReconnectDelay) -> None:
        self.address = address
        self.conn: Connection | None = None
        self.connecting: asyncio.Task[Connection | None] | None = None
        self.delays = delays
        self.retry_at = 0.0
        #: why the last connection attempt failed (chained to NoConnectionsError)
        self.last_error: BaseException | None = None


class Producer:
    """Publish to one or more nsqd over TCP.

    ::

        async with Producer(["127.0.0.1:4150", "127.0.0.1:4250"]) as producer:
            await producer.publish("events", b"hello")
            await producer.multi_publish("events", [b"a", b"b"])
            await producer.deferred_publish("events", 5.0, b"later")

    Commands pipeline: many concurrent ``publish`` calls share one connection, their commands
    go out together and the answers are matched in order. Calls rotate over the pool; when an
    nsqd is unreachable or dies, the call moves on to the next one and the dead one is retried
    after an exponentially growing delay. A publish interrupted by a dying connection is
    resent elsewhere, so a message may (rarely) be published twice: NSQ is at-least-once.

    ``request_timeout``: an nsqd that keeps its connection open but does not answer (paused,
    overloaded, cut off by a partition) holds a publish until the connection's
    ``read_timeout`` (a minute by default). With a timeout, a publish that gets no answer (or
    no connection) in that many seconds moves on to the next nsqd, and the silent one is
    dropped and retried after the reconnect delay. The abandoned command may still be
    applied when that nsqd wakes up: one more way to publish a message twice.

    Connection settings (``tls``, ``snappy``, ``deflate``, ``auth_secret``...) are keyword
    arguments passed to :class:`ConnectionOptions`.
    """

    def __init__(
        self,
        nsqd_tcp_addresses: str | Sequence[str],
        *,
        reconnect_interval: float = 1.0,
        max_reconnect_interval: float = 60.0,
        request_timeout: float | None = None,
        rng: random.Random | None = None,
        **connection_options: Any,
    ) -> None:
        addresses = (
            [nsqd_tcp_addresses] if isinstance(nsqd_tcp_addresses, str) else nsqd_tcp_addresses
        )
        if not addresses:
            raise ValueError("a producer needs at least one nsqd address")
        if request_timeout is not None and request_timeout <= 0:
            raise ValueError("request_timeout must be positive (or None)")
        self.options = ConnectionOptions(**connection_options)
        self.request_timeout = request_timeout
        self.rng = rng if rng is not None else random.Random()
        self._slots = [
            _Slot(a, ReconnectDelay(reconnect_interval, max_reconnect_interval, rng=self.rng))
            for a in addresses
        ]
        self._next = 0
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def connect(self) -> None:
        """Connect to every nsqd now (otherwise the first publish does); raises
        :class:`NoConnectionsError` if none is reachable."""
        results = await asyncio.gather(*(self._connection(s) for s in self._slots))
        if not any(results):
            raise NoConnectionsError("could not connect to any nsqd")

    async def close(self) -> None:
        """Close every connection; publishes still waiting for an answer fail."""
        self._closed = True
        conns = []
        for slot in self._slots:
            if slot.connecting is not None:
                slot.connecting.cancel()
            if slot.conn is not None:
                conns.append(slot.conn)
                slot.conn.close()
                slot.conn = None
        for conn in conns:
            await conn.wait_closed()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def connected_addresses(self) -> list[str]:
        return [s.address for s in self._slots if s.conn is not None and s.conn.is_open]

    # ------------------------------------------------------------------ publishing

    async def publish(self, topic: str, body: bytes) -> None:
        """PUB one message; returns when nsqd answered OK."""
        _check_topic(topic)
        await self._send(commands.pub(topic, body))

    async def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """MPUB: publish several messages atomically (all or none)."""
        _check_topic(topic)
        if not bodies:
            raise ValueError("multi_publish needs at least one message")
        await self._send(commands.mpub(topic, bodies))

    async def multi_publish_encoded(
        self, topic: str, count: int, messages: bytes | memoryview
    ) -> None:
        """MPUB of ``count`` messages already framed as ``{BE32(size) body}*``, back to back."""
        _check_topic(topic)
        if count < 1 or len(messages) < 4 * count:
            raise ValueError("multi_publish_encoded needs at least one framed message")
        await self._send(commands.mpub_encoded(topic, count, messages))

    async def deferred_publish(self, topic: str, delay: float, body: bytes) -> None:
        """DPUB: the message becomes visible to channels after ``delay`` seconds."""
        _check_topic(topic)
        await self._send(commands.dpub(topic, int(delay * 1000), body))

    async def _send(self, command: bytes) -> None:
        if self._closed:
            raise ClosedError("producer is closed")
        slots = self._slots
        count = len(slots)
        start = self._next
        self._next = (start + 1) % count
        last_error: BaseException | None = None
        # every nsqd once, plus one more turn: a connection that died under this command is
        # reconnected once (the only way forward with a single nsqd)
        for i in range(count + 1):
            slot = slots[(start + i) % count]
            conn = await self._connection_in_time(slot)
            if conn is None:
                continue
            try:
                response = await self._request_in_time(conn, command)
            except TimeoutError:
                last_error = self._abandon(slot, conn)
                continue
            except ConnectionClosedError as exc:
                if not isinstance(last_error, ServerError):  # nsqd's own refusal says more
                    last_error = exc
                continue
            except ServerError as exc:
                if exc.code in _FAILOVER_CODES:
                    last_error = exc
                    continue
                raise
            if response != b"OK":
                raise ServerError(b"E_INVALID unexpected response " + response[:64])
            return
        if self._closed:
            raise ClosedError("producer is closed")
        raise NoConnectionsError(
            f"no nsqd accepted the command ({', '.join(s.address for s in slots)})"
        ) from last_error or next((s.last_error for s in slots if s.last_error), None)

    async def _connection_in_time(self, slot: _Slot) -> Connection | None:
        if self.request_timeout is None:
            return await self._connection(slot)
        conn = slot.conn
        if conn is not None and conn.is_open:
            return conn
        if any(s.conn is not None and s.conn.is_open for s in self._slots if s is not slot):
            # another nsqd takes this publish at once; this one reconnects in the background
            self._connect_in_background(slot)
            return None
        try:  # the connect goes on (shielded) for a later publish
            return await asyncio.wait_for(self._connection(slot), self.request_timeout)
        except TimeoutError:
            # a silent nsqd accepts the TCP connection but never answers IDENTIFY: leave it
            # to the other nsqd until the reconnect delay has passed
            slot.retry_at = time.monotonic() + slot.delays.next()
            return None

    def _connect_in_background(self, slot: _Slot) -> None:
        if self._closed or slot.connecting is not None or time.monotonic() < slot.retry_at:
            return
        task = asyncio.get_running_loop().create_task(self._open(slot))
        slot.connecting = task

        def forget(done: asyncio.Task[Connection | None]) -> None:
            if slot.connecting is done:
                slot.connecting = None

        task.add_done_callback(forget)

    async def _request_in_time(self, conn: Connection, command: bytes) -> bytes:
        if self.request_timeout is None:
            return await self._request(conn, command)
        return await asyncio.wait_for(self._request(conn, command), self.request_timeout)

    @staticmethod
    async def _request(conn: Connection, command: bytes) -> bytes:
        await conn.drain()
        return await conn.request(command)

    def _abandon(self, slot: _Slot, conn: Connection) -> ConnectionClosedError:
        """nsqd did not answer in time: drop the connection (the commands still waiting on it
        fail over too) and leave that nsqd alone for the reconnect delay."""
        delay = slot.delays.next()
        slot.retry_at = time.monotonic() + delay
        error = ConnectionClosedError(
            f"{slot.address}: no answer in {self.request_timeout}s (retry in {delay:.1f}s)"
        )
        slot.last_error = error
        log.error("(%s) %s", slot.address, error)
        conn.abort()  # not close(): a full write buffer to a silent nsqd would never flush
        return error

    async def _connection(self, slot: _Slot) -> Connection | None:
        conn = slot.conn
        if conn is not None and conn.is_open:
            return conn
        if self._closed:
            return None
        if slot.connecting is None:
            if time.monotonic() < slot.retry_at:
                return None  # failed recently: let the other nsqd take the traffic
            slot.connecting = asyncio.get_running_loop().create_task(self._open(slot))
        elif time.monotonic() < slot.retry_at:
            return None  # still connecting after request_timeout: not waited for again yet
        task = slot.connecting
        try:
            return await asyncio.shield(task)
        finally:
            if task.done() and slot.connecting is task:
                slot.connecting = None

    async def _open(self, slot: _Slot) -> Connection | None:
        conn = Connection(slot.address, self.options, _ProducerDelegate(self, slot))
        try:
            await conn.connect()
        except (ConnectionClosedError, IdentifyError, OSError) as exc:
            delay = slot.delays.next()
            slot.retry_at = time.monotonic() + delay
            slot.last_error = exc
            log.error(
                "(%s) error connecting to nsqd - %s (retry in %.1fs)", slot.address, exc, delay
            )
            return None
        if self._closed:
            conn.close()
            return None
        conn.start_streaming()
        slot.delays.reset()
        slot.last_error = None
        slot.conn = conn
        log.info("(%s) producer connected", slot.address)
        return conn


class _ProducerDelegate:
    """Connection events for a producer's connection."""

    __slots__ = ("producer", "slot")

    def __init__(self, producer: Producer, slot: _Slot) -> None:
        self.producer = producer
        self.slot = slot

    def on_message(self, conn: Connection, message: Message) -> None:
        log.error("(%s) producer connection received a message", conn.address)

    def on_message_finished(self, conn: Connection, message: Message) -> None:
        pass

    def on_message_requeued(
        self, conn: Connection, message: Message, delay: float | None, backoff: bool
    ) -> None:
        pass

    def on_response(self, conn: Connection, data: bytes) -> None:
        log.error("(%s) unexpected response %r", conn.address, data[:32])
        conn.close()

    def on_server_error(self, conn: Connection, error: ServerError) -> None:
        if error.fatal:
            log.error("(%s) %s", conn.address, error)

    def on_close(self, conn: Connection, exc: BaseException | None) -> None:
        slot = self.slot
        if slot.conn is conn:
            slot.conn = None  # the next publish reconnects (or backs off if that fails)
            log.warning(
                "(%s) producer connection closed%s", conn.address, f" ({exc!r})" if exc else ""
            )


def _check_topic(topic: str) -> None:
    if not is_valid_topic_name(topic):
        raise ValueError(f"invalid topic name {topic!r}")


# ---------------------------------------------------------------------- HTTP


def _http_base(address: str) -> str:
    base = address if "://" in address else "http://" + address
    return base.rstrip("/")


async def _http_post(
    url: str,
    params: dict[str, str],
    data: bytes,
    session: aiohttp.ClientSession | None,
    timeout: float,
) -> None:
    own = session is None
    client = session if session is not None else aiohttp.ClientSession()
    try:
        async with client.post(
            url, params=params, data=data, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            text = await resp.text()
            if resp.status != 200:
                message = text
                try:
                    payload = await resp.json(content_type=None)
                    if isinstance(payload, dict) and "message" in payload:
                        message = str(payload["message"])
                except ValueError:
                    pass
                raise HTTPPublishError(resp.status, message)
    finally:
        if own:
            await client.close()


async def http_publish(
    nsqd_http_address: str,
    topic: str,
    body: bytes,
    *,
    defer: float | None = None,
    session: aiohttp.ClientSession | None = None,
    timeout: float = 10.0,
) -> None:
    """POST ``/pub``: publish one message over nsqd's HTTP API (``defer`` in seconds)."""
    _check_topic(topic)
    params = {"topic": topic}
    if defer is not None:
        params["defer"] = str(int(defer * 1000))
    await _http_post(f"{_http_base(nsqd_http_address)}/pub", params, body, session, timeout)


async def http_multi_publish(
    nsqd_http_address: str,
    topic: str,
    bodies: Sequence[bytes],
    *,
    binary: bool = True,
    session: aiohttp.ClientSession | None = None,
    timeout: float = 10.0,
) -> None:
    """POST ``/mpub``: publish several messages atomically over nsqd's HTTP API.

    ``binary=True`` sends the length-prefixed format, so bodies may contain anything;
    ``binary=False`` sends newline-separated bodies (which then must not contain ``\\n``).
    """
    _check_topic(topic)
    if not bodies:
        raise ValueError("http_multi_publish needs at least one message")
    params = {"topic": topic}
    if binary:
        params["binary"] = "true"
        data = commands.mpub_body(bodies)
    else:
        if any(b"\n" in body for body in bodies):
            raise ValueError("newline-separated /mpub bodies cannot contain '\\n'")
        data = b"\n".join(bodies)
    await _http_post(f"{_http_base(nsqd_http_address)}/mpub", params, data, session, timeout)
