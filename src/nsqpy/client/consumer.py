"""The consumer: subscribes to a topic/channel on every nsqd that has it and feeds a handler."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ..protocol import commands
from ..protocol.frames import CLOSE_WAIT
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from .backoff import BackoffStrategy, ExponentialBackoff, ReconnectDelay
from .connection import Connection, ConnectionOptions
from .errors import NSQDConnectError, ServerError
from .lookup import LookupdPoller
from .message import Message
from .rdy import Outcome, RdyManager, RdyState

__all__ = ["Consumer", "ConsumerStats", "Handler"]

log = logging.getLogger("nsqpy.client")

#: A handler takes a message. Returning normally FINishes it; returning ``False`` or raising
#: REQueues it (with backoff). It may be a coroutine function.
Handler = Callable[[Message], Any]


@dataclass(frozen=True)
class ConsumerStats:
    messages_received: int
    messages_finished: int
    messages_requeued: int
    connections: int


def _as_list(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


class Consumer:
    """Consume ``topic``/``channel`` from nsqd found directly or through nsqlookupd.

    ::

        async def handle(message: Message) -> None:
            print(message.body)

        async with Consumer("events", "archive", handle,
                            lookupd_http_addresses=["127.0.0.1:4161"], max_in_flight=100):
            await asyncio.sleep(60)

    Connection settings (``tls``, ``snappy``, ``deflate``, ``auth_secret``,
    ``heartbeat_interval``, ``msg_timeout``, ``sample_rate``, ``client_id``...) are keyword
    arguments passed to :class:`ConnectionOptions`. Durations are seconds.

    Sync handlers run inline on the event loop (keep them short, or make them async); async
    handlers run as one task per message, at most ``max_in_flight`` at once. Answer messages
    from the event loop's thread.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler,
        *,
        nsqd_tcp_addresses: str | Sequence[str] | None = None,
        lookupd_http_addresses: str | Sequence[str] | None = None,
        max_in_flight: int = 1,
        max_attempts: int = 5,
        on_giving_up: Callable[[Message], Any] | None = None,
        requeue_delay: float = 90.0,
        max_requeue_delay: float = 900.0,
        backoff_strategy: BackoffStrategy | None = None,
        backoff_multiplier: float = 1.0,
        max_backoff_duration: float = 120.0,
        lookupd_poll_interval: float = 60.0,
        lookupd_poll_jitter: float = 0.3,
        lookupd_poll_timeout: float = 60.0,
        low_rdy_idle_timeout: float = 10.0,
        low_rdy_timeout: float = 30.0,
        rdy_redistribute_interval: float = 5.0,
        rdy_settle_time: float = 0.1,
        reconnect_interval: float = 1.0,
        max_reconnect_interval: float = 60.0,
        close_timeout: float = 30.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        **connection_options: Any,
    ) -> None:
        if not is_valid_topic_name(topic):
            raise ValueError(f"invalid topic name {topic!r}")
        if not is_valid_channel_name(channel):
            raise ValueError(f"invalid channel name {channel!r}")
        if not callable(handler):
            raise TypeError("handler must be callable")
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        self.topic = topic
        self.channel = channel
        self.handler = handler
        self.nsqd_tcp_addresses = _as_list(nsqd_tcp_addresses)
        self.lookupd_http_addresses = _as_list(lookupd_http_addresses)
        if not self.nsqd_tcp_addresses and not self.lookupd_http_addresses:
            raise ValueError("give nsqd_tcp_addresses and/or lookupd_http_addresses")
        self.options = ConnectionOptions(**connection_options)
        if not self.options.heartbeats_enabled:
            raise ValueError("nsqd refuses SUB with heartbeats disabled")
        self.max_attempts = max_attempts
        self.on_giving_up = on_giving_up
        self.requeue_delay = requeue_delay
        self.max_requeue_delay = max_requeue_delay
        self.lookupd_poll_interval = lookupd_poll_interval
        self.lookupd_poll_jitter = lookupd_poll_jitter
        self.lookupd_poll_timeout = lookupd_poll_timeout
        self.rdy_redistribute_interval = rdy_redistribute_interval
        self.reconnect_interval = reconnect_interval
        self.max_reconnect_interval = max_reconnect_interval
        self.close_timeout = close_timeout
        self.rng = rng if rng is not None else random.Random()
        self.clock = clock
        self._backoff_strategy = (
            backoff_strategy
            if backoff_strategy is not None
            else ExponentialBackoff(backoff_multiplier)
        )
        self._max_in_flight = max_in_flight
        self._rdy_settings = {
            "max_backoff_duration": max_backoff_duration,
            "low_rdy_idle_timeout": low_rdy_idle_timeout,
            "low_rdy_timeout": low_rdy_timeout,
            "settle_time": rdy_settle_time,
        }
        self._rdy: RdyManager | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Task[None]] = {}
        self._reconnect_delays: dict[str, ReconnectDelay] = {}
        self._last_attempt: dict[str, float] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._handler_tasks: set[asyncio.Task[Any]] = set()
        self._poller: LookupdPoller | None = None
        self._started = False
        self._closing = False
        self._closed: asyncio.Event | None = None
        self._drained: asyncio.Event | None = None
        self._received = 0
        self._finished = 0
        self._requeued = 0

    # ------------------------------------------------------------------ public API

    async def start(self, *, raise_connect_errors: bool = False) -> None:
        """Connect to the configured nsqd and start polling nsqlookupd (returns at once).

        With ``raise_connect_errors`` it first waits for the nsqd given by address to connect
        and subscribe, and raises :class:`NSQDConnectError` for the first that fails (as
        go-nsq's ``ConnectToNSQDs``; the command-line tools exit on it). Close the consumer
        after such an error.
        """
        if self._started:
            return
        self._started = True
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._closed = asyncio.Event()
        self._drained = asyncio.Event()
        self._rdy = RdyManager(
            self._max_in_flight,
            backoff_strategy=self._backoff_strategy,
            clock=self.clock,
            call_later=loop.call_later,
            rng=self.rng,
            log=log,
            **self._rdy_settings,
        )
        self._rdy.start_redistribution(self.rdy_redistribute_interval)
        if raise_connect_errors:
            await asyncio.gather(
                *(self._connect(a, raise_errors=True) for a in self.nsqd_tcp_addresses)
            )
        for address in self.nsqd_tcp_addresses:
            self._start_connect(address)
        if self.lookupd_http_addresses:
            self._poller = LookupdPoller(
                self.lookupd_http_addresses,
                self.topic,
                self._on_discovered,
                interval=self.lookupd_poll_interval,
                jitter=self.lookupd_poll_jitter,
                timeout=self.lookupd_poll_timeout,
                rng=self.rng,
            )
            self._poller.start()

    async def wait_connected(self, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until at least ``count`` nsqd connections are subscribed."""
        deadline = time.monotonic() + timeout
        while len(self._conns) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self._conns)} of {count} connections")
            await asyncio.sleep(0.01)

    async def close(self, timeout: float | None = None) -> None:
        """Clean close: CLS to every nsqd, wait for in-flight messages (up to ``timeout``,
        default ``close_timeout``), then close the sockets."""
        if not self._started:
            self._closing = True
            return
        assert self._closed is not None and self._drained is not None
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        timeout = self.close_timeout if timeout is None else timeout
        if self._poller is not None:
            await self._poller.close()
        for task in list(self._background) + list(self._connecting.values()):
            task.cancel()
        rdy = self._rdy
        assert rdy is not None
        rdy.close()
        waiters: list[asyncio.Future[bytes]] = []
        for conn in list(self._conns.values()):
            try:
                waiters.append(conn.start_close())
            except Exception:  # already gone
                continue
        try:
            await asyncio.wait_for(self._wait_drained(waiters), timeout)
        except TimeoutError:
            log.warning("close timed out with %d message(s) in flight", self.in_flight)
        for task in list(self._handler_tasks):
            task.cancel()
        for conn in list(self._conns.values()):
            conn.close()
        for conn in list(self._conns.values()):
            await conn.wait_closed()
        self._closed.set()

    async def wait_closed(self) -> None:
        if self._closed is not None:
            await self._closed.wait()

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    def change_max_in_flight(self, max_in_flight: int) -> None:
        """Change max_in_flight at run time; 0 pauses the flow, a positive value resumes."""
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        self._max_in_flight = max_in_flight
        if self._rdy is not None:
            self._rdy.change_max_in_flight(max_in_flight)

    def is_starved(self) -> bool:
        """True when some connection has (nearly) all its RDY in flight: process your batch."""
        return self._rdy.is_starved() if self._rdy is not None else False

    @property
    def in_backoff(self) -> bool:
        return self._rdy is not None and (self._rdy.in_backoff or self._rdy.in_backoff_timeout)

    @property
    def in_flight(self) -> int:
        return sum(c.rdy_state.in_flight for c in self._conns.values() if c.rdy_state)

    @property
    def connections(self) -> dict[str, Connection]:
        return dict(self._conns)

    def stats(self) -> ConsumerStats:
        return ConsumerStats(self._received, self._finished, self._requeued, len(self._conns))

    # ------------------------------------------------------------------ connecting

    def _on_discovered(self, addresses: list[str]) -> None:
        now = self.clock()
        for address in addresses:
            if address in self._conns or address in self._connecting:
                continue
            # a round right after a failure must not hammer an nsqd that is still going away
            last = self._last_attempt.get(address)
            if last is not None and now - last < self.reconnect_interval:
                continue
            self._start_connect(address)

    def _start_connect(self, address: str) -> None:
        if self._closing or address in self._conns or address in self._connecting:
            return
        assert self._loop is not None
        self._last_attempt[address] = self.clock()
        task = self._loop.create_task(self._connect(address))
        self._connecting[address] = task
        task.add_done_callback(lambda done: self._forget_connecting(address, done))

    def _forget_connecting(self, address: str, task: asyncio.Task[None]) -> None:
        if self._connecting.get(address) is task:
            del self._connecting[address]

    async def _connect(self, address: str, raise_errors: bool = False) -> None:
        conn = Connection(address, self.options, self)
        try:
            await conn.connect()
            response = await conn.handshake_command(commands.sub(self.topic, self.channel))
            if response != b"OK":
                raise ServerError(b"E_INVALID unexpected SUB response " + response[:32])
        except asyncio.CancelledError:
            conn.abort()
            raise
        except Exception as exc:
            log.error("(%s) error connecting to nsqd - %s", address, exc)
            conn.abort()
            if raise_errors:
                raise NSQDConnectError(address, exc) from exc
            self._schedule_reconnect(address)
            return
        if self._closing:
            conn.close()
            return
        rdy = self._rdy
        assert rdy is not None
        if conn.max_rdy_count < rdy.max_in_flight:
            log.warning(
                "(%s) max RDY count %d < consumer max in flight %d, truncation possible",
                address,
                conn.max_rdy_count,
                rdy.max_in_flight,
            )
        log.info("(%s) connected and subscribed to %s/%s", address, self.topic, self.channel)
        state = RdyState(address, conn.send_rdy, conn.max_rdy_count, self.clock())
        conn.rdy_state = state
        self._conns[address] = conn
        self._reconnect_delays.pop(address, None)
        conn.start_streaming()
        if conn.is_open:
            rdy.add(state)

    def _schedule_reconnect(self, address: str) -> None:
        """Direct nsqd are retried with exponential delays; discovered ones by later polls."""
        if self._closing:
            return
        if address not in self.nsqd_tcp_addresses:
            if self._poller is not None:
                self._poller.trigger()
            return
        delays = self._reconnect_delays.get(address)
        if delays is None:
            delays = ReconnectDelay(
                self.reconnect_interval, self.max_reconnect_interval, rng=self.rng
            )
            self._reconnect_delays[address] = delays
        delay = delays.next()
        log.info("(%s) re-connecting in %.2fs", address, delay)
        assert self._loop is not None
        task = self._loop.create_task(self._reconnect_after(address, delay))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _reconnect_after(self, address: str, delay: float) -> None:
        await asyncio.sleep(delay)
        self._start_connect(address)

    # ------------------------------------------------------------------ ConnectionDelegate

    def on_message(self, conn: Connection, message: Message) -> None:
        state = conn.rdy_state
        assert state is not None and self._rdy is not None
        self._rdy.on_message(state)
        self._received += 1
        if 0 < self.max_attempts < message.attempts:
            self._give_up(message)
            return
        try:
            result = self.handler(message)  # an async handler returns its coroutine here
        except Exception:
            self._handler_raised(message)
            return
        # the common results first: isawaitable is a measurable share of a message's cost
        if result is None or result is True or result is False or not inspect.isawaitable(result):
            self._auto_respond(message, result)
        else:
            self._spawn(self._await_result(message, result))

    def on_message_finished(self, conn: Connection, message: Message) -> None:
        self._finished += 1
        self._respond(conn, commands.fin(message.id), Outcome.FINISHED)

    def on_message_requeued(
        self, conn: Connection, message: Message, delay: float | None, backoff: bool
    ) -> None:
        if delay is None or delay < 0:
            delay = min(self.requeue_delay * message.attempts, self.max_requeue_delay)
        self._requeued += 1
        outcome = Outcome.REQUEUED if backoff else Outcome.REQUEUED_NO_BACKOFF
        self._respond(conn, commands.req(message.id, int(delay * 1000)), outcome)

    def _respond(self, conn: Connection, command: bytes, outcome: Outcome) -> None:
        state = conn.rdy_state
        rdy = self._rdy
        assert state is not None and rdy is not None
        if not conn.is_open:
            state.in_flight -= 1  # nsqd requeues it after msg_timeout; nothing to send
            self._check_drained()
            return
        rdy.on_response(state, outcome)
        conn.write(command)
        rdy.after_response(state)
        if self._closing:
            self._check_drained()

    def on_response(self, conn: Connection, data: bytes) -> None:
        if data == CLOSE_WAIT:
            log.info("(%s) received CLOSE_WAIT from nsqd", conn.address)
        else:
            log.warning("(%s) unexpected response %r", conn.address, data[:64])

    def on_server_error(self, conn: Connection, error: ServerError) -> None:
        if error.fatal:
            # nsqd closes the connection after a fatal error; reconnecting follows on_close
            log.error("(%s) protocol error - %s", conn.address, error)
            conn.close()
        else:
            log.warning("(%s) %s", conn.address, error)

    def on_close(self, conn: Connection, exc: BaseException | None) -> None:
        if self._conns.get(conn.address) is not conn:
            return
        del self._conns[conn.address]
        if conn.rdy_state is not None and self._rdy is not None:
            self._rdy.remove(conn.rdy_state)
        if self._closing:
            log.info("(%s) connection closed", conn.address)
            self._check_drained()
            return
        log.warning(
            "(%s) connection closed%s; %d left",
            conn.address,
            f" ({exc!r})" if exc else "",
            len(self._conns),
        )
        self._schedule_reconnect(conn.address)

    # ------------------------------------------------------------------ handlers

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._handler_tasks.add(task)
        task.add_done_callback(self._handler_tasks.discard)

    async def _await_result(self, message: Message, result: Awaitable[Any]) -> None:
        try:
            value = await result
        except Exception:
            self._handler_raised(message)
            return
        self._auto_respond(message, value)

    def _handler_raised(self, message: Message) -> None:
        log.exception("handler raised for message %s", message.id.decode())
        if message.auto_response:
            message.requeue()

    @staticmethod
    def _auto_respond(message: Message, result: object) -> None:
        """The handler returned: FIN, or REQ if it said False (unless it responded itself)."""
        if message.auto_response and not message.responded:
            if result is False:
                message.requeue()
            else:
                message.finish()

    def _give_up(self, message: Message) -> None:
        log.warning("msg %s attempted %d times, giving up", message.id.decode(), message.attempts)
        callback = self.on_giving_up
        if callback is None:
            message.finish()
            return
        try:
            result = callback(message)
        except Exception:
            log.exception("on_giving_up raised for message %s", message.id.decode())
            message.finish()
            return
        if inspect.isawaitable(result):
            self._spawn(self._finish_after(message, result))
        else:
            message.finish()

    async def _finish_after(self, message: Message, pending: Awaitable[Any]) -> None:
        try:
            await pending
        except Exception:
            log.exception("on_giving_up raised for message %s", message.id.decode())
        message.finish()

    # ------------------------------------------------------------------ closing

    def _check_drained(self) -> None:
        if self._drained is not None and self.in_flight == 0:
            self._drained.set()

    async def _wait_drained(self, close_waits: list[asyncio.Future[bytes]]) -> None:
        for waiter in close_waits:
            try:
                await waiter
            except Exception:  # the connection went away: nothing more will arrive on it
                continue
        # messages already on the wire before CLOSE_WAIT have been dispatched by now
        assert self._drained is not None
        while self.in_flight:
            self._drained.clear()
            self._check_drained()
            await self._drained.wait()
