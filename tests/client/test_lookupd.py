"""Discovery through real nsqlookupd processes.

nsqd's own registration with nsqlookupd is not wired yet, so :class:`Registration` registers
an nsqd the way nsqd does (``  V1``, IDENTIFY, REGISTER over TCP) against the real nsqlookupd;
its connection closing is what nsqd dying looks like to nsqlookupd.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import select
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from nsqpy.client import Consumer, Message, Producer
from nsqpy.client.lookup import LookupdPoller, lookup_url, producer_addresses
from nsqpy.testing import DaemonProcess, start_nsqd, start_nsqlookupd

from ..hosts_namespace import HostsFile
from ..raw_v2 import wait_until_async
from .daemons import tcp

BE32 = struct.Struct(">i")


class Registration:
    """One nsqd's registration in one nsqlookupd, held open like nsqd's lookup peer."""

    def __init__(self, lookupd: DaemonProcess, nsqd: DaemonProcess) -> None:
        self.lookupd = lookupd
        self.nsqd = nsqd
        self.writer: asyncio.StreamWriter | None = None
        self.reader: asyncio.StreamReader | None = None

    async def register(self, *topics: str) -> Registration:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(*self.lookupd.tcp_address)
            identity = {
                "broadcast_address": "127.0.0.1",
                "hostname": "test",
                "http_port": self.nsqd.http_port,
                "tcp_port": self.nsqd.tcp_port,
                "version": "1.3.0",
            }
            body = json.dumps(identity).encode()
            self.writer.write(b"  V1IDENTIFY\n" + BE32.pack(len(body)) + body)
            await self._response()
        assert self.writer is not None
        for topic in topics:
            self.writer.write(f"REGISTER {topic}\n".encode())
            assert await self._response() == b"OK"
        return self

    async def _response(self) -> bytes:
        assert self.reader is not None
        (size,) = BE32.unpack(await self.reader.readexactly(4))
        return await self.reader.readexactly(size)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()
            self.writer = None


@pytest.fixture
def lookupds() -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    one, two = start_nsqlookupd(), start_nsqlookupd()
    try:
        yield one, two
    finally:
        one.stop()
        two.stop()


@pytest.fixture
def two_nsqd(tmp_path: Path) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = start_nsqd(tmp_path / "a"), start_nsqd(tmp_path / "b")
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_lookup_url_and_producer_parsing() -> None:
    assert lookup_url("127.0.0.1:4161", "t") == "http://127.0.0.1:4161/lookup?topic=t"
    assert lookup_url("https://h:1/custom?x=1&topic=old", "t") == "https://h:1/custom?x=1&topic=t"
    with pytest.raises(ValueError):
        lookup_url("no-port", "t")
    producer = {"broadcast_address": "::1", "tcp_port": 4150, "http_port": 4151}
    assert producer_addresses({"channels": [], "producers": [producer]}) == ["[::1]:4150"]
    legacy = {"status_code": 200, "data": {"producers": [dict(producer, broadcast_address="h")]}}
    assert producer_addresses(legacy) == ["h:4150"]
    assert producer_addresses({"message": "TOPIC_NOT_FOUND"}) == []


async def test_union_of_all_lookupd_keyed_by_address(
    lookupds: tuple[DaemonProcess, DaemonProcess],
    two_nsqd: tuple[DaemonProcess, DaemonProcess],
) -> None:
    l1, l2 = lookupds
    a, b = two_nsqd
    topic = "union"
    regs = [
        await Registration(l1, a).register(topic),
        await Registration(l2, a).register(topic),  # a is known to both
        await Registration(l2, b).register(topic),
    ]
    received: list[bytes] = []
    for nsqd, body in ((a, b"from-a"), (b, b"from-b")):
        async with Producer(tcp(nsqd)) as producer:
            await producer.publish(topic, body)

    def collect(msg: Message) -> None:
        received.append(msg.body)

    consumer = Consumer(
        topic, "ch", collect, lookupd_http_addresses=[l1.http_url, l2.http_url], max_in_flight=2
    )
    async with consumer:
        await wait_until_async(lambda: len(received) == 2, what="both messages", timeout=10.0)
        assert sorted(consumer.connections) == sorted([tcp(a), tcp(b)])
    for reg in regs:
        await reg.close()
    assert sorted(received) == [b"from-a", b"from-b"]


async def test_new_nsqd_found_by_a_later_poll_and_dead_ones_not_retried(
    lookupds: tuple[DaemonProcess, DaemonProcess],
    two_nsqd: tuple[DaemonProcess, DaemonProcess],
) -> None:
    lookupd, _ = lookupds
    a, b = two_nsqd
    topic = "polled"
    reg_a = await Registration(lookupd, a).register(topic)
    attempts: list[str] = []
    consumer = Consumer(
        topic,
        "ch",
        lambda m: None,
        lookupd_http_addresses=[lookupd.http_url],
        lookupd_poll_interval=0.1,
        lookupd_poll_jitter=0.0,
        reconnect_interval=0.05,
    )
    original = consumer._start_connect

    def record(address: str) -> None:
        attempts.append(address)
        original(address)

    consumer._start_connect = record  # type: ignore[method-assign]
    async with consumer:
        await wait_until_async(
            lambda: list(consumer.connections) == [tcp(a)], what="a", timeout=10.0
        )
        reg_b = await Registration(lookupd, b).register(topic)
        await wait_until_async(
            lambda: tcp(b) in consumer.connections, timeout=2, what="b discovered"
        )
        # a dies: nsqlookupd drops it with its registration connection
        a.kill()
        await reg_a.close()
        await wait_until_async(
            lambda: list(consumer.connections) == [tcp(b)], what="a gone", timeout=10.0
        )
        rounds = consumer._poller.rounds if consumer._poller else 0
        await wait_until_async(
            lambda: consumer._poller is not None and consumer._poller.rounds >= rounds + 3,
            what="three more polls",
            timeout=10.0,
        )
        # a reconnect only follows a poll that lists the nsqd again: a is never retried
        assert attempts.count(tcp(a)) == 1
        await reg_b.close()


async def test_poll_interval_and_jitter() -> None:
    class Fixed(random.Random):
        def random(self) -> float:
            return 1.0  # always the largest jitter

    seen: list[float] = []
    loop = asyncio.get_running_loop()
    poller = LookupdPoller(
        ["127.0.0.1:1"],  # nothing listens: every round is an (ignored) error
        "t",
        lambda addresses: seen.append(loop.time()),
        interval=0.05,
        jitter=0.5,
        timeout=0.5,
        rng=Fixed(),
    )
    poller.start()
    await wait_until_async(lambda: len(seen) >= 4, what="four rounds", timeout=10.0)
    await poller.close()
    gaps = [later - earlier for earlier, later in itertools.pairwise(seen)]
    assert all(0.075 <= gap < 0.2 for gap in gaps), gaps  # 50 ms + 50% jitter


async def test_trigger_polls_at_once() -> None:
    seen: list[float] = []
    loop = asyncio.get_running_loop()
    poller = LookupdPoller(
        ["127.0.0.1:1"], "t", lambda a: seen.append(loop.time()), interval=60, timeout=0.5
    )
    poller.start()
    await wait_until_async(lambda: len(seen) == 1, what="first round", timeout=10.0)
    poller.trigger()
    await wait_until_async(lambda: len(seen) == 2, timeout=2, what="triggered round")
    await poller.close()


async def test_nsqd_registering_itself(tmp_path: Path) -> None:
    """End to end with nsqd's own --lookupd-tcp-address: lookupd lists it, a consumer finds it."""
    lookupd = start_nsqlookupd()
    nsqd = start_nsqd(tmp_path, f"--lookupd-tcp-address={tcp(lookupd)}")
    try:
        async with Producer(tcp(nsqd)) as producer:
            await producer.publish("self_registered", b"x")
        poller = LookupdPoller([lookupd.http_url], "self_registered", lambda a: None)
        found = await wait_until_async(
            poller.poll, timeout=10.0, what="nsqd to register the topic with nsqlookupd"
        )
        await poller.close()
        assert found == [tcp(nsqd)], "nsqd did not register the topic with nsqlookupd"
        received: list[bytes] = []
        consumer = Consumer(
            "self_registered",
            "ch",
            lambda m: received.append(m.body),
            lookupd_http_addresses=[lookupd.http_url],
        )
        async with consumer:
            await wait_until_async(lambda: received == [b"x"], what="the message", timeout=10.0)
    finally:
        nsqd.stop()
        lookupd.stop()


