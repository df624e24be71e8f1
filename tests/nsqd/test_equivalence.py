"""nsqd's hot paths against their plain twins, in process, over generated inputs:

- a stream of FIN lines parsed into FIN runs (``CommandParser(fin_runs=True)``, handled by
  ``ProtocolV2.FIN_RUN``) and parsed line by line (each to ``ProtocolV2.FIN``): the same bytes
  to the client, the same channel state and the same client counters;
- ``Channel.finish_many`` (a run of IDs in one pass) and ``Channel.finish_message`` (one ID):
  the same failures at the same IDs and the same state after, held mode included;
- a window of messages sent when RDY rises (``Channel.start_in_flight_many``) and messages
  handed over one by one as they arrive (``Channel.deliver``); so are MPUBs' runs queued
  unbuilt, each message built straight into flight (``Channel.start_runs_in_flight``);
- a Message built by ``Message.__init__``, :meth:`Message.copy`, :func:`own_copies`,
  :func:`message_from_bytes`, :func:`decode_records` and :func:`frame_runs_in_flight`: equal
  in every slot;
- a fan-out batch framed for the disk queues at once (``framed_records``, ``framed_run``) and
  each message encoded and size-prefixed on its own;
- an MPUB's messages queued unbuilt (``Topic.put_run``, a MessageRun) and as messages
  (``Topic.put_messages``): the same messages reach every channel, in memory and on disk, in
  the same order, with the same counters, whatever the queues' sizes and the consumers.

Each twin runs on its own NSQD (same options, same fake clock readings, the same message IDs
put in the same order), so anything one path does that the other does not shows up as a
difference in what is compared.
"""

from __future__ import annotations

import asyncio
import os
import struct
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.nsqd import NSQD
from nsqpy.nsqd.backend_writes import framed_records, framed_run
from nsqpy.nsqd.channel import Channel, ChannelError
from nsqpy.nsqd.client_v2 import ClientV2
from nsqpy.nsqd.message import (
    Message,
    MessageRun,
    decode_records,
    frame_runs_in_flight,
    message_from_bytes,
    own_copies,
)
from nsqpy.protocol import commands

from .in_process_support import (
    FakeClock,
    FakeConsumer,
    RecordingTransport,
    connect_client,
    in_process_nsqd,
    loop_turns,
)

MSG_TIMEOUT = 30.0
#: Messages put in flight to the client under test (or queued for it), then to another one.
OWN = 10
OTHERS = 3
#: IDs from here on were never published.
UNKNOWN = OWN + OTHERS

#: The queues' files: in memory where the machine has a tmpfs (an fsync there is free).
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None

cuts = st.lists(st.integers(min_value=0, max_value=10**6), max_size=12)


def msg_id(index: int) -> bytes:
    return b"%016x" % index


def chunked(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(data) + 1) for p in points})
    out, prev = [], 0
    for mark in [*marks, len(data)]:
        out.append(data[prev:mark])
        prev = mark
    return out


