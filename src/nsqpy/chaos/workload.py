"""The workload: producers and consumers, each run as a process inside a client namespace,
writing every operation to a history file (JSON lines).

A producer line: ``{"t": ..., "op": "pub", "n": 17, "outcome": "ok"|"refused"|"unknown",
"error": ...}``; a consumer line: ``{"t": ..., "op": "recv", "n": 17, "nsqd": "...",
"attempts": 1, "id": "..."}``. ``t`` is time.time(): both processes share the machine's clock.

Outcomes follow Jepsen's rule: *refused* only when the message certainly was not taken (nsqd
answered with an error, or no connection could carry it); *unknown* when it may have been
(a timeout, or a connection that died with the command sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import Sequence
from typing import IO, Any

from nsqpy.client import (
    ConnectionClosedError,
    Consumer,
    Message,
    NoConnectionsError,
    NSQError,
    Producer,
    ServerError,
)

log = logging.getLogger("nsqpy.chaos")

TOPIC = "chaos"
CHANNEL = "checker"
#: heartbeats every 2 s and a connection silent for 6 s counts as dead: a partition or a
#: paused nsqd is noticed within seconds, not go-nsq's default minute
FAST_FAILURE_DETECTION: dict[str, Any] = {"heartbeat_interval": 2.0, "read_timeout": 6.0}


class History:
    """Appends one JSON object a line; flushed at once, so a kill loses nothing written."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def record(self, op: str, **fields: Any) -> None:
        self.stream.write(json.dumps({"t": time.time(), "op": op, **fields}) + "\n")
        self.stream.flush()


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def classify(exc: BaseException) -> str:
    """``refused`` or ``unknown`` for a failed publish (see the module docstring)."""
    if isinstance(exc, TimeoutError):
        return "unknown"
    if isinstance(exc, ServerError):
        return "refused"
    if isinstance(exc, NoConnectionsError):
        # the last try was nsqd's refusal or a connect that failed: nothing was sent there;
        # a connection that closed under the command may have delivered it first
        return "unknown" if isinstance(exc.__cause__, ConnectionClosedError) else "refused"
    return "unknown"


async def run_producers(
    nsqd_addresses: list[str],
    history: History,
    *,
    rate: float,
    publishers: int,
    timeout: float,
    nsqd_http_addresses: Sequence[str] = (),
    channels: Sequence[str] = (),
    first_number: int = 0,
) -> None:
    """``publishers`` tasks, each with its own Producer that prefers "its" nsqd and fails over
    to the others, publish numbered messages until SIGTERM. The total rate is ``rate``/s."""
    stop = _stop_event()
    await create_channels(nsqd_http_addresses, channels)
    counter = iter(range(first_number, 1 << 62))
    interval = publishers / rate

    async def publisher(index: int) -> None:
        order = nsqd_addresses[index:] + nsqd_addresses[:index]
        async with Producer(
            order,
            reconnect_interval=0.5,
            max_reconnect_interval=2.0,
            request_timeout=1.0,  # a paused nsqd must not hold the publishers up
            **FAST_FAILURE_DETECTION,
        ) as prod:
            next_at = time.monotonic()
            while not stop.is_set():
                number = next(counter)
                history.record("invoke", n=number)
                try:
                    await asyncio.wait_for(
                        prod.publish(TOPIC, str(number).encode()), timeout=timeout
                    )
                except (NSQError, OSError, TimeoutError) as exc:
                    history.record("pub", n=number, outcome=classify(exc), error=repr(exc))
                else:
                    history.record("pub", n=number, outcome="ok")
                next_at = max(next_at + interval, time.monotonic() - interval)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))

    await asyncio.gather(*(publisher(i) for i in range(publishers)))


async def create_channels(nsqd_http_addresses: Sequence[str], channels: Sequence[str]) -> None:
    """Create the topic's channels on every nsqd before the first publish, so a channel whose
    reader starts late (the Spark job) still gets every message."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for address in nsqd_http_addresses:
            calls = [("topic/create", {"topic": TOPIC})]
            calls += [("channel/create", {"topic": TOPIC, "channel": c}) for c in channels]
            for path, params in calls:
                async with session.post(f"http://{address}/{path}", params=params) as response:
                    response.raise_for_status()


async def run_consumer(
    lookupd_http_addresses: list[str], history: History, *, poll_interval: float
) -> None:
    """One consumer on the checker channel, finding nsqd through every lookupd, until
    SIGTERM. Each delivery is recorded before it is FINished."""
    stop = _stop_event()

    def handle(message: Message) -> None:
        body = message.body.decode(errors="replace")
        history.record(
            "recv",
            n=int(body) if body.isdigit() else None,
            body=None if body.isdigit() else body,
            nsqd=message.nsqd_address,
            attempts=message.attempts,
            id=message.id.decode(),
        )

    consumer = Consumer(
        TOPIC,
        CHANNEL,
        handle,
        lookupd_http_addresses=lookupd_http_addresses,
        lookupd_poll_interval=poll_interval,
        lookupd_poll_jitter=0.1,
        lookupd_poll_timeout=2.0,
        max_in_flight=100,
        reconnect_interval=0.5,
        max_reconnect_interval=2.0,
        max_attempts=0,
        **FAST_FAILURE_DETECTION,
    )
    await consumer.start()
    history.record("consumer-started")
    await stop.wait()
    await consumer.close(timeout=5.0)
