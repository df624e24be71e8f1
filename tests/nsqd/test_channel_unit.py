"""Channel in process (as Go's nsqd/channel_test.go): delivery to ready consumers, in-flight
timeouts, deferral, FIN errors, emptying and pausing, with a clock the test moves and a
consumer that records what it was sent."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from nsqpy.nsqd.channel import Channel, ChannelError
from nsqpy.nsqd.message import Message
from nsqpy.nsqd.nsqd import NSQD

from .in_process_support import FakeClock, FakeConsumer, in_process_nsqd, loop_turns

MSG_TIMEOUT = 30.0


@pytest.fixture
def nsqd_options() -> dict[str, Any]:
    return {"msg_timeout": MSG_TIMEOUT}


@pytest.fixture
def channel(nsqd: NSQD) -> Channel:
    return nsqd.get_topic("orders").get_channel("billing")


@pytest.fixture
def consumer(channel: Channel) -> FakeConsumer:
    fake = FakeConsumer(1, msg_timeout=MSG_TIMEOUT)
    fake.subscribe(channel)
    return fake


async def publish(channel: Channel, *bodies: bytes) -> list[Message]:
    """Publish to the channel's topic and let its pump copy the messages to the channel."""
    topic = channel.nsqd.get_topic(channel.topic.name)
    msgs = [topic.new_message(body) for body in bodies]
    for msg in msgs:
        topic.put_message(msg)
    await loop_turns()
    return msgs


async def test_a_message_goes_to_a_ready_consumer_with_its_first_attempt(
    channel: Channel, consumer: FakeConsumer, clock: FakeClock
) -> None:
    consumer.rdy(1)
    (msg,) = await publish(channel, b"hello")
    assert [(m.id, m.body, m.attempts, m.timestamp) for m in consumer.received] == [
        (msg.id, b"hello", 1, clock.wall)
    ]
    assert consumer.in_flight_count == 1
    assert list(channel.in_flight) == [msg.id]
    assert channel.message_count == 1
    consumer.fin(msg.id)
    assert channel.in_flight == {}
    assert consumer.in_flight_count == 0
    assert channel.depth() == 0


async def test_queued_messages_go_out_in_order_when_rdy_rises(
    channel: Channel, consumer: FakeConsumer
) -> None:
    await publish(channel, b"a", b"b", b"c")
    assert consumer.received == []
    assert channel.depth() == 3
    consumer.rdy(2)  # a window of two, packed by the channel in one pass
    assert consumer.bodies() == [b"a", b"b"]
    assert [m.attempts for m in consumer.received] == [1, 1]
    assert channel.depth() == 1
    consumer.fin(consumer.received[0].id)  # a FIN frees a slot: the next goes out
    assert consumer.bodies() == [b"a", b"b", b"c"]
    assert consumer.in_flight_count == 2
    assert channel.depth() == 0


async def test_no_message_goes_past_the_consumers_rdy(
    channel: Channel, consumer: FakeConsumer
) -> None:
    consumer.rdy(1)
    await publish(channel, b"a", b"b")
    assert consumer.bodies() == [b"a"]
    assert channel.depth() == 1


async def test_in_flight_timeout_requeues_with_attempts_raised(
    nsqd: NSQD, channel: Channel, consumer: FakeConsumer, clock: FakeClock
) -> None:
    consumer.rdy(1)
    (msg,) = await publish(channel, b"slow")
    clock.advance(MSG_TIMEOUT - 0.1)
    nsqd.scan_queues()
    assert channel.timeout_count == 0
    assert len(consumer.received) == 1
    clock.advance(0.2)
    nsqd.scan_queues()
    assert channel.timeout_count == 1
    assert consumer.timed_out == 1
    redelivered = consumer.received[1]
    assert (redelivered.id, redelivered.body, redelivered.attempts) == (msg.id, b"slow", 2)
    assert consumer.in_flight_count == 1
    assert channel.in_flight[msg.id].attempts == 2


async def test_a_timed_out_message_waits_in_the_queue_when_no_consumer_is_ready(
    nsqd: NSQD, channel: Channel, consumer: FakeConsumer, clock: FakeClock
) -> None:
    consumer.rdy(1)
    (msg,) = await publish(channel, b"slow")
    consumer.rdy(0)
    clock.advance(MSG_TIMEOUT)
    nsqd.scan_queues()
    assert channel.in_flight == {}
    assert consumer.in_flight_count == 0
    assert channel.depth() == 1
    consumer.rdy(1)
    assert [(m.id, m.attempts) for m in consumer.received] == [(msg.id, 1), (msg.id, 2)]


async def test_touch_restarts_the_timeout(
    nsqd: NSQD, channel: Channel, consumer: FakeConsumer, clock: FakeClock
) -> None:
    consumer.rdy(1)
    (msg,) = await publish(channel, b"long job")
    clock.advance(MSG_TIMEOUT - 1)
    channel.touch_message(consumer, msg.id, nsqd.now())
    clock.advance(MSG_TIMEOUT - 1)
    nsqd.scan_queues()
    assert channel.timeout_count == 0
    clock.advance(1.5)
    nsqd.scan_queues()
    assert channel.timeout_count == 1