def run_twice(scenario: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    """The scenario's observation on the fast path, then on the plain one, each on a fresh
    NSQD in a fresh directory."""
    results = []
    for fast in (True, False):
        with tempfile.TemporaryDirectory(dir=SCRATCH) as data_path:
            results.append(asyncio.run(scenario(Path(data_path), fast, *args)))
    return results[0], results[1]


def in_flight_state(channel: Channel) -> list[tuple[object, ...]]:
    """Each in-flight message's delivery state, by ID (the order of ``in_flight`` is how it
    is stored, not what it does; what it does is checked by timing messages out)."""
    return sorted(
        (
            msg.id,
            msg.attempts,
            None if msg.client is None else msg.client.client_id,
            msg.pri,
            msg.delivery_ts,
            msg.group is None,
        )
        for msg in channel.in_flight.values()
    )


def channel_counters(channel: Channel) -> tuple[int, ...]:
    return (
        channel.message_count,
        channel.requeue_count,
        channel.timeout_count,
        channel.depth(),
        len(channel.deferred),
    )


def queued_ids(channel: Channel) -> list[bytes]:
    return [msg.id for msg in channel.memory_queue]


# --------------------------------------------------------------------------- FIN and FIN runs


#: The client's own IDs (delivered, queued or finished already) and IDs never published.
own_or_unknown = st.one_of(
    st.integers(min_value=0, max_value=OWN - 1),
    st.integers(min_value=UNKNOWN, max_value=UNKNOWN + 2),
)
#: The IDs of messages in flight to the other client.
others = st.integers(min_value=OWN, max_value=UNKNOWN - 1)


def _fin_stream_ops(any_id: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    fins = st.builds(commands.fin, any_id)
    rare = st.one_of(
        st.builds(lambda i: b"FIN " + i + b"\r\n", any_id),
        st.builds(commands.rdy, st.integers(min_value=0, max_value=6)),
        st.builds(commands.req, any_id, st.sampled_from([0, 2000])),
        st.builds(commands.touch, any_id),
        st.just(commands.nop()),
    )
    fatal = st.sampled_from(
        [b"FIN\n", b"FIN abc\n", b"FIN " + msg_id(1) + b" x\n", b"FIN " + b"0" * 17 + b"\n"]
    )
    return st.one_of(fins, fins, fins, fins, fins, fins, rare, rare, fatal)


fin_streams = st.lists(_fin_stream_ops(own_or_unknown.map(msg_id)), min_size=1, max_size=40)
fin_streams_with_others = st.lists(
    _fin_stream_ops(st.one_of(own_or_unknown, others).map(msg_id)), min_size=1, max_size=40
)


def client_counters(client: ClientV2, transport: RecordingTransport) -> tuple[object, ...]:
    return (
        client.finish_count,
        client.requeue_count,
        client.message_count,
        client.in_flight_count,
        client.ready_count,
        client.state,
        client.closed,
        transport.closed,
    )


async def _fin_scenario(
    data_path: Path, fast: bool, rdy: int, ops: list[bytes], points: list[int]
) -> dict[str, object]:
    clock = FakeClock()
    async with in_process_nsqd(data_path, clock, msg_timeout=MSG_TIMEOUT) as nsqd:
        channel = nsqd.get_topic("t").get_channel("c")
        other = FakeConsumer(99, msg_timeout=MSG_TIMEOUT)
        other.subscribe(channel)
        other.rdy(OTHERS)
        for index in range(OWN, OWN + OTHERS):
            channel.put_message(Message(msg_id(index), b"other", clock.wall))
        client, transport = connect_client(nsqd, 1, fin_runs=fast)
        client.connection.data_received(b"  V2" + commands.sub("t", "c") + commands.rdy(rdy))
        await loop_turns()
        for index in range(OWN):
            clock.advance(0.001)  # distinct deadlines: their order is observable
            channel.put_message(Message(msg_id(index), b"m%d" % index, clock.wall))
        await loop_turns()
        for chunk in chunked(b"".join(ops), points):
            client.connection.data_received(chunk)
            await loop_turns(3)
        await loop_turns()
        seen: dict[str, object] = {}
        if not client.closed:
            client.connection.flush()  # what the output-buffer timer would send
        seen["before timeouts"] = (
            bytes(transport.written),
            client_counters(client, transport),
            in_flight_state(channel),
            queued_ids(channel),
            channel_counters(channel),
        )
        # every message still in flight times out: in the order of their deadlines
        clock.advance(MSG_TIMEOUT + 5)
        nsqd.scan_queues()
        await loop_turns()
        if not client.closed:
            client.connection.flush()
        seen["after timeouts"] = (
            bytes(transport.written),
            client_counters(client, transport),
            queued_ids(channel),
            [m.id for m in other.received],
            channel_counters(channel),
        )
        if not transport.closed:
            client.connection.connection_lost(None)
        await loop_turns()
    return seen


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(min_value=1, max_value=OWN), fin_streams, cuts)
def test_fin_runs_and_single_fins_send_the_same_and_leave_the_same_state(
    rdy: int, ops: list[bytes], points: list[int]
) -> None:
    """IDs in flight to the client, finished already, in flight to another client and never
    published, lines ending in \\r\\n, malformed lines (fatal), RDY, REQ, TOUCH and NOP
    between them, the stream split anywhere."""
    fast, plain = run_twice(_fin_scenario, rdy, ops, points)
    assert fast == plain


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(min_value=1, max_value=OWN), fin_streams_with_others, cuts)
def test_fin_runs_and_single_fins_agree_on_another_clients_ids(
    rdy: int, ops: list[bytes], points: list[int]
) -> None:
    fast, plain = run_twice(_fin_scenario, rdy, ops, points)
    assert fast == plain


