"""The blocking facade, against a real nsqd (plain test functions: no event loop here)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqpy.client import sync
from nsqpy.testing import DaemonProcess, start_nsqd

from .daemons import channel_stats, stats, tcp


@pytest.fixture
def nsqd(tmp_path: Path) -> Iterator[DaemonProcess]:
    daemon = start_nsqd(tmp_path)
    try:
        yield daemon
    finally:
        daemon.stop()


def depth(nsqd: DaemonProcess, topic: str) -> int:
    topics = stats(nsqd, topic)["topics"] or []
    return int(topics[0]["depth"]) if topics else 0


def test_publish_then_consume(nsqd: DaemonProcess) -> None:
    sync.publish(tcp(nsqd), "script", b"one")
    sync.publish(tcp(nsqd), "script", ["two", b"three", "four"])  # one MPUB
    assert depth(nsqd, "script") == 4
    messages = sync.consume("script", "ch", 3, nsqd_tcp_addresses=tcp(nsqd), timeout=5)
    assert [m.body for m in messages] == [b"one", b"two", b"three"]
    assert all(m.responded for m in messages)
    rest = sync.consume("script", "ch", 1, nsqd_tcp_addresses=tcp(nsqd), timeout=5)
    assert [m.body for m in rest] == [b"four"]
    c = channel_stats(nsqd, "script", "ch")
    assert c is not None and (c["depth"], c["in_flight_count"]) == (0, 0)


def test_messages_beyond_count_are_requeued(nsqd: DaemonProcess) -> None:
    sync.publish(tcp(nsqd), "extra", [b"%d" % i for i in range(10)])
    messages = sync.consume(
        "extra", "ch", 2, nsqd_tcp_addresses=tcp(nsqd), max_in_flight=10, timeout=5
    )
    assert len(messages) == 2
    c = channel_stats(nsqd, "extra", "ch")
    assert c is not None
    assert c["depth"] + c["in_flight_count"] == 8  # nothing lost, nothing kept in flight
    rest = sync.consume("extra", "ch", 8, nsqd_tcp_addresses=tcp(nsqd), timeout=5)
    assert sorted(m.body for m in messages + rest) == sorted(b"%d" % i for i in range(10))


def test_consume_timeout_returns_what_arrived(nsqd: DaemonProcess) -> None:
    sync.publish(tcp(nsqd), "short", b"only")
    with pytest.raises(sync.ConsumeTimeout) as info:
        sync.consume("short", "ch", 2, nsqd_tcp_addresses=tcp(nsqd), timeout=0.5)
    assert [m.body for m in info.value.messages] == [b"only"]


def test_sync_producer_keeps_its_connection(nsqd: DaemonProcess) -> None:
    with sync.SyncProducer(tcp(nsqd)) as producer:
        for i in range(50):
            producer.publish("kept", b"%d" % i)
        producer.deferred_publish("kept", 0.01, b"deferred")
        producer.multi_publish("kept", [b"a", b"b"])
    assert stats(nsqd, "kept")["topics"][0]["message_count"] == 53


def test_usable_from_inside_a_running_event_loop(nsqd: DaemonProcess) -> None:
    async def inside() -> list[bytes]:
        # a script running inside asyncio (e.g. a notebook) can still use the facade
        sync.publish(tcp(nsqd), "nested", b"hi")
        return [m.body for m in sync.consume("nested", "ch", 1, nsqd_tcp_addresses=tcp(nsqd))]

    assert asyncio.run(inside()) == [b"hi"]
