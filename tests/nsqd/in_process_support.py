"""Topic and Channel tested in this process: an NSQD built from its options (no listener, no
background loop), a clock the test moves by hand, and a consumer that records what its
channel sent it.

Nothing here is mocked of nsqd itself: the topics, channels and disk queues are the real ones,
in a temporary data path. Only the two things a channel talks to from outside are stand-ins:
the clock (NSQD's ``clock`` and ``wall_clock_ns``) and the consumer (the ``Consumer``
protocol, which a TCP connection satisfies in production). Timeouts and deferrals run when a
test calls ``nsqd.scan_queues()``, as nsqd's queue-scan loop does each tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from nsqpy.internal import lg
from nsqpy.nsqd.channel import Channel
from nsqpy.nsqd.client_v2 import ClientV2
from nsqpy.nsqd.message import Message
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options
from nsqpy.protocol import FRAME_TYPE_MESSAGE, CommandParser, FrameDecoder
from nsqpy.protocol.message import DecodedMessage, decode_message

#: What a loop turn may need to move a publish through the topic's pump to its channels.
LOOP_TURNS = 20


class FakeClock:
    """NSQD's two clocks, frozen until :meth:`advance`."""

    def __init__(self) -> None:
        self.monotonic = 1000.0
        self.wall = 1_700_000_000 * 10**9

    def now(self) -> float:
        return self.monotonic

    def wall_ns(self) -> int:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.monotonic += seconds
        self.wall += round(seconds * 1e9)


class FakeConsumer:
    """A :class:`~nsqpy.nsqd.consumer.Consumer` that keeps every message it was sent, decoded
    from the frames the channel handed it, and plays the consumer's part of RDY, FIN and REQ
    as a V2 connection does (its counts, then a pump of its channel)."""

    def __init__(self, consumer_id: int, msg_timeout: float = 60.0) -> None:
        self.id = consumer_id
        self.client_id = f"fake-{consumer_id}"
        self.ready_count = 0
        self.in_flight_count = 0
        self.sample_rate = 0
        self.msg_timeout = msg_timeout
        self.received: list[DecodedMessage] = []
        self.wire = bytearray()  # every frame sent, as it would go out
        self.batches = 0  # after_deliveries calls
        self.timed_out = 0
        self.emptied = 0
        self.closed = False
        self.channel: Channel | None = None

    # ------------------------------------------------------------------ the Consumer protocol

    def send_message(self, msg: Message) -> None:
        self.in_flight_count += 1
        self._record(msg.frame(), 1)

    def send_messages(self, frames: list[bytes], count: int, size: int) -> None:
        data = b"".join(frames)
        assert len(data) == size, "size counts the whole frames"
        self.in_flight_count += count
        self._record(data, count)

    def after_deliveries(self) -> None:
        self.batches += 1

    def timed_out_message(self) -> None:
        self.timed_out += 1
        self.in_flight_count -= 1
        self._pump()

    def empty_in_flight(self) -> None:
        self.emptied += 1
        self.in_flight_count = 0

    def close(self) -> None:
        self.closed = True

    def stats(self, topic_filter: str = "") -> dict[str, Any]:
        return {"client_id": self.client_id, "in_flight_count": self.in_flight_count}

    # ------------------------------------------------------------------ the consumer's commands

    def subscribe(self, channel: Channel) -> None:
        channel.add_client(self)
        self.channel = channel

    def rdy(self, count: int) -> None:
        self.ready_count = count
        self._pump()

    def fin(self, msg_id: bytes) -> None:
        assert self.channel is not None
        self.channel.finish_message(self, msg_id)
        self.in_flight_count -= 1
        self._pump()

    def req(self, msg_id: bytes, delay: float) -> None:
        assert self.channel is not None
        self.channel.requeue_message(self, msg_id, delay)
        self.in_flight_count -= 1
        self._pump()

    def bodies(self) -> list[bytes]:
        return [msg.body for msg in self.received]

    def _pump(self) -> None:
        if self.channel is not None:
            self.channel.pump(self)

    def _record(self, data: bytes, count: int) -> None:
        self.wire += data
        frames = FrameDecoder().feed(data)
        assert len(frames) == count, "every frame complete, one per message"
        for frame in frames:
            assert frame.frame_type == FRAME_TYPE_MESSAGE
            self.received.append(decode_message(frame.data))


@contextlib.asynccontextmanager
async def in_process_nsqd(data_path: Path, clock: FakeClock, **options: Any) -> AsyncIterator[NSQD]:
    """An NSQD on this event loop reading ``clock``; stopped (its queues closed) afterwards."""
    opts = Options(data_path=str(data_path), **options)
    logger = lg.Logger("[nsqd] ", lg.INFO, stream=io.StringIO())
    nsqd = NSQD(opts, logger, clock=clock.now, wall_clock_ns=clock.wall_ns)
    nsqd.loop = asyncio.get_running_loop()
    try:
        yield nsqd
    finally:
        await nsqd.stop()


async def loop_turns(turns: int = LOOP_TURNS) -> None:
    """Let the event loop run what was scheduled (the topic's pump, an ephemeral deletion)."""
    for _ in range(turns):
        await asyncio.sleep(0)


class RecordingTransport:
    """The few members of ``asyncio.Transport`` a ClientV2 uses, keeping every byte written.

    Closing is as with a socket: the protocol hears ``connection_lost`` on a later loop turn.
    """

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True
        self.protocol: asyncio.Protocol | None = None

    def write(self, data: bytes) -> None:
        assert not self.closed, "nothing is written after close"
        self.written += data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.protocol is not None:
                asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default


def connect_client(
    nsqd: NSQD, client_id: int, fin_runs: bool = True
) -> tuple[ClientV2, RecordingTransport]:
    """A V2 client of nsqd's own (ClientV2) whose connection is on a
    :class:`RecordingTransport`: the test sends it bytes with ``client.connection.data_received``.
    With ``fin_runs=False`` its parser hands every FIN line to the FIN handler on its own, as a
    parser without the FIN-run fast path would."""
    client = ClientV2(nsqd, client_id)
    connection = client.connection
    if not fin_runs:
        opts = nsqd.options
        connection.parser = CommandParser(opts.max_msg_size, opts.max_body_size, fin_runs=False)
    transport = RecordingTransport()
    transport.protocol = connection
    connection.connection_made(transport)  # type: ignore[arg-type]
    return client, transport