# --------------------------------------------------------------------------- finish_many


async def _finish_scenario(
    data_path: Path, fast: bool, options: dict[str, Any], owner_timeout: float, picks: list[int]
) -> dict[str, object]:
    clock = FakeClock()
    async with in_process_nsqd(data_path, clock, msg_timeout=MSG_TIMEOUT, **options) as nsqd:
        topic = nsqd.get_topic("t")
        channel = topic.get_channel("c")
        owner = FakeConsumer(1, msg_timeout=owner_timeout)
        other = FakeConsumer(2, msg_timeout=MSG_TIMEOUT)
        owner.subscribe(channel)
        other.subscribe(channel)
        owner.rdy(OWN)
        other.rdy(0)
        for index in range(OWN + OTHERS):
            if index == OWN:
                owner.rdy(0)
                other.rdy(OTHERS)
            clock.advance(0.001)
            topic.put_message(Message(msg_id(index), b"m%d" % index, clock.wall))
            await loop_turns(3)
        # a TOUCH past --max-msg-timeout puts a message on the capped heap
        clock.advance(1.0)
        for index in (1, 4):
            channel.touch_message(owner, msg_id(index), nsqd.now())
        ids = [msg_id(pick) for pick in picks]
        failed: list[tuple[int, str]] = []
        finished_before = owner.in_flight_count
        if fast:
            start = 0
            while start < len(ids):
                stop = channel.finish_many(owner, ids, start)
                owner.in_flight_count -= stop - start
                if stop == len(ids):
                    break
                try:
                    channel.finish_message(owner, ids[stop])
                    owner.in_flight_count -= 1
                except ChannelError as exc:
                    failed.append((stop, str(exc)))
                start = stop + 1
        else:
            for index, one in enumerate(ids):
                try:
                    channel.finish_message(owner, one)
                    owner.in_flight_count -= 1
                except ChannelError as exc:
                    failed.append((index, str(exc)))
        held = channel.held.queue if channel.held is not None else None
        seen: dict[str, object] = {
            "failed": failed,
            "finished": finished_before - owner.in_flight_count,
            "in flight": in_flight_state(channel),
            "counters": channel_counters(channel),
            "held": None if held is None else held.held(),
        }
        timed_out: list[list[bytes]] = []
        for _ in range(4):  # deadlines ranked: each scan's requeue order is compared
            clock.advance(MSG_TIMEOUT / 2)
            nsqd.scan_queues()
            timed_out.append(queued_ids(channel))
        seen["timed out"] = timed_out
        seen["held after"] = None if held is None else held.held()
        seen["counters after"] = channel_counters(channel)
    return seen


finish_picks = st.lists(
    st.one_of(st.integers(min_value=0, max_value=OWN - 1), own_or_unknown), max_size=2 * OWN
)
finish_picks_with_others = st.lists(st.one_of(own_or_unknown, others), max_size=2 * OWN)


@pytest.mark.parametrize(
    "options",
    [{}, {"mem_queue_size": 0}, {"mem_queue_size": 0, "sync_every": 1}],
    ids=["memory", "disk", "held"],
)
@settings(max_examples=40, deadline=None, derandomize=True)
@given(owner_timeout=st.sampled_from([MSG_TIMEOUT, 10.0]), picks=finish_picks)
def test_finish_many_and_finish_message_agree(
    options: dict[str, Any], owner_timeout: float, picks: list[int]
) -> None:
    """The client's own IDs (some twice, some moved to the capped heap by a TOUCH, some in a
    group of another timeout), another client's, unknown ones."""
    options = {**options, "max_msg_timeout": MSG_TIMEOUT + 0.5}
    fast, plain = run_twice(_finish_scenario, options, owner_timeout, picks)
    assert fast == plain


@settings(max_examples=25, deadline=None, derandomize=True)
@given(picks=finish_picks_with_others)
def test_finish_many_and_finish_message_agree_on_another_clients_ids(picks: list[int]) -> None:
    options = {"max_msg_timeout": MSG_TIMEOUT + 0.5}
    fast, plain = run_twice(_finish_scenario, options, MSG_TIMEOUT, picks)
    assert fast == plain


# --------------------------------------------------------------------------- window delivery