# The poller runs in its own process, so that it can have its own /etc/hosts.
_POLLER_SCRIPT = """
import asyncio, sys
from nsqpy.client.lookup import LookupdPoller

async def main():
    report = lambda found: print(" ".join(found) or "-", flush=True)
    LookupdPoller([sys.argv[1]], sys.argv[2], report, interval=0.1, jitter=0).start()
    await asyncio.sleep(120)

asyncio.run(main())
"""


@pytest.mark.root
def test_poller_resolves_the_lookupd_name_on_every_poll(tmp_path: Path) -> None:
    """nsqio/nsq#1233: when a lookupd name starts resolving elsewhere, the next poll asks the
    new address, even while the old lookupd still answers (no kept-alive connection, no DNS
    cache). The name first points at a lookupd on 127.0.0.1, then at one on ::1 (same port)."""
    name = "lookupd.nsqpy.test"
    old = start_nsqlookupd()
    new = start_nsqlookupd(
        f"--tcp-address=[::1]:{old.tcp_port}", f"--http-address=[::1]:{old.http_port}"
    )
    daemons = [old, new]
    poller: subprocess.Popen[str] | None = None
    try:
        for lookupd, data in ((old, "a"), (new, "b")):
            (tmp_path / data).mkdir()
            host, port = lookupd.tcp_address
            nsqd = start_nsqd(tmp_path / data, f"--lookupd-tcp-address=[{host}]:{port}")
            daemons.append(nsqd)
            urllib.request.urlopen(
                urllib.request.Request(f"{nsqd.http_url}/topic/create?topic=moving", b"")
            ).close()
        via_old, via_new = tcp(daemons[2]), tcp(daemons[3])
        hosts = HostsFile(tmp_path / "hosts", {name: "127.0.0.1"})
        argv = [sys.executable, "-c", _POLLER_SCRIPT, f"{name}:{old.http_port}", "moving"]
        poller = subprocess.Popen(hosts.wrap(argv), stdout=subprocess.PIPE, text=True)
        assert poller.stdout is not None
        read_until(poller.stdout, via_old)
        hosts.set(name, "::1")
        read_until(poller.stdout, via_new)
    finally:
        if poller is not None:
            poller.kill()
            poller.wait()
        for daemon in daemons:
            daemon.stop()


def read_until(stream: IO[str], wanted: str, timeout: float = 10.0) -> None:
    """Read the poller's report lines until one is exactly ``wanted``."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = stream.readline()
        if not line:
            break
        seen.append(line.strip())
        if seen[-1] == wanted:
            return
    raise AssertionError(f"the poller never reported {wanted}; it reported {seen[-5:]}")
