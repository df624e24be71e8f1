"""A replicated publish to a flowing topic names the topic's channels in its event at put time
(Replication.put), so the event leaves for the peers before the topic's pump has copied the
messages. Whatever would make the pump copy them otherwise (a channel created or deleted, the
topic paused, a queue emptied) first lets the pump copy them: on the owner as in the peers'
copies, those messages came before the change.

In process, with the real topics, channels and Replication (no peer linked): the stream's
events are read as they are emitted, before a loop turn flushes them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.replica.group import Replication
from nsqpy.nsqd.topic import Topic
from nsqpy.protocol.replica import (
    OP_CREATE,
    OP_PAUSE,
    ChannelOp,
    Event,
    Fanout,
    Puts,
    TopicOp,
    record_count,
)

from ..raw_v2 import free_port
from .in_process_support import loop_turns

BODIES = [b"first", b"second", b"third"]


@pytest.fixture
def replication(nsqd: NSQD) -> Iterator[Replication]:
    """The node's replication, its one peer never linked (nsqd.stop() stops it)."""
    replication = Replication(nsqd, [("127.0.0.1", free_port())], "127.0.0.1:4150")
    nsqd.replication = replication
    yield replication


@pytest.fixture
async def topic(nsqd: NSQD, replication: Replication) -> Topic:
    """Topic ``t`` with channel ``c1``, its creation's events flushed."""
    topic = nsqd.get_topic("t")
    topic.get_channel("c1")
    await loop_turns()
    return topic


class Emitted:
    """The events a replication emits from now on."""

    def __init__(self, replication: Replication) -> None:
        self.stream = replication.stream
        self.start = self.stream.last

    def events(self) -> list[Event]:
        return self.stream.since(self.start + 1)


def depth(topic: Topic, channel: str) -> int:
    return topic.channels[channel].depth()


def puts_naming(event: Event) -> tuple[str, ...] | None:
    assert isinstance(event, Puts), event
    assert record_count(event.records) == len(BODIES)
    return event.channels


async def test_a_publish_names_the_channels_its_pump_copies_it_to_next(
    topic: Topic, replication: Replication
) -> None:
    emitted = Emitted(replication)
    topic.put_batch(list(BODIES))
    [event] = emitted.events()
    assert puts_naming(event) == ("c1",)
    assert depth(topic, "c1") == 0  # not copied yet: the event did not wait for the pump
    assert replication.named_waiting("t")

    await loop_turns()
    assert depth(topic, "c1") == len(BODIES)
    assert not replication.named_waiting("t")
    assert emitted.events() == [event], "the pump's copy adds no Fanout"


async def test_publishes_behind_named_ones_are_named_too(
    topic: Topic, replication: Replication
) -> None:
    """A pipelining producer's publishes, several before the pump runs: each one is named,
    the queue holding only named messages, and the pump's copy of them all adds nothing."""
    emitted = Emitted(replication)
    for _ in range(5):
        topic.put_batch(list(BODIES))
    events = emitted.events()
    assert [puts_naming(event) for event in events] == [("c1",)] * 5
    await loop_turns()
    assert depth(topic, "c1") == 5 * len(BODIES)
    assert not replication.named_waiting("t")
    assert emitted.events() == events, "no Fanout"
    topic.put_batch(list(BODIES))  # the count is back to nothing waiting: named again
    assert puts_naming(emitted.events()[-1]) == ("c1",)


async def test_a_channel_created_before_the_pump_comes_after_the_named_messages(
    topic: Topic, replication: Replication
) -> None:
    emitted = Emitted(replication)
    topic.put_batch(list(BODIES))
    topic.get_channel("c2")
    put, created = emitted.events()
    assert puts_naming(put) == ("c1",)
    assert created == ChannelOp("t", "c2", OP_CREATE)
    assert (depth(topic, "c1"), depth(topic, "c2")) == (len(BODIES), 0)

    await loop_turns()
    assert (depth(topic, "c1"), depth(topic, "c2")) == (len(BODIES), 0)
    assert len(emitted.events()) == 2, "no Fanout: the peers named c1 alone, as the owner"


async def test_a_channel_deleted_before_the_pump_got_the_named_messages_first(
    topic: Topic, replication: Replication
) -> None:
    topic.get_channel("c2")
    await loop_turns()
    emitted = Emitted(replication)
    topic.put_batch(list(BODIES))
    topic.delete_existing_channel("c1")
    await loop_turns()
    assert depth(topic, "c2") == len(BODIES)
    put, deleted = emitted.events()
    assert puts_naming(put) == ("c1", "c2")
    assert isinstance(deleted, ChannelOp) and deleted.channel == "c1"


async def test_a_pause_before_the_pump_comes_after_the_named_messages(
    topic: Topic, replication: Replication
) -> None:
    emitted = Emitted(replication)
    topic.put_batch(list(BODIES))
    topic.pause()
    put, paused = emitted.events()
    assert puts_naming(put) == ("c1",)
    assert paused == TopicOp("t", OP_PAUSE)
    # in the channel, as the peers hold them: not held by the paused topic
    assert depth(topic, "c1") == len(BODIES)
    assert topic.depth() == 0


async def test_a_channel_emptied_before_the_pump_loses_the_named_messages_everywhere(
    topic: Topic, replication: Replication
) -> None:
    topic.put_batch(list(BODIES))
    topic.channels["c1"].empty()  # as /channel/empty, whose ChannelOp the peers apply
    await loop_turns()
    assert depth(topic, "c1") == 0, "the pump came first: nothing reaches c1 after its empty"
    assert not replication.named_waiting("t")


async def test_a_topic_emptied_before_the_pump_keeps_the_named_messages_in_its_channels(
    topic: Topic, replication: Replication
) -> None:
    topic.put_batch(list(BODIES))
    topic.empty()  # the peers hold them on c1, which a topic's empty leaves alone
    await loop_turns()
    assert depth(topic, "c1") == len(BODIES)


async def test_a_publish_behind_messages_not_named_waits_for_the_pump(
    topic: Topic, replication: Replication
) -> None:
    topic.pause()
    emitted = Emitted(replication)
    topic.put_batch(list(BODIES))  # paused: held by the topic
    topic.unpause()
    topic.put_batch(list(BODIES))  # behind them: its copies come with the next pump
    held, _, behind = emitted.events()
    assert puts_naming(held) is None
    assert puts_naming(behind) is None
    await loop_turns()
    assert depth(topic, "c1") == 2 * len(BODIES)
    # the pump named them in their events (not sent yet: no peer is linked), no Fanout
    held, _, behind = emitted.events()
    assert puts_naming(held) == puts_naming(behind) == ("c1",)


async def test_named_messages_copied_to_other_channels_are_put_again_naming_those(
    topic: Topic, replication: Replication
) -> None:
    """The safety net, should the channels ever change between a put and its pump without
    Topic.copy_named_puts: the peers get the messages again naming the channels they went
    to, and add the copies they lack (Replication's calls made here as a topic would)."""
    c2 = topic.get_channel("c2")
    await loop_turns()
    run = topic.new_run(list(BODIES))
    emitted = Emitted(replication)
    replication.put(topic, run)
    replication.fanout(topic, [topic.channels["c1"]], run)  # copied to c1 alone
    named, again = emitted.events()
    assert puts_naming(named) == ("c1", "c2")
    assert puts_naming(again) == ("c1",)
    replication.fanout(topic, [topic.channels["c1"], c2], run)  # not named (any more)
    assert isinstance(emitted.events()[-1], Fanout)