@asynccontextmanager
async def _subscribed(
    data_path: Path, consumer_timeout: float
) -> AsyncIterator[tuple[FakeClock, NSQD, Channel, FakeConsumer]]:
    """A fresh NSQD's channel with one consumer (RDY 0) of the given msg_timeout."""
    clock = FakeClock()
    async with in_process_nsqd(data_path, clock, msg_timeout=MSG_TIMEOUT) as nsqd:
        channel = nsqd.get_topic("t").get_channel("c")
        await loop_turns()  # the metadata write the new channel scheduled
        consumer = FakeConsumer(1, msg_timeout=consumer_timeout)
        consumer.subscribe(channel)
        yield clock, nsqd, channel, consumer


def _delivered(channel: Channel, consumer: FakeConsumer) -> dict[str, object]:
    """What the consumer was sent and the channel's in-flight state."""
    return {
        "wire": bytes(consumer.wire),
        "in flight": [
            (m.id, m.attempts, m.pri, m.delivery_ts, m.group is channel.in_flight)
            for m in channel.in_flight.values()
        ],
        "groups": sorted(
            (timeout, sorted(group)) for timeout, group in channel._in_flight_groups.items()
        ),
        "consumer": consumer.in_flight_count,
    }


def _timed_out(
    nsqd: NSQD, clock: FakeClock, channel: Channel, consumer: FakeConsumer, timeout: float
) -> dict[str, object]:
    """Every message in flight timed out: what was sent again, and the channel's counters."""
    clock.advance(max(timeout, MSG_TIMEOUT) + 1)
    nsqd.scan_queues()
    return {"redelivered": bytes(consumer.wire), "counters": channel_counters(channel)}


async def _delivery_scenario(
    data_path: Path,
    window: bool,
    bodies: list[bytes],
    attempts: list[int],
    duplicates: list[int],
    consumer_timeout: float,
    shared: bool,
) -> dict[str, object]:
    async with _subscribed(data_path, consumer_timeout) as (clock, nsqd, channel, consumer):
        msgs = [
            Message(msg_id(index), body, clock.wall, attempts[index % len(attempts)])
            for index, body in enumerate(bodies)
        ]
        msgs += [Message(msgs[i % len(msgs)].id, b"dup", clock.wall) for i in duplicates]
        for msg in msgs:
            msg.shared = shared
        if not window:
            consumer.rdy(len(msgs))
        for msg in msgs:
            channel.put_message(msg)
        if window:
            consumer.rdy(len(msgs))
        seen = _delivered(channel, consumer)
        seen["originals"] = [(m.attempts, m.client, m.group) for m in msgs] if shared else None
        seen |= _timed_out(nsqd, clock, channel, consumer, consumer_timeout)
    return seen


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    bodies=st.lists(st.binary(max_size=40), min_size=1, max_size=12),
    attempts=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=3),
    duplicates=st.lists(st.integers(min_value=0, max_value=20), max_size=3),
    consumer_timeout=st.sampled_from([MSG_TIMEOUT, 5.0]),
    shared=st.booleans(),
)
def test_a_window_and_one_by_one_deliveries_agree(
    bodies: list[bytes],
    attempts: list[int],
    duplicates: list[int],
    consumer_timeout: float,
    shared: bool,
) -> None:
    """Bodies of any size (empty too), attempts carried over, second copies of an ID in
    flight, a consumer timeout of its own (another in-flight group), messages shared with
    other channels: the same frames, the same in-flight state, the same timeouts.
    (``test_channel_unit.test_one_by_one_and_window_deliveries_agree`` checks the batching.)"""
    window, one_by_one = run_twice(
        _delivery_scenario, bodies, attempts, duplicates, consumer_timeout, shared
    )
    assert window == one_by_one