async def test_req_with_a_delay_defers_until_the_clock_brings_it_back(
    nsqd: NSQD, channel: Channel, consumer: FakeConsumer, clock: FakeClock
) -> None:
    consumer.rdy(1)
    (msg,) = await publish(channel, b"retry me")
    consumer.req(msg.id, 5.0)
    assert list(channel.deferred) == [msg.id]
    assert channel.in_flight == {}
    assert channel.requeue_count == 1
    assert channel.depth() == 0
    clock.advance(4.9)
    nsqd.scan_queues()
    assert len(consumer.received) == 1
    clock.advance(0.2)
    nsqd.scan_queues()
    assert channel.deferred == {}
    assert [(m.id, m.attempts) for m in consumer.received] == [(msg.id, 1), (msg.id, 2)]


async def test_req_without_a_delay_redelivers_at_once(
    channel: Channel, consumer: FakeConsumer
) -> None:
    consumer.rdy(1)
    (msg,) = await publish(channel, b"again")
    consumer.req(msg.id, 0)
    assert [(m.id, m.attempts) for m in consumer.received] == [(msg.id, 1), (msg.id, 2)]
    assert channel.requeue_count == 1


async def test_an_mpubs_messages_in_flight_refer_to_their_run_until_requeued(
    nsqd: NSQD, channel: Channel, consumer: FakeConsumer, clock: FakeClock
) -> None:
    topic = nsqd.get_topic(channel.topic.name)
    run = topic.new_run([b"a", b"b", b"c"])
    topic.put_run(run)
    await loop_turns()
    consumer.rdy(3)
    assert consumer.bodies() == [b"a", b"b", b"c"]
    in_flight = list(channel.in_flight.values())
    assert [(m.id, m.body, m.attempts) for m in in_flight] == [
        (msg_id, body, 1) for msg_id, body in zip(run.ids, run.bodies, strict=True)
    ]
    for msg in in_flight:  # the cycle collector reads one run, not an ID and a body each
        assert run in gc.get_referents(msg)
        assert not [ref for ref in gc.get_referents(msg) if isinstance(ref, bytes)]
    first, second, _ = run.ids
    consumer.req(first, 5.0)  # deferred
    consumer.req(second, 0)  # requeued, and sent again at once
    assert channel.deferred[first].body == b"a"
    assert channel.in_flight[second].body == b"b"
    for msg in (channel.deferred[first], channel.in_flight[second]):
        assert run not in gc.get_referents(msg)  # none keeps the whole run in memory
    clock.advance(MSG_TIMEOUT + 1)
    nsqd.scan_queues()  # all three are sent again: a when due, b and c timed out
    assert sorted((m.body, m.attempts) for m in consumer.received[3:]) == [
        (b"a", 2),
        (b"b", 2),
        (b"b", 3),
        (b"c", 2),
    ]
    assert sorted(channel.in_flight) == sorted(run.ids)
    for msg in channel.in_flight.values():
        assert run not in gc.get_referents(msg)


async def test_fin_of_an_id_not_in_flight_fails(channel: Channel, consumer: FakeConsumer) -> None:
    consumer.rdy(1)
    await publish(channel, b"mine")
    with pytest.raises(ChannelError) as raised:
        channel.finish_message(consumer, b"0123456789abcdef")
    assert str(raised.value) == "ID not in flight"
    with pytest.raises(ChannelError) as raised:
        channel.requeue_message(consumer, b"0123456789abcdef", 0)
    assert str(raised.value) == "ID not in flight"


async def test_fin_of_another_consumers_message_fails_and_leaves_it_in_flight(
    channel: Channel, consumer: FakeConsumer
) -> None:
    other = FakeConsumer(2)
    other.subscribe(channel)
    consumer.rdy(1)
    (msg,) = await publish(channel, b"not yours")
    with pytest.raises(ChannelError) as raised:
        channel.finish_message(other, msg.id)
    assert str(raised.value) == "client does not own message"
    assert channel.finish_many(other, [msg.id]) == 0  # the FIN run stops at it, too
    assert list(channel.in_flight) == [msg.id]
    consumer.fin(msg.id)
    assert channel.in_flight == {}


