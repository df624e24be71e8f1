"""A blocking facade for scripts, running the asyncio client on a private event-loop thread.

::

    from nsqpy.client import sync

    sync.publish("127.0.0.1:4150", "events", b"hello")
    messages = sync.consume("events", "script", 10, nsqd_tcp_addresses="127.0.0.1:4150")

    with sync.SyncProducer("127.0.0.1:4150") as producer:
        for line in open("events.log", "rb"):
            producer.publish("events", line.rstrip(b"\\n"))

It works from any thread, including one whose own event loop is running (e.g. a notebook):
the client always runs on its own loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, TypeVar

from .consumer import Consumer
from .message import Message
from .producer import Producer

__all__ = ["SyncProducer", "consume", "publish"]

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever on a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="nsqpy-sync", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            if future.done():
                raise  # the coroutine's own TimeoutError (e.g. ConsumeTimeout)
            future.cancel()
            raise TimeoutError(f"no answer within {timeout}s") from None

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _encode(body: bytes | str) -> bytes:
    return body.encode() if isinstance(body, str) else body


class SyncProducer:
    """A :class:`~nsqpy.client.Producer` with blocking methods; ``timeout`` bounds each call."""

    def __init__(
        self,
        nsqd_tcp_addresses: str | Sequence[str],
        *,
        timeout: float = 10.0,
        **producer_options: Any,
    ) -> None:
        self.timeout = timeout
        self._runner = _LoopThread()
        self._producer = Producer(nsqd_tcp_addresses, **producer_options)

    def publish(self, topic: str, body: bytes | str) -> None:
        self._runner.run(self._producer.publish(topic, _encode(body)), self.timeout)

    def multi_publish(self, topic: str, bodies: Sequence[bytes | str]) -> None:
        encoded = [_encode(b) for b in bodies]
        self._runner.run(self._producer.multi_publish(topic, encoded), self.timeout)

    def deferred_publish(self, topic: str, delay: float, body: bytes | str) -> None:
        self._runner.run(self._producer.deferred_publish(topic, delay, _encode(body)), self.timeout)

    def close(self) -> None:
        if not self._runner.loop.is_closed():
            try:
                self._runner.run(self._producer.close(), self.timeout)
            finally:
                self._runner.stop()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def publish(
    nsqd_tcp_address: str | Sequence[str],
    topic: str,
    body: bytes | str | Sequence[bytes | str],
    *,
    timeout: float = 10.0,
    **producer_options: Any,
) -> None:
    """Publish one message, or a list of messages atomically (MPUB), and return."""
    with SyncProducer(nsqd_tcp_address, timeout=timeout, **producer_options) as producer:
        if isinstance(body, (bytes, str)):
            producer.publish(topic, body)
        else:
            producer.multi_publish(topic, list(body))


class ConsumeTimeout(TimeoutError):
    """Fewer than the requested messages arrived in time; ``messages`` holds those that did."""

    def __init__(self, messages: list[Message], wanted: int) -> None:
        super().__init__(f"received {len(messages)} of {wanted} messages")
        self.messages = messages


def consume(
    topic: str,
    channel: str,
    count: int,
    *,
    nsqd_tcp_addresses: str | Sequence[str] | None = None,
    lookupd_http_addresses: str | Sequence[str] | None = None,
    timeout: float = 30.0,
    **consumer_options: Any,
) -> list[Message]:
    """Receive ``count`` messages, FIN them, close cleanly and return them.

    Messages that arrive beyond ``count`` are requeued at once (without backoff). Raises
    :class:`ConsumeTimeout` (carrying what did arrive) after ``timeout`` seconds.
    """
    if count < 1:
        raise ValueError("count must be >= 1")
    consumer_options.setdefault("max_in_flight", min(count, 2500))
    runner = _LoopThread()
    try:
        return runner.run(
            _consume(
                topic,
                channel,
                count,
                nsqd_tcp_addresses,
                lookupd_http_addresses,
                timeout,
                consumer_options,
            )
        )
    finally:
        runner.stop()


async def _consume(
    topic: str,
    channel: str,
    count: int,
    nsqd_tcp_addresses: str | Sequence[str] | None,
    lookupd_http_addresses: str | Sequence[str] | None,
    timeout: float,
    options: dict[str, Any],
) -> list[Message]:
    received: list[Message] = []
    enough = asyncio.Event()

    def handler(message: Message) -> None:
        if len(received) >= count:
            message.requeue(0, backoff=False)
            return
        received.append(message)
        if len(received) >= count:
            enough.set()

    consumer = Consumer(
        topic,
        channel,
        handler,
        nsqd_tcp_addresses=nsqd_tcp_addresses,
        lookupd_http_addresses=lookupd_http_addresses,
        **options,
    )
    await consumer.start()
    try:
        await asyncio.wait_for(enough.wait(), timeout)
    except TimeoutError:
        raise ConsumeTimeout(received, count) from None
    finally:
        await consumer.close()
    return received
