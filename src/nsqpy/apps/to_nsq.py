"""``to_nsq``: publish stdin, split on a delimiter, to a topic on every given nsqd
(Go: apps/to_nsq).

Empty records are skipped; each record goes to **every** ``--nsqd-tcp-address`` (one producer
per address, as Go). ``--rate`` throttles to that many records a second with Go's token bucket
(one token per ``1/rate`` seconds, at most one second of tokens saved up, one wait of
``1/rate`` when the bucket is empty). A publish error is fatal (exit 1), as in Go.

On purpose unlike Go: publishes are pipelined (many PUBs in flight on each connection, still in
input order) instead of one round trip each, and when the input does not end with the
delimiter its last record is published whole (Go drops that record's last byte).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from ..client import NoConnectionsError, NSQDConnectError, Producer
from ..internal.flags import INT, STR, STR_LIST, option
from .common import (
    FatalError,
    ProducerFlags,
    client_config,
    describe_error,
    go_log,
    run_app,
    stop_event,
    user_agent,
)

PROGRAM = "to_nsq"
#: publishes in flight per batch (each producer keeps its answers in order)
PIPELINE = 256
READ_SIZE = 64 * 1024


@dataclass
class Options(ProducerFlags):
    topic: str = option("topic", "", STR, "NSQ topic to publish to")
    delimiter: str = option("delimiter", "\n", STR, "character to split input from stdin")
    nsqd_tcp_address: list[str] = option(
        "nsqd-tcp-address",
        [],
        STR_LIST,
        "destination nsqd TCP address (may be given multiple times)",
    )
    rate: int = option("rate", 0, INT, "Throttle messages to n/second. 0 to disable")


class TokenBucket:
    """Go's to_nsq throttle: a token every ``1/rate`` s, capped at ``rate`` tokens."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.interval = 1.0 / rate
        self.balance = 1.0
        self.last = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        ticks = int((now - self.last) / self.interval)
        if ticks:
            self.last += ticks * self.interval
            self.balance = min(self.balance + ticks, float(self.rate))

    async def take(self) -> None:
        self._refill()
        if self.balance <= 0:
            await asyncio.sleep(self.interval)
            self._refill()
        self.balance -= 1


async def read_chunks(stream: BinaryIO) -> AsyncGenerator[bytes, None]:
    """Chunks of ``stream``'s file read by a daemon thread (a blocked read never holds up
    exit)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=8)

    fd = stream.fileno()

    def pump() -> None:
        while True:
            # os.read, not the buffered reader: a thread blocked inside BufferedReader holds
            # its lock, and the interpreter aborts at exit when it cannot take that lock
            try:
                chunk = os.read(fd, READ_SIZE)
            except OSError:
                chunk = b""
            try:
                asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()
            except RuntimeError:  # the loop is gone
                return
            if not chunk:
                return

    threading.Thread(target=pump, name="to_nsq-stdin", daemon=True).start()
    while chunk := await queue.get():
        yield chunk


async def read_records(stream: BinaryIO, delimiter: bytes) -> AsyncGenerator[list[bytes], None]:
    """Batches of non-empty records, in input order."""
    rest = b""
    async for chunk in read_chunks(stream):
        parts = (rest + chunk).split(delimiter)
        rest = parts.pop()
        records = [p for p in parts if p]
        if records:
            yield records
    if rest:
        yield [rest]


async def publish(
    producers: dict[str, Producer],
    topic: str,
    records: list[bytes],
    bucket: TokenBucket | None,
    stop: asyncio.Event,
) -> None:
    """Publish a batch to every producer: throttled one at a time (until a stop signal), else
    pipelined."""
    if bucket is not None:
        for record in records:
            if stop.is_set():
                return
            await bucket.take()
            for address, producer in producers.items():
                await _publish_one(address, producer, topic, record)
        return
    for start in range(0, len(records), PIPELINE):
        batch = records[start : start + PIPELINE]
        await asyncio.gather(
            *(_publish_one(a, p, topic, r) for r in batch for a, p in producers.items())
        )


async def _publish_one(address: str, producer: Producer, topic: str, record: bytes) -> None:
    try:
        await producer.publish(topic, record)
    except NoConnectionsError as exc:  # say which nsqd and why, as Go's dial error does
        cause = exc.__cause__ or exc
        raise NSQDConnectError(address, cause) from cause


async def to_nsq(opts: Options) -> int:
    if not opts.topic:
        raise FatalError("--topic required")
    delimiter = os.fsencode(opts.delimiter)
    if len(delimiter) != 1:
        raise FatalError("--delimiter must be a single byte")
    stop = stop_event()
    config = client_config(opts.producer_opt, "producer-opt")
    try:
        config.validate()
        kwargs = config.producer_options(user_agent(PROGRAM))
        producers = {a: Producer(a, **kwargs) for a in dict.fromkeys(opts.nsqd_tcp_address)}
    except ValueError as exc:
        raise FatalError(f"failed to create nsq.Producer - {exc}") from None
    if not producers:
        raise FatalError("--nsqd-tcp-address required")
    bucket = None
    if opts.rate >= 1:
        go_log(f"Throttling messages rate to max:{opts.rate}/second")
        bucket = TokenBucket(opts.rate)
    try:
        await _publish_stdin(producers, opts.topic, delimiter, bucket, stop)
    except Exception as exc:
        raise FatalError(describe_error(exc)) from None
    finally:
        await asyncio.gather(*(p.close() for p in producers.values()))
    return 0


async def _publish_stdin(
    producers: dict[str, Producer],
    topic: str,
    delimiter: bytes,
    bucket: TokenBucket | None,
    stop: asyncio.Event,
) -> None:
    """Publish stdin's records until EOF; after a stop signal, only what was already read."""
    batches = read_records(sys.stdin.buffer, delimiter)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while True:
            reading = asyncio.ensure_future(anext(batches))
            await asyncio.wait([reading, stopping], return_when=asyncio.FIRST_COMPLETED)
            if not reading.done():  # stopped while waiting for input
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
                return
            try:
                records = reading.result()
            except StopAsyncIteration:
                return
            await publish(producers, topic, records, bucket, stop)
            if stop.is_set():
                return
    finally:
        stopping.cancel()
        await batches.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    return run_app(PROGRAM, Options, argv, to_nsq)


if __name__ == "__main__":
    sys.exit(main())