async def _run_delivery_scenario(
    data_path: Path,
    window: bool,
    bodies: list[bytes],
    duplicates: list[int],
    run_cuts: list[int],
    first_window: int,
    consumer_timeout: float,
) -> dict[str, object]:
    async with _subscribed(data_path, consumer_timeout) as (clock, nsqd, channel, consumer):
        ids = [msg_id(index) for index in range(len(bodies))]
        ids += [ids[i % len(ids)] for i in duplicates]
        bodies = bodies + [b"dup"] * len(duplicates)
        # one MPUB per stretch between cuts, each with a timestamp of its own
        marks = [0, *sorted({c % len(ids) for c in run_cuts}), len(ids)]
        stretches = [(start, stop) for start, stop in pairwise(marks) if stop > start]
        if window:
            # queued as runs while nobody is ready, then taken in two windows
            for start, stop in stretches:
                run = MessageRun(ids[start:stop], bodies[start:stop], clock.wall + start)
                channel.put_messages(run)
            consumer.rdy(first_window % (len(ids) + 1))
            consumer.rdy(len(ids))
        else:
            consumer.rdy(len(ids))
            for start, stop in stretches:
                for index in range(start, stop):
                    channel.put_message(Message(ids[index], bodies[index], clock.wall + start))
        seen = _delivered(channel, consumer)
        seen |= _timed_out(nsqd, clock, channel, consumer, consumer_timeout)
    return seen


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    bodies=st.lists(st.binary(max_size=40), min_size=1, max_size=12),
    duplicates=st.lists(st.integers(min_value=0, max_value=20), max_size=3),
    run_cuts=st.lists(st.integers(min_value=0, max_value=20), max_size=4),
    first_window=st.integers(min_value=0, max_value=20),
    consumer_timeout=st.sampled_from([MSG_TIMEOUT, 5.0]),
)
def test_queued_runs_taken_in_windows_and_one_by_one_deliveries_agree(
    bodies: list[bytes],
    duplicates: list[int],
    run_cuts: list[int],
    first_window: int,
    consumer_timeout: float,
) -> None:
    """MPUBs' runs queued unbuilt and put in flight as they are framed
    (``Channel.start_runs_in_flight``), a window ending inside a run, second copies of an ID
    in flight, a consumer timeout of its own: the same frames, in-flight state, groups and
    timeouts as each message handed over as it arrives."""
    windows, one_by_one = run_twice(
        _run_delivery_scenario,
        bodies,
        duplicates,
        run_cuts,
        first_window,
        consumer_timeout,
    )
    assert windows == one_by_one


# --------------------------------------------------------------------------- Message builders


def slots(msg: Message) -> dict[str, object]:
    """Every slot, by name: a builder that forgets one raises AttributeError here."""
    return {name: getattr(msg, name) for name in Message.__slots__}


def _record(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    return Message(msg_id, body, timestamp, attempts).encode()


@settings(max_examples=200, derandomize=True)
@given(
    msg_id=st.binary(min_size=16, max_size=16),
    body=st.binary(max_size=64),
    timestamp=st.integers(min_value=0, max_value=2**63 - 1),
    attempts=st.integers(min_value=0, max_value=2**16 - 1),
    deferred=st.sampled_from([0.0, 1.5]),
)
def test_every_message_builder_gives_the_same_message(
    msg_id: bytes, body: bytes, timestamp: int, attempts: int, deferred: float
) -> None:
    plain = Message(msg_id, body, timestamp, attempts)
    record = _record(timestamp, attempts, msg_id, body)
    decoded: list[Message] = []
    assert decode_records([record], decoded) == []
    for built in (message_from_bytes(record), decoded[0]):
        assert slots(built) == slots(plain)
        assert type(built.id) is bytes and type(built.body) is bytes

    # copies: the delivery state of the original is not carried over, the deferral is
    original = Message(msg_id, body, timestamp, attempts)
    original.deferred = deferred
    expected = slots(original)
    original.client = FakeConsumer(1)
    original.delivery_ts = original.pri = 12.5
    original.group = {}
    original.shared = True
    copied = original.copy()
    (owned,) = own_copies([original])
    assert owned is not original
    assert slots(copied) == slots(owned) == expected
    assert copied.body is owned.body is original.body  # the body is shared, not copied
    assert original.private() is not original and slots(original.private()) == expected
    original.shared = False
    assert own_copies([original]) == [original] and original.private() is original

    # a MessageRun builds a published message: attempts 0, no deferral
    (from_run,) = MessageRun([msg_id], [body], timestamp).messages()
    assert slots(from_run) == slots(Message(msg_id, body, timestamp))

    # ... and frames it straight into flight: that message, delivered once
    in_flight: dict[bytes, Message] = {}
    frames: list[bytes] = []
    owner = FakeConsumer(1)
    run = MessageRun([msg_id], [body], timestamp)
    counts = frame_runs_in_flight([run], in_flight, in_flight, owner, 2.0, 32.0, frames)
    delivered = Message(msg_id, body, timestamp, 1)
    delivered.client = owner
    delivered.delivery_ts = 2.0
    delivered.pri = 32.0
    delivered.group = in_flight
    assert counts == (1, len(body))
    assert slots(in_flight[msg_id]) == slots(delivered)
    assert b"".join(frames) == delivered.frame()


def test_a_record_too_short_is_an_error_in_both_decoders() -> None:
    short = _record(1, 1, b"i" * 16, b"")[:-1]
    decoded: list[Message] = []
    errors = decode_records([short], decoded)
    assert decoded == [] and errors == [
        f"not enough data to decode valid message ({len(short)} bytes)"
    ]
    with pytest.raises(Exception, match="not enough data"):
        message_from_bytes(short)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.binary(min_size=16, max_size=16),
            st.binary(min_size=1, max_size=300),
            st.integers(min_value=0, max_value=2**63 - 1),
            st.integers(min_value=0, max_value=2**16 - 1),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_a_fan_out_batch_is_framed_as_each_message_encoded_and_size_prefixed(
    fields: list[tuple[bytes, bytes, int, int]],
) -> None:
    """The framing a fan-out batch's overflow writes share (one header pack per message) is
    the disk queue's record framing of ``Message.encode``."""
    msgs = [Message(msg_id, body, ts, attempts) for msg_id, body, ts, attempts in fields]
    plain = b"".join(struct.pack(">I", len(m.encode())) + m.encode() for m in msgs)
    assert framed_records(msgs) == plain
    run = MessageRun([m.id for m in msgs], [m.body for m in msgs], fields[0][2])
    assert framed_run(run) == (
        framed_records(run.messages()),
        max(len(m.encode()) for m in msgs),
    )


# --------------------------------------------------------------------------- MPUB as a run

publishes = st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=8)


