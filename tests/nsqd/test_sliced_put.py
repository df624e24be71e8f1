"""``Topic.put_sliced`` in process: the one way a huge MPUB (TCP ``MPUB`` and HTTP ``/mpub``)
is put, a slice at a time with the event loop free between turns.

The turn's length is set to zero here, so every slice is a turn of its own and the test can
see what happens between them without depending on the machine's speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from nsqpy.nsqd import topic as topic_module
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.topic import Topic, TopicError

from .in_process_support import FakeClock, FakeConsumer, loop_turns


@pytest.fixture
def one_slice_per_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topic_module, "SLICED_PUT_TURN", 0.0)


def slices_of(count: int, size: int) -> Iterator[list[bytes]]:
    bodies = [b"%d" % i for i in range(count)]
    return (bodies[start : start + size] for start in range(0, count, size))


async def test_every_slice_is_put_in_order_with_one_timestamp_and_others_run_between(
    nsqd: NSQD, clock: FakeClock, one_slice_per_turn: None
) -> None:
    topic = nsqd.get_topic("big")
    consumer = FakeConsumer(1)
    consumer.subscribe(topic.get_channel("ch"))
    consumer.rdy(1000)
    seen: list[int] = []  # the topic's count each time another task got the loop
    reported: list[int] = []

    async def other_client() -> None:
        while True:
            seen.append(topic.message_count)
            clock.advance(1)  # a later publish time, were one taken per slice
            await asyncio.sleep(0)

    other = asyncio.create_task(other_client())
    await asyncio.sleep(0)
    published_at = clock.wall
    syncs = await topic.put_sliced(slices_of(10, 3), after_puts=reported.append)
    other.cancel()
    await loop_turns()
    assert syncs == ()
    assert reported == [3, 3, 3, 1]
    assert topic.message_count == 10
    assert {0, 3, 6, 9} <= set(seen), f"the loop was not free between slices: {seen}"
    assert consumer.bodies() == [b"%d" % i for i in range(10)]
    assert {msg.timestamp for msg in consumer.received} == {published_at}


async def test_a_refusal_before_a_slice_keeps_the_slices_before_it(
    nsqd: NSQD, one_slice_per_turn: None
) -> None:
    topic = nsqd.get_topic("refused")
    reported: list[int] = []
    checks = 0

    def refuse_the_third() -> None:
        nonlocal checks
        checks += 1
        if checks == 3:
            raise RuntimeError("draining")

    with pytest.raises(RuntimeError, match="draining"):
        await topic.put_sliced(slices_of(10, 4), refuse_the_third, reported.append)
    assert reported == [4, 4]
    assert topic.message_count == topic.depth() == 8


async def test_a_topic_that_exits_between_turns_fails_the_rest(
    nsqd: NSQD, one_slice_per_turn: None
) -> None:
    topic = nsqd.get_topic("exiting")
    reported: list[int] = []

    async def delete_after_first_slice(topic: Topic) -> None:
        while topic.message_count == 0:
            await asyncio.sleep(0)
        nsqd.delete_existing_topic(topic.name)

    deleter = asyncio.create_task(delete_after_first_slice(topic))
    with pytest.raises(TopicError, match="exiting"):
        await topic.put_sliced(slices_of(10, 5), after_puts=reported.append)
    await deleter
    assert reported == [5]
    assert topic.message_count == 5


async def test_a_slice_that_fills_the_turn_still_ends_it(nsqd: NSQD) -> None:
    """With the real turn length: the turn ends after the slice that used it up, and the
    next turn begins with the slice after it (none lost or put twice)."""
    topic = nsqd.get_topic("real_turns")
    reported: list[int] = []
    await topic.put_sliced(slices_of(20_000, 1000), after_puts=reported.append)
    assert sum(reported) == topic.message_count == 20_000
    assert all(count % 1000 == 0 for count in reported)
