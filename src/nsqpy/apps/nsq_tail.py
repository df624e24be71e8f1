"""``nsq_tail``: print the messages of one or more topics to stdout (Go: apps/nsq_tail).

Each body is written followed by ``\\n`` (with ``--print-topic``, prefixed ``<topic> | ``). The
channel defaults to a random ephemeral one, ``tail<6 digits>#ephemeral``, so tailing takes
nothing from real consumers. ``--n`` exits after that many messages of one topic (Go counts per
topic) and lowers ``--max-in-flight`` to it.

On purpose unlike Go: the n-th message is FINished before exiting (Go exits inside the
handler, leaving it to time out), and messages that arrive after it are REQueued at once.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from ..client import Consumer, Message
from ..internal.flags import BOOL, INT, STR, STR_LIST, option
from .common import (
    ConsumerFlags,
    FatalError,
    client_config,
    first_of,
    go_log,
    make_consumer,
    run_app,
    start_consumer,
    stop_event,
)

PROGRAM = "nsq_tail"


@dataclass
class Options(ConsumerFlags):
    version: bool = option("version", False, BOOL, "print version string")
    topic: list[str] = option("topic", [], STR_LIST, "NSQ topic (may be given multiple times)")
    channel: str = option("channel", "", STR, "NSQ channel")
    n: int = option("n", 0, INT, "total messages to show (will wait if starved)")
    print_topic: bool = option(
        "print-topic", False, BOOL, "print topic name where message was received"
    )


def random_channel(rng: random.Random | None = None) -> str:
    """Go's ``fmt.Sprintf("tail%06d#ephemeral", rand.Int()%999999)``."""
    number = (rng or random.Random()).randrange(999999)
    return f"tail{number:06d}#ephemeral"


class StdoutWriter:
    """Bodies go out in one write per event-loop turn (Go writes unbuffered, per message)."""

    def __init__(self, stream: BinaryIO, loop: asyncio.AbstractEventLoop) -> None:
        self.stream = stream
        self.loop = loop
        self.pending: list[bytes] = []
        self.scheduled = False
        self.broken = asyncio.Event()

    def write(self, *parts: bytes) -> None:
        self.pending.extend(parts)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        if not self.pending or self.broken.is_set():
            self.pending.clear()
            return
        data = b"".join(self.pending)
        self.pending.clear()
        try:
            self.stream.write(data)
            self.stream.flush()
        except BrokenPipeError:  # the reader went away (`nsq_tail ... | head`): stop quietly
            self.broken.set()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)


class TailHandler:
    """Prints one topic's messages; counts them as Go does, per topic."""

    def __init__(
        self, topic: str, total: int, print_topic: bool, out: StdoutWriter, done: asyncio.Event
    ) -> None:
        self.prefix = f"{topic} | ".encode() if print_topic else b""
        self.total = total
        self.shown = 0
        self.out = out
        self.done = done

    def __call__(self, message: Message) -> bool:
        if self.done.is_set():
            message.requeue(0, backoff=False)  # not shown: leave it for the next reader
            return True
        self.shown += 1
        if self.prefix:
            self.out.write(self.prefix, message.body, b"\n")
        else:
            self.out.write(message.body, b"\n")
        if self.total > 0 and self.shown >= self.total:
            self.done.set()
        return True


async def tail(opts: Options) -> int:
    channel = opts.channel or random_channel()
    opts.check_sources()
    if not opts.topic:
        raise FatalError("--topic required")
    if 0 < opts.n < opts.max_in_flight:  # don't ask for more messages than we want
        opts.max_in_flight = opts.n
    config = client_config(opts.consumer_opt)
    loop = asyncio.get_running_loop()
    out = StdoutWriter(sys.stdout.buffer, loop)
    done = asyncio.Event()
    stop = stop_event()
    consumers: list[Consumer] = []
    try:
        for topic in opts.topic:
            go_log(f"Adding consumer for topic: {topic}")
            handler = TailHandler(topic, opts.n, opts.print_topic, out, done)
            consumer = make_consumer(PROGRAM, topic, channel, handler, opts, config)
            consumers.append(consumer)
            await start_consumer(consumer)
        await first_of(stop.wait(), done.wait(), out.broken.wait())
    finally:
        await asyncio.gather(*(c.close(timeout=5.0) for c in consumers))
        out.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_app(PROGRAM, Options, argv, tail)


if __name__ == "__main__":
    sys.exit(main())
