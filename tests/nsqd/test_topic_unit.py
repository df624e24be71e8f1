"""Topic in process (as Go's nsqd/topic_test.go): holding messages until a channel exists,
fan-out of a copy to each channel, pausing, deferred publishes and deletion, with a clock the
test moves and consumers that record what they were sent."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from nsqpy.nsqd.message import Message
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.topic import (
    PUMP_BUDGET,
    PUMP_DEFER_COST,
    PUMP_DEFER_COST_WITH_ROOM,
    PUMP_LONG_TURN,
    PUMP_MIN_BATCH,
    PUMP_MIN_SLICED,
    PUMP_QUIET,
    PUMP_WRITES_PER_MESSAGE,
    Topic,
)

from .in_process_support import FakeClock, FakeConsumer, loop_turns

#: --mem-queue-size=0 with --sync-every above 1: the topic's disk queue holds its reads
HELD = {"mem_queue_size": 0, "sync_every": 2}


@pytest.fixture
def topic(nsqd: NSQD) -> Topic:
    return nsqd.get_topic("orders")


async def publish(topic: Topic, *bodies: bytes) -> list[Message]:
    msgs = [topic.new_message(body) for body in bodies]
    for msg in msgs:
        topic.put_message(msg)
    await loop_turns()
    return msgs


def ready_consumer(topic: Topic, channel_name: str, consumer_id: int) -> FakeConsumer:
    consumer = FakeConsumer(consumer_id)
    consumer.subscribe(topic.get_channel(channel_name))
    consumer.rdy(100)
    return consumer


async def test_a_topic_without_channels_holds_messages_until_one_appears(topic: Topic) -> None:
    msgs = await publish(topic, b"a", b"b", b"c")
    assert topic.depth() == 3
    assert topic.message_count == 3
    channel = topic.get_channel("billing")
    await loop_turns()
    assert topic.depth() == 0
    assert channel.depth() == 3
    consumer = FakeConsumer(1)
    consumer.subscribe(channel)
    consumer.rdy(10)
    assert [m.id for m in consumer.received] == [m.id for m in msgs]
    assert consumer.bodies() == [b"a", b"b", b"c"]


async def test_each_channel_gets_its_own_copy(topic: Topic, clock: FakeClock) -> None:
    billing = ready_consumer(topic, "billing", 1)
    audit = ready_consumer(topic, "audit", 2)
    msgs = await publish(topic, b"a", b"b")
    for consumer in (billing, audit):
        assert [(m.id, m.body, m.attempts, m.timestamp) for m in consumer.received] == [
            (msg.id, msg.body, 1, clock.wall) for msg in msgs
        ]
    billing_channel = topic.channels["billing"]
    audit_channel = topic.channels["audit"]
    assert billing_channel.in_flight[msgs[0].id] is not audit_channel.in_flight[msgs[0].id]
    billing.req(msgs[0].id, 0)  # a retry on one channel is not seen by the other
    assert [m.attempts for m in billing.received] == [1, 1, 2]
    assert audit_channel.in_flight[msgs[0].id].attempts == 1
    audit.fin(msgs[0].id)
    assert msgs[0].id in billing_channel.in_flight


async def test_copies_queued_in_several_channels_are_delivered_independently(
    topic: Topic,
) -> None:
    billing_channel = topic.get_channel("billing")
    audit_channel = topic.get_channel("audit")
    (msg,) = await publish(topic, b"shared")
    assert billing_channel.depth() == audit_channel.depth() == 1
    billing = FakeConsumer(1)
    billing.subscribe(billing_channel)
    billing.rdy(1)
    billing.req(msg.id, 0)  # raises this channel's attempts only
    audit = FakeConsumer(2)
    audit.subscribe(audit_channel)
    audit.rdy(1)
    assert [m.attempts for m in billing.received] == [1, 2]
    assert [m.attempts for m in audit.received] == [1]


async def test_a_paused_topic_holds_messages_until_unpaused(topic: Topic) -> None:
    consumer = ready_consumer(topic, "billing", 1)
    topic.pause()
    await publish(topic, b"a", b"b")
    assert consumer.received == []
    assert topic.depth() == 2
    topic.unpause()
    await loop_turns()
    assert consumer.bodies() == [b"a", b"b"]
    assert topic.depth() == 0


async def test_a_deferred_publish_waits_in_each_channel_for_the_clock(
    nsqd: NSQD, topic: Topic, clock: FakeClock
) -> None:
    billing = ready_consumer(topic, "billing", 1)
    audit = ready_consumer(topic, "audit", 2)
    msg = topic.new_message(b"later")
    msg.deferred = 3.0
    topic.put_message(msg)
    await loop_turns()
    assert billing.received == audit.received == []
    assert all(msg.id in channel.deferred for channel in topic.channels.values())
    clock.advance(2.9)
    nsqd.scan_queues()
    assert billing.received == audit.received == []
    clock.advance(0.2)
    nsqd.scan_queues()
    assert [(m.id, m.attempts) for m in billing.received] == [(msg.id, 1)]
    assert [(m.id, m.attempts) for m in audit.received] == [(msg.id, 1)]


async def test_deleting_a_channel_closes_its_consumers_and_keeps_the_others(
    nsqd: NSQD, topic: Topic
) -> None:
    billing = ready_consumer(topic, "billing", 1)
    audit = ready_consumer(topic, "audit", 2)
    topic.delete_existing_channel("billing")
    assert billing.closed
    assert not audit.closed
    await publish(topic, b"after")
    assert billing.received == []
    assert audit.bodies() == [b"after"]


async def test_pump_now_runs_the_scheduled_pump_at_once(topic: Topic) -> None:
    """A publish waits in the topic for the pump's loop turn; pump_now (the replication
    flush's call) copies it to the channels without waiting for that turn, once."""
    channel = topic.get_channel("billing")
    await loop_turns()
    assert topic.pump_now() is False  # nothing scheduled
    topic.put_message(topic.new_message(b"a"))
    assert channel.depth() == 0 and topic.depth() == 1
    assert topic.pump_now() is True
    assert channel.depth() == 1 and topic.depth() == 0
    assert topic.pump_now() is False  # the scheduled turn was used, not repeated
    await loop_turns()
    assert channel.depth() == 1


