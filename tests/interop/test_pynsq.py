"""pynsq (the official Tornado client, ``import nsq``) publishing and consuming through nsqpy."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from typing import Any

from nsqpy.testing import DaemonProcess

from ..raw_v2 import unique, wait_for_async
from .conftest import NsqdFactory
from .helpers import channel_stats, only_client, topic_stats, wait_channel
from .pynsq_harness import PynsqClients, answer


@dataclass(frozen=True)
class Delivery:
    body: bytes
    attempts: int
    at: float  # time.monotonic() when the handler saw it


def delivery(message: Any) -> Delivery:
    return Delivery(message.body, message.attempts, time.monotonic())


async def test_writer_pub_mpub_dpub_all_reach_a_reader(
    nsqd: DaemonProcess, pynsq: PynsqClients
) -> None:
    topic, channel = unique("pynsq_pub"), "readers"
    writer = await pynsq.writer(nsqd)
    singles = [b"pub-%d" % i for i in range(20)]
    batch = [b"mpub-%d" % i for i in range(30)]
    for body in singles:
        assert await answer(partial(writer.pub, topic, body)) == b"OK"
    assert await answer(partial(writer.mpub, topic, batch)) == b"OK"
    dpub_sent = time.monotonic()
    assert await answer(partial(writer.dpub, topic, 300, b"dpub-0")) == b"OK"
    expected = [*singles, *batch, b"dpub-0"]
    assert topic_stats(nsqd, topic)["message_count"] == len(expected)

    deliveries: list[Delivery] = []
    everything = asyncio.get_running_loop().create_future()

    def handler(message: Any) -> bool:
        deliveries.append(delivery(message))
        if len(deliveries) == len(expected):
            everything.set_result(None)
        return True

    pynsq.reader(nsqd, topic, channel, handler, max_in_flight=10)
    await asyncio.wait_for(everything, 10)

    assert sorted(d.body for d in deliveries) == sorted(expected)
    assert {d.attempts for d in deliveries} == {1}
    (deferred,) = [d for d in deliveries if d.body == b"dpub-0"]
    assert deferred.at - dpub_sent >= 0.28  # DPUB 300 ms; never early
    stats = await wait_channel(
        nsqd,
        topic,
        channel,
        message_count=len(expected),
        clients_finish_count=len(expected),
        requeue_count=0,
        timeout_count=0,
        in_flight_count=0,
        deferred_count=0,
        depth=0,
    )
    client = only_client(stats)
    assert client["user_agent"].startswith("pynsq/")
    assert client["ready_count"] == 10  # pynsq's RDY for one connection is max_in_flight
    assert client["message_count"] == client["finish_count"] == len(expected)


async def test_reader_max_in_flight_caps_unfinished_messages(
    nsqd: DaemonProcess, pynsq: PynsqClients
) -> None:
    topic, channel = unique("pynsq_mif"), "slow"
    writer = await pynsq.writer(nsqd)
    bodies = [b"held-%d" % i for i in range(12)]
    assert await answer(partial(writer.mpub, topic, bodies)) == b"OK"

    release = asyncio.Event()
    held: list[bytes] = []

    async def handler(message: Any) -> bool:
        held.append(message.body)
        await release.wait()
        return True

    pynsq.reader(nsqd, topic, channel, handler, max_in_flight=4)
    await wait_channel(nsqd, topic, channel, in_flight_count=4)
    await asyncio.sleep(0.2)  # nsqd must not send a fifth message while four are unfinished
    stats = channel_stats(nsqd, topic, channel)
    assert (stats["in_flight_count"], stats["depth"], len(held)) == (4, 8, 4)
    assert only_client(stats)["ready_count"] == 4

    release.set()
    await wait_channel(nsqd, topic, channel, clients_finish_count=12, in_flight_count=0, depth=0)
    assert sorted(held) == sorted(bodies)


async def test_requeue_redelivers_with_incremented_attempts(
    nsqd: DaemonProcess, pynsq: PynsqClients
) -> None:
    topic, channel = unique("pynsq_req"), "retry"
    writer = await pynsq.writer(nsqd)
    bodies = [b"flaky-a", b"flaky-b", b"flaky-c"]
    assert await answer(partial(writer.mpub, topic, bodies)) == b"OK"

    attempts_seen: dict[bytes, list[int]] = defaultdict(list)
    done = asyncio.get_running_loop().create_future()

    def handler(message: Any) -> bool:
        attempts_seen[message.body].append(message.attempts)
        if message.attempts < 3:
            return False  # pynsq sends REQ and backs off
        if all(seen[-1] == 3 for seen in attempts_seen.values()) and len(attempts_seen) == 3:
            done.set_result(None)
        return True

    # requeue_delay=0: REQ <id> 0; a short max backoff keeps the test quick.
    pynsq.reader(
        nsqd, topic, channel, handler, max_in_flight=3, requeue_delay=0, max_backoff_duration=0.5
    )
    await asyncio.wait_for(done, 10)

    assert dict(attempts_seen) == {body: [1, 2, 3] for body in bodies}
    await wait_channel(
        nsqd,
        topic,
        channel,
        message_count=3,
        requeue_count=6,
        clients_finish_count=3,
        timeout_count=0,
        in_flight_count=0,
        deferred_count=0,
        depth=0,
    )


async def test_backoff_rdy_zero_holds_back_the_requeued_message(
    nsqd: DaemonProcess, pynsq: PynsqClients
) -> None:
    """pynsq answers a failure with RDY 0 before REQ, so nsqd must wait for the next RDY."""
    topic, channel = unique("pynsq_backoff"), "backoff"
    writer = await pynsq.writer(nsqd)
    assert await answer(partial(writer.pub, topic, b"retry-me")) == b"OK"

    deliveries: list[Delivery] = []
    done = asyncio.get_running_loop().create_future()

    def handler(message: Any) -> bool:
        deliveries.append(delivery(message))
        if message.attempts == 1:
            return False
        done.set_result(None)
        return True

    # One failure with max_backoff_duration=10 backs off 10 * (0.25/10 + 0.75/250) = 0.28 s.
    pynsq.reader(
        nsqd, topic, channel, handler, max_in_flight=5, requeue_delay=0, max_backoff_duration=10
    )
    await asyncio.wait_for(done, 10)

    first, second = deliveries
    assert (first.attempts, second.attempts) == (1, 2)
    assert second.at - first.at >= 0.25, "nsqd delivered the REQ'd message during RDY 0"
    await wait_channel(
        nsqd, topic, channel, requeue_count=1, clients_finish_count=1, in_flight_count=0
    )
    # The success ends the backoff: pynsq restores RDY max_in_flight.
    await wait_for_async(
        lambda: only_client(channel_stats(nsqd, topic, channel))["ready_count"],
        lambda ready: ready == 5,
        what="RDY 5 after backoff",
        timeout=5.0,
    )


async def test_touch_keeps_a_slow_message_past_msg_timeout(
    nsqd_factory: NsqdFactory, pynsq: PynsqClients
) -> None:
    nsqd = nsqd_factory("--msg-timeout=600ms")
    topic, channel = unique("pynsq_touch"), "slow"
    writer = await pynsq.writer(nsqd)
    assert await answer(partial(writer.mpub, topic, [b"touched", b"untouched"])) == b"OK"

    deliveries: list[tuple[bytes, int]] = []
    redelivered = asyncio.Event()

    async def handler(message: Any) -> bool:
        deliveries.append((message.body, message.attempts))
        if message.body == b"touched":
            for _ in range(6):  # 0.9 s in all, each TOUCH well inside the 0.6 s timeout
                await asyncio.sleep(0.15)
                message.touch()
            return True
        if message.attempts == 1:
            # Never touched: nsqd times it out and sends it again; this late FIN then
            # fails (E_FIN_FAILED, not fatal) because the redelivery was already finished.
            await asyncio.wait_for(redelivered.wait(), 5)
            return True
        redelivered.set()
        return True

    pynsq.reader(nsqd, topic, channel, handler, max_in_flight=2)
    await wait_channel(
        nsqd,
        topic,
        channel,
        clients_finish_count=2,
        timeout_count=1,
        requeue_count=0,
        in_flight_count=0,
        depth=0,
    )
    assert sorted(deliveries) == [(b"touched", 1), (b"untouched", 1), (b"untouched", 2)]