async def test_empty_discards_queued_in_flight_and_deferred_messages(
    nsqd: NSQD, channel: Channel, consumer: FakeConsumer, clock: FakeClock
) -> None:
    consumer.rdy(2)
    first, second, _, _ = await publish(channel, b"1", b"2", b"3", b"4")
    consumer.req(first.id, 10.0)  # deferred; its slot takes the third
    assert (len(channel.deferred), len(channel.in_flight), channel.depth()) == (1, 2, 1)
    channel.empty()
    assert (len(channel.deferred), len(channel.in_flight), channel.depth()) == (0, 0, 0)
    assert consumer.emptied == 1
    assert consumer.in_flight_count == 0
    with pytest.raises(ChannelError, match=r"^ID not in flight$"):
        channel.finish_message(consumer, second.id)
    clock.advance(20)
    nsqd.scan_queues()
    assert consumer.bodies() == [b"1", b"2", b"3"]  # the deferred message is gone too
    await publish(channel, b"5")
    assert consumer.bodies() == [b"1", b"2", b"3", b"5"]


async def test_pause_holds_messages_and_unpause_delivers_them(
    channel: Channel, consumer: FakeConsumer
) -> None:
    consumer.rdy(10)
    channel.pause()
    await publish(channel, b"a", b"b")
    assert consumer.received == []
    assert channel.depth() == 2
    channel.unpause()
    assert consumer.bodies() == [b"a", b"b"]
    assert channel.depth() == 0


async def test_a_second_copy_of_a_message_in_flight_is_not_sent(
    channel: Channel, consumer: FakeConsumer, clock: FakeClock
) -> None:
    """A disk queue can hand back a record already delivered (read again after a crash): the
    copy in flight stands for it, whether it arrives alone or in a window."""
    msg_id = b"fedcba9876543210"
    consumer.rdy(1)
    channel.put_message(Message(msg_id, b"x", clock.wall))
    consumer.rdy(3)
    channel.put_message(Message(msg_id, b"x", clock.wall))
    assert len(consumer.received) == 1
    consumer.rdy(0)
    channel.put_message(Message(msg_id, b"x", clock.wall))
    channel.put_message(Message(b"0000000000000001", b"y", clock.wall))
    consumer.rdy(3)
    assert consumer.bodies() == [b"x", b"y"]
    assert consumer.in_flight_count == len(channel.in_flight) == 2


async def test_an_ephemeral_channel_goes_with_its_last_consumer(nsqd: NSQD) -> None:
    topic = nsqd.get_topic("orders")
    channel = topic.get_channel("audit#ephemeral")
    consumer = FakeConsumer(1)
    consumer.subscribe(channel)
    channel.remove_client(consumer)
    await loop_turns()
    assert topic.get_existing_channel("audit#ephemeral") is None


@pytest.mark.parametrize(
    "bodies",
    [[b"one"], [b"", b"b", b"c" * 300], [bytes([n]) * n for n in range(40)]],
    ids=["one", "empty-body", "forty"],
)
async def test_one_by_one_and_window_deliveries_agree(
    nsqd: NSQD, clock: FakeClock, bodies: list[bytes]
) -> None:
    """A message handed to a ready consumer on arrival (``Channel.deliver``) and one sent in a
    window when RDY rises (``start_in_flight_many``): the same frames, the same in-flight
    state."""
    one_by_one = nsqd.get_topic("arrivals").get_channel("c")
    window = nsqd.get_topic("windows").get_channel("c")
    first, second = FakeConsumer(1), FakeConsumer(2)
    first.subscribe(one_by_one)
    second.subscribe(window)
    first.rdy(len(bodies))
    first.batches = 0
    ids = [index.to_bytes(16, "big") for index in range(len(bodies))]
    for channel in (one_by_one, window):
        for msg_id, body in zip(ids, bodies, strict=True):
            channel.put_message(Message(msg_id, body, clock.wall))
    second.rdy(len(bodies))
    assert first.batches == len(bodies)
    assert second.batches == 1
    assert first.wire == second.wire
    assert first.in_flight_count == second.in_flight_count == len(bodies)

    def state(channel: Channel, consumer: FakeConsumer) -> list[tuple[object, ...]]:
        return [
            (m.id, m.attempts, m.delivery_ts, m.pri, m.client is consumer, m.group is not None)
            for m in channel.in_flight.values()
        ]

    assert state(one_by_one, first) == state(window, second)


async def test_a_sampled_out_message_is_let_go_in_held_mode(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --mem-queue-size=0 --sync-every=1 every message's disk record is held until the
    message is done with; a message a sampling consumer drops is done with, so its record is
    not kept (a kept one would pin the queue's committed position for good)."""
    monkeypatch.setattr("nsqpy.nsqd.channel.random.randrange", lambda _: 99)  # always out
    async with in_process_nsqd(tmp_path, clock, mem_queue_size=0, sync_every=1) as nsqd:
        channel = nsqd.get_topic("orders").get_channel("billing")
        assert channel.held is not None
        consumer = FakeConsumer(1)
        consumer.sample_rate = 50
        consumer.subscribe(channel)
        consumer.rdy(1)
        await publish(channel, b"dropped on arrival")
        consumer.rdy(0)
        await publish(channel, b"dropped from the queue")
        consumer.rdy(1)
        assert consumer.received == []
        assert channel.depth() == 0
        assert channel.held.queue.held()[0] == 0
