"""pynsq's and ansq's lookupd-based readers follow nsqpy producers that come and go.

test_lookupd_discovery.py covers readers finding nsqds that are already registered; here an
nsqd registers the topic only after the reader started (the reader must find it at a later
lookupd poll), and an nsqd stops and starts again (ansq must drop its connection, then find the
restarted nsqd, which registers its topics from nsqd.dat, at its new address).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import ansq
import pytest

from nsqpy.testing import DaemonProcess, start_nsqlookupd

from ..raw_v2 import unique, wait_for_async
from .conftest import NsqdFactory
from .helpers import ansq_read, http_post, lookup_tcp_ports, tcp_address
from .pynsq_harness import PynsqClients


@pytest.fixture
def nsqlookupd() -> Iterator[DaemonProcess]:
    daemon = start_nsqlookupd()
    yield daemon
    crashed = daemon.proc is not None and daemon.proc.poll() is not None
    daemon.stop()
    assert not crashed, f"nsqlookupd died during the test:\n{daemon.log}"


def registered_nsqd(nsqd_factory: NsqdFactory, nsqlookupd: DaemonProcess) -> DaemonProcess:
    return nsqd_factory(f"--lookupd-tcp-address={tcp_address(nsqlookupd)}")


async def wait_producers(nsqlookupd: DaemonProcess, topic: str, *nsqds: DaemonProcess) -> None:
    ports = sorted(nsqd.tcp_port for nsqd in nsqds)
    await wait_for_async(
        lambda: lookup_tcp_ports(nsqlookupd, topic),
        lambda found: found == ports,
        what=f"{topic} producers {ports}",
        timeout=5.0,
    )


def publish(nsqd: DaemonProcess, topic: str, body: bytes) -> None:
    assert http_post(nsqd, "/pub", body, topic=topic) == b"OK"


async def test_pynsq_reader_finds_a_producer_that_registers_later(
    nsqd_factory: NsqdFactory, nsqlookupd: DaemonProcess, pynsq: PynsqClients
) -> None:
    first = registered_nsqd(nsqd_factory, nsqlookupd)
    second = registered_nsqd(nsqd_factory, nsqlookupd)
    topic, channel = unique("pynsq_later"), "discovered"
    publish(first, topic, b"early")
    await wait_producers(nsqlookupd, topic, first)

    received: list[bytes] = []
    arrived = asyncio.Event()

    def handler(message: Any) -> bool:
        received.append(message.body)
        arrived.set()
        return True

    reader = pynsq.reader(
        None,
        topic,
        channel,
        handler,
        lookupd_http_addresses=[f"http://127.0.0.1:{nsqlookupd.http_port}"],
        lookupd_poll_interval=1,  # seconds, pynsq's minimum
        lookupd_poll_jitter=0.0,
        max_in_flight=10,  # >= connections, or pynsq rations RDY 1 between them for seconds
    )
    await asyncio.wait_for(arrived.wait(), 10)
    assert received == [b"early"]
    assert list(reader.conns) == [tcp_address(first)]

    arrived.clear()
    publish(second, topic, b"late")
    await asyncio.wait_for(arrived.wait(), 10)  # at the next lookupd poll
    assert received == [b"early", b"late"]
    assert sorted(reader.conns) == sorted([tcp_address(first), tcp_address(second)])


async def test_ansq_reader_follows_producers_coming_and_going(
    nsqd_factory: NsqdFactory, nsqlookupd: DaemonProcess
) -> None:
    first = registered_nsqd(nsqd_factory, nsqlookupd)
    second = registered_nsqd(nsqd_factory, nsqlookupd)
    topic, channel = unique("ansq_later"), "discovered"
    publish(first, topic, b"early")
    await wait_producers(nsqlookupd, topic, first)
    reader = await ansq.create_reader(
        topic=topic,
        channel=channel,
        lookupd_http_addresses=[f"127.0.0.1:{nsqlookupd.http_port}"],
        lookupd_poll_interval=100,  # milliseconds
    )
    try:
        assert await asyncio.wait_for(ansq_read(reader, 1), 10) == [b"early"]
        publish(second, topic, b"late")
        assert await asyncio.wait_for(ansq_read(reader, 1), 10) == [b"late"]
        assert len(reader.connections) == 2

        # an nsqd that goes away is no longer named, and ansq drops its connection
        await asyncio.to_thread(second.stop)
        await wait_producers(nsqlookupd, topic, first)
        await wait_for_async(
            lambda: len(reader.connections), lambda n: n == 1, what="one connection", timeout=5.0
        )
        publish(first, topic, b"meanwhile")
        assert await asyncio.wait_for(ansq_read(reader, 1), 10) == [b"meanwhile"]

        # back (on new ports), it registers the topic from nsqd.dat and is found again
        await asyncio.to_thread(second.start)
        await wait_producers(nsqlookupd, topic, first, second)
        publish(second, topic, b"back")
        assert await asyncio.wait_for(ansq_read(reader, 1), 10) == [b"back"]
        assert len(reader.connections) == 2
    finally:
        await reader.close()
