"""The consumer and producer against real nsqpy nsqd processes."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqpy.client import Consumer, Message, NoConnectionsError, Producer
from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import wait_until_async
from .daemons import channel_stats, in_flight, in_thread, stats, tcp

#: every message on disk and fsynced, so a SIGKILL loses nothing that nsqd acknowledged
DURABLE = ("--mem-queue-size=0", "--sync-every=1")


def nsqd_in(path: Path, *flags: str) -> DaemonProcess:
    path.mkdir(parents=True, exist_ok=True)
    return start_nsqd(path, *flags)


@pytest.fixture
def two_nsqd(tmp_path: Path) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    a = nsqd_in(tmp_path / "a", *DURABLE)
    b = nsqd_in(tmp_path / "b", *DURABLE)
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture
def nsqd(tmp_path: Path) -> Iterator[DaemonProcess]:
    daemon = nsqd_in(tmp_path / "nsqd")
    try:
        yield daemon
    finally:
        daemon.stop()


async def publish_numbered(address: str, topic: str, start: int, count: int) -> list[bytes]:
    bodies = [b"msg-%06d" % i for i in range(start, start + count)]
    async with Producer(address) as producer:
        for i in range(0, count, 50):
            await producer.multi_publish(topic, bodies[i : i + 50])
    return bodies


async def test_max_in_flight_holds_across_two_nsqd(
    two_nsqd: tuple[DaemonProcess, DaemonProcess],
) -> None:
    a, b = two_nsqd
    topic, channel, max_in_flight = "spread", "ch", 4
    received: list[bytes] = []
    rng = random.Random(3)

    async def handle(msg: Message) -> None:
        await asyncio.sleep(rng.uniform(0.0005, 0.004))
        received.append(msg.body)

    consumer = Consumer(
        topic, channel, handle, nsqd_tcp_addresses=[tcp(a), tcp(b)], max_in_flight=max_in_flight
    )
    # the channel exists before the consumer arrives, so it sees every message
    published = await publish_numbered(tcp(a), topic, 0, 300)
    published += await publish_numbered(tcp(b), topic, 300, 300)
    await consumer.start()

    samples: list[tuple[int, int, int]] = []

    def sample() -> None:
        snapshot = []
        for daemon in (a, b):
            c = channel_stats(daemon, topic, channel) or {"in_flight_count": 0, "clients": []}
            ready = sum(client["ready_count"] for client in c["clients"] or ())
            snapshot.append((int(c["in_flight_count"]), ready))
        samples.append(
            (snapshot[0][0] + snapshot[1][0], snapshot[0][1] + snapshot[1][1], len(received))
        )

    while len(received) < len(published):
        await in_thread(sample)
        # the consumer's own view must hold at every instant too
        assert consumer.in_flight <= max_in_flight
        assert consumer._rdy is not None
        assert consumer._rdy.total_rdy <= max_in_flight
        if len(samples) > 2000:
            break
    await consumer.close()

    assert sorted(received) == sorted(published)
    assert max(s[0] for s in samples) <= max_in_flight, samples
    assert max(s[1] for s in samples) <= max_in_flight, samples
    assert max(s[0] for s in samples) >= 2  # the limit was actually reached for
    assert len(samples) >= 10  # it was observed while running
    for daemon in (a, b):
        c = channel_stats(daemon, topic, channel)
        assert c is not None and c["depth"] == 0 and c["in_flight_count"] == 0


async def test_is_starved_signals_when_to_process_a_batch(nsqd: DaemonProcess) -> None:
    topic, max_in_flight = "batches", 10
    held: list[Message] = []
    batches: list[int] = []

    def handle(msg: Message) -> None:
        msg.disable_auto_response()
        held.append(msg)
        if consumer.is_starved():
            batches.append(len(held))
            for m in held:
                m.finish()
            held.clear()

    consumer = Consumer(
        topic, "ch", handle, nsqd_tcp_addresses=[tcp(nsqd)], max_in_flight=max_in_flight
    )
    await publish_numbered(tcp(nsqd), topic, 0, 46)
    async with consumer:
        await wait_until_async(
            lambda: sum(batches) == 46, what="46 messages in batches", timeout=10.0
        )
    # RDY 1 at first (1 of 1 in flight is starved), then RDY 10: 9 >= 85% of 10
    assert batches == [1, 9, 9, 9, 9, 9]


async def test_backoff_slows_and_recovers(nsqd: DaemonProcess) -> None:
    topic = "backoff"
    arrivals: list[float] = []
    loop = asyncio.get_running_loop()

    def handle(msg: Message) -> bool:
        arrivals.append(loop.time())
        return len(arrivals) > 3  # the first three deliveries fail

    await publish_numbered(tcp(nsqd), topic, 0, 30)
    consumer = Consumer(
        topic,
        "ch",
        handle,
        nsqd_tcp_addresses=[tcp(nsqd)],
        max_in_flight=5,
        backoff_multiplier=0.05,  # levels 1, 2, 3 = 100, 200, 400 ms
        requeue_delay=0,
    )
    async with consumer:
        await wait_until_async(
            lambda: consumer.stats().messages_finished == 30, what="30 FINs", timeout=10.0
        )
        assert not consumer.in_backoff
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    # failures 1-3 step up (100, 200, 400 ms of RDY 0 each), successes step back down
    # (a success at level 3 waits 200 ms, at level 2 100 ms), then the flow is back at full speed
    for gap, minimum in zip(gaps[:5], (0.1, 0.2, 0.4, 0.2, 0.1), strict=True):
        assert minimum - 0.005 <= gap < minimum + 1.0, gaps
    assert arrivals[-1] - arrivals[5] < 0.5, gaps  # the last 27 arrive without backoff
    assert len(arrivals) == 33


async def test_giving_up_after_max_attempts(nsqd: DaemonProcess) -> None:
    topic = "give_up"
    attempts: list[int] = []
    given_up: list[Message] = []

    def always_fail(msg: Message) -> bool:
        attempts.append(msg.attempts)
        return False

    async with Producer(tcp(nsqd)) as producer:
        await producer.publish(topic, b"poison")
    consumer = Consumer(
        topic,
        "ch",
        always_fail,
        nsqd_tcp_addresses=[tcp(nsqd)],
        max_attempts=3,
        on_giving_up=given_up.append,
        requeue_delay=0,
        max_backoff_duration=0,
    )
    async with consumer:
        await wait_until_async(lambda: bool(given_up), what="giving up", timeout=10.0)
        await wait_until_async(
            lambda: in_flight(nsqd, topic, "ch") == 0, what="FIN of the poison", timeout=10.0
        )
    assert attempts == [1, 2, 3]
    assert [(m.body, m.attempts) for m in given_up] == [(b"poison", 4)]
    c = channel_stats(nsqd, topic, "ch")
    assert c is not None
    assert (c["depth"], c["requeue_count"], c["in_flight_count"]) == (0, 3, 0)


async def test_reconnect_after_sigkill_loses_nothing_acknowledged(
    two_nsqd: tuple[DaemonProcess, DaemonProcess], tmp_path: Path
) -> None:
    a, b = two_nsqd
    topic = "durable"
    received: set[bytes] = set()
    acknowledged: list[bytes] = []

    def handle(msg: Message) -> None:
        received.add(msg.body)

    producer = Producer([tcp(a), tcp(b)], reconnect_interval=0.05)
    consumer = Consumer(
        topic,
        "ch",
        handle,
        nsqd_tcp_addresses=[tcp(a), tcp(b)],
        max_in_flight=4,
        reconnect_interval=0.05,
    )

    async def publish(start: int, count: int) -> None:
        for i in range(start, start + count):
            body = b"d-%05d" % i
            try:
                await producer.publish(topic, body)
            except NoConnectionsError:
                continue  # not acknowledged: not expected to arrive
            acknowledged.append(body)

    await publish(0, 200)  # creates the topic (and the channel, with the consumer)
    await consumer.start()
    await consumer.wait_connected(2)
    await publish(200, 200)
    await wait_until_async(lambda: len(received) >= 100, what="100 messages", timeout=10.0)

    # quiesce, so that no message is on the wire when nsqd dies
    consumer.change_max_in_flight(0)
    await wait_until_async(lambda: consumer.in_flight == 0, what="nothing in flight", timeout=10.0)
    await wait_until_async(
        lambda: in_flight(a, topic, "ch") == 0 and in_flight(b, topic, "ch") == 0,
        what="nsqd sees nothing in flight",
        timeout=10.0,
    )
    a_port = a.tcp_port
    a.kill()
    # while a is down, publishes fail over to b
    await publish(400, 200)
    a.args.append(f"--tcp-address=127.0.0.1:{a_port}")
    await in_thread(a.start)
    consumer.change_max_in_flight(4)
    await publish(600, 100)
    await wait_until_async(
        lambda: len(consumer.connections) == 2, what="reconnect to the restarted nsqd", timeout=10.0
    )
    await wait_until_async(
        lambda: received >= set(acknowledged), timeout=20, what="every acknowledged message"
    )
    await consumer.close()
    await producer.close()
    assert len(acknowledged) >= 650
    assert received == set(acknowledged)
    assert stats(a)["topics"]  # a came back with its data


async def test_close_sends_cls_and_drains_in_flight(nsqd: DaemonProcess) -> None:
    topic = "drain"
    release = asyncio.Event()
    done: list[bytes] = []

    async def slow(msg: Message) -> None:
        await release.wait()
        done.append(msg.body)

    await publish_numbered(tcp(nsqd), topic, 0, 3)
    consumer = Consumer(topic, "ch", slow, nsqd_tcp_addresses=[tcp(nsqd)], max_in_flight=3)
    await consumer.start()
    await wait_until_async(lambda: consumer.in_flight == 1, what="first message", timeout=10.0)
    closing = asyncio.create_task(consumer.close(timeout=5))
    await asyncio.sleep(0.1)
    assert not closing.done()
    release.set()
    await asyncio.wait_for(closing, 5)
    c = channel_stats(nsqd, topic, "ch")
    assert c is not None
    # what was delivered before CLS was processed and FINished; the rest stays queued
    assert c["in_flight_count"] == 0
    assert c["depth"] == 3 - len(done)
    assert len(done) >= 1