async def _publish_scenario(
    data_path: Path,
    as_run: bool,
    sizes: list[int],
    channels: int,
    mem_queue_size: int,
    ready: int,
) -> tuple[object, ...]:
    """MPUBs of ``sizes`` into a topic with ``channels`` channels (the first with a consumer
    of RDY ``ready``, if any): what each channel holds afterwards, in order, and the counts."""
    clock = FakeClock()
    options = {"mem_queue_size": mem_queue_size, "msg_timeout": MSG_TIMEOUT}
    async with in_process_nsqd(data_path, clock, **options) as nsqd:
        topic = nsqd.get_topic("t")
        names = [f"c{n}" for n in range(channels)]
        for name in names:
            topic.get_channel(name)
        consumer = FakeConsumer(1)
        if ready:
            consumer.subscribe(topic.channels[names[0]])
            consumer.rdy(ready)
        made = 0
        for size in sizes:
            ids = [msg_id(made + n) for n in range(size)]
            bodies = [b"body %d" % (made + n) for n in range(size)]
            made += size
            run = MessageRun(ids, bodies, clock.wall_ns())
            with nsqd.writes.batched_writes():
                if as_run:
                    topic.put_run(run)
                else:
                    topic.put_messages(run.messages())
            await loop_turns()
        for _ in range(2000):  # the pump may pause between turns when copies are dear
            if not topic.depth():
                break
            await asyncio.sleep(0.001)
        held = []
        for name in names:
            channel = topic.channels[name]
            counts = (channel.message_count, channel.depth())
            queued = [(m.id, m.body, m.timestamp, m.attempts) for m in channel._take(10**6)]
            held.append((name, counts, queued))
        sent = [(m.id, m.body, m.attempts) for m in consumer.received]
        topic_counts = (topic.message_count, topic.message_bytes, topic.depth())
        return topic_counts, sent, held


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    publishes,
    st.integers(min_value=1, max_value=3),
    st.sampled_from([1, 7, 50, 10000]),
    st.sampled_from([0, 5]),
)
def test_an_mpub_queued_as_a_run_and_as_messages_reaches_the_channels_alike(
    sizes: list[int], channels: int, mem_queue_size: int, ready: int
) -> None:
    as_run, as_messages = run_twice(_publish_scenario, sizes, channels, mem_queue_size, ready)
    assert as_run == as_messages
    (published, _, _), sent, held = as_run
    assert published == sum(sizes)
    # every channel has every message: queued (memory, then disk) or sent to its consumer
    for index, (_, _, queued) in enumerate(held):
        assert len(queued) + (len(sent) if index == 0 else 0) == published
