"""pynsq and ansq readers discovering two nsqpy nsqd daemons through nsqpy's nsqlookupd."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import ansq
import pytest

from nsqpy.testing import DaemonProcess, start_nsqlookupd

from ..raw_v2 import unique, wait_for_async
from .conftest import NsqdFactory
from .helpers import ansq_read, http_post, lookup_tcp_ports, wait_channel
from .pynsq_harness import PynsqClients


@pytest.fixture
def nsqlookupd() -> Iterator[DaemonProcess]:
    daemon = start_nsqlookupd()
    yield daemon
    daemon.stop()


async def test_readers_find_every_producer_through_nsqlookupd(
    nsqd_factory: NsqdFactory, nsqlookupd: DaemonProcess, pynsq: PynsqClients
) -> None:
    lookupd_tcp = "{}:{}".format(*nsqlookupd.tcp_address)
    lookupd_http = "{}:{}".format(*nsqlookupd.http_address)
    producers = [nsqd_factory(f"--lookupd-tcp-address={lookupd_tcp}") for _ in range(2)]
    topic = unique("lookupd")
    expected: list[bytes] = []
    for index, nsqd in enumerate(producers):
        http_post(nsqd, "/topic/create", topic=topic)
        for channel in ("pynsq", "ansq"):
            http_post(nsqd, "/channel/create", topic=topic, channel=channel)
        bodies = [b"from-nsqd%d-%d" % (index, i) for i in range(5)]
        assert http_post(nsqd, "/mpub", b"\n".join(bodies), topic=topic) == b"OK"
        expected += bodies

    await wait_for_async(
        lambda: lookup_tcp_ports(nsqlookupd, topic),
        lambda ports: ports == sorted(d.tcp_port for d in producers),
        what="both nsqd registered with nsqlookupd",
        timeout=5.0,
    )

    pynsq_bodies: list[bytes] = []
    pynsq_done = asyncio.get_running_loop().create_future()

    def handler(message: Any) -> bool:
        pynsq_bodies.append(message.body)
        if len(pynsq_bodies) == len(expected):
            pynsq_done.set_result(None)
        return True

    # pynsq queries nsqlookupd at once, then every lookupd_poll_interval seconds.
    pynsq.reader(
        None,
        topic,
        "pynsq",
        handler,
        lookupd_http_addresses=[f"http://{lookupd_http}"],
        lookupd_poll_interval=1,
        max_in_flight=4,
    )
    # ansq queries nsqlookupd while connecting (its poll interval is in milliseconds).
    reader = await ansq.create_reader(
        topic=topic,
        channel="ansq",
        lookupd_http_addresses=[lookupd_http],
        lookupd_poll_interval=1000,
    )
    try:
        assert len(reader.connections) == 2
        ansq_bodies = await asyncio.wait_for(ansq_read(reader, len(expected)), 10)
        await asyncio.wait_for(pynsq_done, 10)
    finally:
        await reader.close()

    assert sorted(ansq_bodies) == sorted(expected)
    assert sorted(pynsq_bodies) == sorted(expected)
    for nsqd in producers:
        await wait_channel(nsqd, topic, "pynsq", message_count=5, in_flight_count=0, depth=0)