@pytest.mark.parametrize("per_copy", [0.05e-6, 0.2e-6, 0.5e-6])
async def test_the_pump_yields_to_publishers_sooner_while_the_backlog_fits_in_memory(
    topic: Topic, per_copy: float
) -> None:
    """The pump works in slices (publishers first, the backlog grows) once a message's copies
    cost more than PUMP_DEFER_COST, or more than PUMP_DEFER_COST_WITH_ROOM while the topic's
    memory queue has room, where waiting costs no disk write."""
    channels = 10
    topic._copy_cost = per_copy
    per_message = per_copy * channels
    with_room = per_message > PUMP_DEFER_COST_WITH_ROOM
    assert topic._sliced(channels) is with_room
    room = topic.mem_capacity
    topic.memory_queue.extend([topic.new_message(b"x") for _ in range(room)])
    assert topic._sliced(channels) is (per_message > PUMP_DEFER_COST)  # full: keep up


@pytest.mark.parametrize(
    ("channels", "per_copy"), [(100, 0.1e-6), (100, 2e-6), (10, 20e-6), (400, 1e-6)]
)
async def test_a_sliced_pump_writes_each_full_channel_few_times_a_message(
    topic: Topic, channels: int, per_copy: float
) -> None:
    """However dear the copies, a slice moves PUMP_MIN_SLICED messages and one per
    PUMP_WRITES_PER_MESSAGE channels at least (a full channel writes a turn's messages in one
    write), and never more than PUMP_BUDGET copies allow."""
    topic._copy_cost = per_copy
    topic._published = True  # publishers are active: the pump slices
    assert topic._sliced(channels)
    batch = topic._pump_batch(channels)
    assert batch >= PUMP_MIN_SLICED
    assert channels / batch <= PUMP_WRITES_PER_MESSAGE
    assert batch <= max(PUMP_MIN_BATCH, PUMP_BUDGET // channels, channels)


@pytest.mark.parametrize(
    ("nsqd_options", "skip"),
    [({}, True), ({}, False), (HELD, True), (HELD, False)],
    ids=["disk-skips", "disk", "held-skips", "held"],
)
async def test_a_backlog_on_disk_reaches_the_channel_in_order_less_the_skipped_copies(
    topic: Topic, skip: bool
) -> None:
    """The pump reads the topic's disk queue a read buffer at a time: a backlog spanning
    several buffers arrives whole and in order, and the disk copy of a restored deferred
    message (its id in ``skip_ids``) is dropped once, wherever it falls in a batch. With
    --mem-queue-size=0 the topic's queue holds its records until the channels settle them:
    every record is released once the copies are in the channel."""
    assert (topic.held_copies is not None) == (topic.nsqd.options.mem_queue_size == 0)
    msgs = [topic.new_message(b"%04d" % i + b"." * 100) for i in range(1200)]  # ~160 KB
    for msg in msgs:
        topic.backend.put(msg.encode())
    skipped = {msgs[0].id, msgs[517].id, msgs[-1].id} if skip else set()
    topic.skip_ids.update(skipped)
    consumer = ready_consumer(topic, "billing", 1)
    consumer.rdy(len(msgs))
    await loop_turns(200)
    expected = [msg.body for msg in msgs if msg.id not in skipped]
    assert consumer.bodies() == expected
    assert topic.skip_ids == set()
    assert topic.depth() == 0
    if topic.held_copies is not None:
        assert not topic.held_copies.pending
        disk_queue = topic.backend.disk_queue()
        assert disk_queue is not None and disk_queue.held()[0] == 0


async def test_a_sliced_pump_moves_full_turns_once_publishers_have_gone_quiet(
    topic: Topic, clock: FakeClock
) -> None:
    """Slices measure dearer copies than full turns (each channel's write spread over few
    messages): once no publish has come for PUMP_QUIET seconds, the backlog a burst left is
    moved in full turns however dear the slices measured; a publish slices it again."""
    channels = 10
    full = max(PUMP_MIN_BATCH, PUMP_BUDGET // channels)
    for name in range(channels):
        topic.get_channel(f"c{name}")
    dear = PUMP_DEFER_COST / channels * 4
    topic._copy_cost = dear
    for _ in range(200):  # a burst, more than a slice
        topic.put_message(topic.new_message(b"burst"))
    topic._pump()  # a slice: the pump sees the publishes
    topic._copy_cost = dear  # as its slices measured it
    assert topic._sliced(channels)
    assert topic._pump_batch(channels) < full
    clock.advance(PUMP_QUIET * 0.9)
    assert topic._pump_batch(channels) < full
    clock.advance(PUMP_QUIET * 0.1)
    assert topic._pump_batch(channels) == full
    topic.put_message(topic.new_message(b"again"))
    assert topic._pump_batch(channels) < full


@pytest.mark.parametrize(
    ("turn", "stocked", "pauses"),
    [
        (PUMP_LONG_TURN * 2.5, True, True),
        (PUMP_LONG_TURN / 4, True, False),
        (PUMP_LONG_TURN * 2.5, False, False),
        (PUMP_LONG_TURN * 2.5, True, False),
    ],
    ids=["long-full", "short-full", "long-with-room", "long-full-publishing"],
)
async def test_a_quiet_pump_pauses_after_a_long_turn_into_full_channels(
    topic: Topic,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    turn: float,
    stocked: bool,
    pauses: bool,
) -> None:
    """Once publishers have gone quiet and while every channel's memory is full (its copies
    go to disk, its consumers have --mem-queue-size messages to read), a turn longer than
    PUMP_LONG_TURN is followed by a pause as long as itself, so the pump takes at most half
    the loop; a short turn, or one while a channel has room, is followed by the next one at
    once."""
    channel = topic.get_channel("billing")
    channel.mem_capacity = 5 if stocked else 10 * PUMP_BUDGET
    for _ in range(3 * PUMP_BUDGET):  # more than a turn
        topic.put_message(topic.new_message(b"x"))
    publishing = stocked and not pauses and turn > PUMP_LONG_TURN
    if not publishing:  # the publisher has gone quiet
        topic._published = False
        clock.advance(PUMP_QUIET)
    assert topic._pump_handle is not None
    topic._pump_handle.cancel()
    topic._pump_handle = None
    ticks = itertools.count()
    monkeypatch.setattr("nsqpy.nsqd.topic.time.perf_counter", lambda: next(ticks) * turn)
    depth = topic.depth()
    loop = asyncio.get_running_loop()
    before = loop.time()
    topic._pump()  # a turn that takes ``turn`` seconds
    after = loop.time()
    assert topic.depth() < depth
    handle = topic._pump_handle
    assert handle is not None
    assert (len(channel.memory_queue) >= channel.mem_capacity) is stocked
    if pauses:
        assert isinstance(handle, asyncio.TimerHandle)
        assert before + turn <= handle.when() <= after + turn
        assert topic.pump_now() is False  # a pause is not cut short
    else:
        assert not isinstance(handle, asyncio.TimerHandle)
