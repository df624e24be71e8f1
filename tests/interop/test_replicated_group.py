"""Unchanged clients through nsqlookupd in front of a replicated group that loses a node.

Three nsqpy nsqd name one another as ``--replica-peer`` (``--replica-acks=2``, every copy
fsynced) and register with one nsqlookupd. pynsq's ``nsq.Writer``, nsqpy's ``Producer`` and
HTTP ``/pub``/``/mpub`` publish to each node; then one node is lost (SIGKILL, its data path
deleted, never restarted) while its messages are still queued and in flight. A pynsq Reader,
an ansq Reader, nsqpy's ``Consumer``, a gnsq ``Consumer`` and an nsqjs ``Reader`` (these two
as subprocesses, script_clients.py), each given only the lookupd address and each on its own
channel, must still get every published body: the lost node's unfinished ones from the
survivors that took them over (possibly twice: both survivors held a copy).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import ansq
import pytest
from ansq.tcp.types import ConnectionFeatures

from nsqpy.client import Consumer, Message, Producer
from nsqpy.testing import DaemonProcess, start_nsqd, start_nsqlookupd

from ..raw_v2 import free_port, unique, wait_for_async
from .conftest import FAST_SCAN
from .helpers import channel_view, http_post, lookup_tcp_ports, tcp_address
from .pynsq_harness import PynsqClients, answer
from .script_clients import KINDS as SCRIPT_KINDS
from .script_clients import Delivery, ScriptClient, run_script

SIZE = 3
LOST = 2  # the index of the node that is lost
#: each client finishes this many of the lost node's messages, then holds the rest in flight
FINISH_FIRST = 5
PER_METHOD = 10  # bodies each publishing method sends to each node
#: three methods to every node, then again to each survivor
PUBLISHED = 3 * PER_METHOD * (2 * SIZE - 1)
LOOKUPD_CHANNELS = ("pynsq", "ansq", "nsqpy", *SCRIPT_KINDS)
#: a Consumer connected straight to one surviving node, not through nsqlookupd: the one that
#: takes over the lost node's messages, the first survivor by address (docs/replication.md)
DIRECT_CHANNEL = "direct"
CHANNELS = (*LOOKUPD_CHANNELS, DIRECT_CHANNEL)
#: When one of an ansq Reader's connections closes, ansq empties the queue its connections
#: share: messages other nsqd delivered and the reader had not yet yielded are dropped
#: unanswered, and with RDY 1 per connection each of those holds its connection until nsqd
#: times it out. A short msg_timeout (IDENTIFY) brings them back within seconds.
ANSQ_OPTIONS = ansq.ConnectionOptions(features=ConnectionFeatures(msg_timeout=3000))


class ReplicatedGroup:
    """Three nsqd that name one another as --replica-peer, registered with one nsqlookupd."""

    def __init__(self, base: Path, lookupd: DaemonProcess) -> None:
        self.base = base
        self.lookupd = lookupd
        self.ports = [free_port() for _ in range(SIZE)]
        self.nodes: list[DaemonProcess] = []
        self.lost: set[int] = set()

    def address(self, index: int) -> str:
        return f"127.0.0.1:{self.ports[index]}"

    def data_path(self, index: int) -> Path:
        return self.base / f"node{index}"

    def start(self) -> None:
        for index in range(SIZE):
            peers = [f"--replica-peer={self.address(i)}" for i in range(SIZE) if i != index]
            self.data_path(index).mkdir()
            node = start_nsqd(
                self.data_path(index),
                f"--tcp-address={self.address(index)}",
                *peers,
                "--replica-acks=2",
                "--replica-timeout=1s",
                f"--node-id={index + 1}",  # distinct message IDs across the group
                "--mem-queue-size=0",
                "--sync-every=1",
                f"--lookupd-tcp-address={tcp_address(self.lookupd)}",
                FAST_SCAN,
            )
            self.nodes.append(node)

    def lose(self, index: int) -> None:
        """SIGKILL the node and delete its data path; it is not restarted."""
        self.nodes[index].kill()
        shutil.rmtree(self.data_path(index))
        self.lost.add(index)

    def survivors(self) -> list[DaemonProcess]:
        return [node for i, node in enumerate(self.nodes) if i not in self.lost]

    def stop(self) -> list[DaemonProcess]:
        """Stop every survivor; return those that had died on their own."""
        crashed = [n for n in self.survivors() if n.proc is not None and n.proc.poll() is not None]
        for node in self.survivors():
            node.stop()
        return crashed


@pytest.fixture
def nsqlookupd() -> Iterator[DaemonProcess]:
    daemon = start_nsqlookupd()
    yield daemon
    daemon.stop()


@pytest.fixture
def group(tmp_path: Path, nsqlookupd: DaemonProcess) -> Iterator[ReplicatedGroup]:
    replicated = ReplicatedGroup(tmp_path, nsqlookupd)
    try:
        replicated.start()
        yield replicated
    finally:
        crashed = replicated.stop()
    assert not crashed, "nsqd died during the test:\n" + "\n\n".join(n.log for n in crashed)


def peers_connected(node: DaemonProcess) -> bool:
    with urllib.request.urlopen(f"{node.http_url}/stats?format=json", timeout=5) as response:
        peers = json.loads(response.read())["replication"]["peers"]
    return len(peers) == SIZE - 1 and all(peer["state"] == "connected" for peer in peers)


def has_channels(node: DaemonProcess, topic: str) -> bool:
    return all(channel_view(node, topic, channel) for channel in CHANNELS)


async def wait_producers(
    lookupd: DaemonProcess, topic: str, nodes: Sequence[DaemonProcess]
) -> None:
    ports = sorted(node.tcp_port for node in nodes)
    await wait_for_async(
        partial(lookup_tcp_ports, lookupd, topic),
        lambda found: found == ports,
        timeout=10.0,
        what=f"nsqlookupd naming {ports} for {topic}",
    )


async def prepare_topic(group: ReplicatedGroup, topic: str) -> None:
    """The topic and every channel, created on one node, exist on all and are registered."""
    for node in group.nodes:
        await wait_for_async(partial(peers_connected, node), bool, 15.0, "every link connected")
    http_post(group.nodes[0], "/topic/create", topic=topic)
    for channel in CHANNELS:
        http_post(group.nodes[0], "/channel/create", topic=topic, channel=channel)
    for node in group.nodes:
        await wait_for_async(partial(has_channels, node, topic), bool, 10.0, "group-wide channels")
    await wait_producers(group.lookupd, topic, group.nodes)


def bodies(tag: str, count: int = PER_METHOD) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(count)]


async def publish_with_every_client(
    pynsq: PynsqClients, node: DaemonProcess, topic: str, tag: str
) -> list[bytes]:
    """pynsq PUB and MPUB, nsqpy Producer PUB and MPUB, HTTP /pub and /mpub, to one node."""
    half = PER_METHOD // 2
    writer = await pynsq.writer(node)
    by_pynsq = bodies(f"{tag}-pynsq")
    for body in by_pynsq[:half]:
        assert await answer(partial(writer.pub, topic, body)) == b"OK"
    assert await answer(partial(writer.mpub, topic, by_pynsq[half:])) == b"OK"
    by_producer = bodies(f"{tag}-producer")
    async with Producer(tcp_address(node)) as producer:
        for body in by_producer[:half]:
            await producer.publish(topic, body)
        await producer.multi_publish(topic, by_producer[half:])
    by_http = bodies(f"{tag}-http")
    for body in by_http[:half]:
        assert http_post(node, "/pub", body, topic=topic) == b"OK"
    assert http_post(node, "/mpub", b"\n".join(by_http[half:]), topic=topic) == b"OK"
    return by_pynsq + by_producer + by_http


@dataclass
class Tally:
    """What one consumer received and finished. Until the node is lost it finishes
    FINISH_FIRST of that node's messages and holds the next ones in flight, never answered:
    only a finished delivery counts as the body being got."""

    name: str
    lost_prefix: bytes
    loss: asyncio.Event
    delivered: Counter[bytes] = field(default_factory=Counter)
    finished: set[bytes] = field(default_factory=set)
    from_lost_node: int = 0
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    def receive(self, body: bytes) -> bool:
        """Count a delivery of ``body``; True: hold it unanswered, False: finish it."""
        self.delivered[body] += 1
        self.progress.set()
        if not self.loss.is_set() and body.startswith(self.lost_prefix):
            self.from_lost_node += 1
            if self.from_lost_node > FINISH_FIRST:
                return True
        self.finished.add(body)
        return False

    def record(self, delivery: Delivery) -> None:
        """Count a delivery a script client received and answered as it reports: it holds
        the lost node's messages by the same rule as :meth:`receive`."""
        self.delivered[delivery.body] += 1
        self.progress.set()
        if not self.loss.is_set() and delivery.body.startswith(self.lost_prefix):
            self.from_lost_node += 1
        if delivery.action == "fin":
            self.finished.add(delivery.body)

    def missing(self, expected: Sequence[bytes]) -> list[bytes]:
        return [body for body in expected if body not in self.finished]

    def report(self, expected: Sequence[bytes]) -> str:
        duplicates = {body: n - 1 for body, n in self.delivered.items() if n > 1}
        lost_dups = sum(n for body, n in duplicates.items() if body.startswith(self.lost_prefix))
        return (
            f"{self.name}: {sum(self.delivered.values())} deliveries, "
            f"{len(self.finished)} distinct finished of {len(expected)} published, "
            f"{sum(duplicates.values())} duplicates ({lost_dups} of the lost node's)"
        )


async def wait_all(tallies: Sequence[Tally], expected: Sequence[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for tally in tallies:
        while tally.missing(expected):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = tally.missing(expected)
                raise AssertionError(f"{tally.name} never got {len(missing)}: {missing[:10]}")
            tally.progress.clear()
            try:
                await asyncio.wait_for(tally.progress.wait(), min(left, 0.5))
            except TimeoutError:
                pass


async def wait_held(tallies: Sequence[Tally]) -> None:
    """Every consumer finished FINISH_FIRST of the lost node's messages and holds one more."""
    await wait_for_async(
        lambda: [t.from_lost_node for t in tallies],
        lambda counts: all(count > FINISH_FIRST for count in counts),
        timeout=15.0,
        what="every consumer holding a message of the node to lose",
    )


def pynsq_consumer(pynsq: PynsqClients, lookupd: DaemonProcess, topic: str, tally: Tally) -> None:
    held: list[Any] = []

    def handler(message: Any) -> bool | None:
        if tally.receive(message.body):
            message.enable_async()  # pynsq sends neither FIN nor REQ for it
            held.append(message)
            return None
        return True

    pynsq.reader(
        None,
        topic,
        tally.name,
        handler,
        lookupd_http_addresses=[f"http://{lookupd.http}"],
        lookupd_poll_interval=1,  # seconds, pynsq's minimum
        max_in_flight=10,
    )


async def ansq_consume(reader: Any, tally: Tally) -> None:
    async for message in reader.messages():
        if not tally.receive(message.body):
            await message.fin()


def nsqpy_consumer(tally: Tally, topic: str, **discovery: Any) -> Consumer:
    """nsqpy's Consumer; ``discovery``: ``lookupd_http_addresses`` or ``nsqd_tcp_addresses``."""

    def handler(message: Message) -> None:
        if tally.receive(message.body):
            message.disable_auto_response()  # left unanswered

    return Consumer(
        topic,
        tally.name,
        handler,
        lookupd_poll_interval=1.0,
        max_in_flight=6,  # below the lost node's backlog: some stay queued there
        **discovery,
    )


async def script_consumer(
    kind: str, lookupd: DaemonProcess, topic: str, tally: Tally
) -> ScriptClient:
    """gnsq's or nsqjs's script on channel ``kind`` through nsqlookupd: until released it holds
    the lost node's messages after finishing FINISH_FIRST; it exits once it finished all."""
    return await run_script(
        kind,
        "read",
        *("--lookupd", f"http://{lookupd.http}", "--topic", topic, "--channel", tally.name),
        *("--count", str(PUBLISHED), "--timeout", "60", "--max-in-flight", "6"),
        *("--lookupd-poll-interval", "1"),  # seconds, nsqjs's minimum
        *("--hold-prefix", tally.lost_prefix.decode(), "--finish-first", str(FINISH_FIRST)),
        on_delivery=tally.record,
    )


def unfinished(node: DaemonProcess, topic: str, channel: str) -> tuple[int, int]:
    view = channel_view(node, topic, channel)
    return view["depth"], view["in_flight_count"]


@pytest.fixture
async def ansq_closer() -> AsyncIterator[list[Any]]:
    readers: list[Any] = []
    yield readers
    for reader in readers:
        await reader.close()


async def test_lookupd_consumers_get_every_message_after_a_node_is_lost(
    group: ReplicatedGroup, pynsq: PynsqClients, ansq_closer: list[Any]
) -> None:
    topic = unique("replicated")
    await prepare_topic(group, topic)
    published: dict[str, list[bytes]] = {}
    for index, node in enumerate(group.nodes):
        published[f"n{index}"] = await publish_with_every_client(pynsq, node, topic, f"n{index}")

    loss = asyncio.Event()
    tallies = [Tally(name, f"n{LOST}-".encode(), loss) for name in LOOKUPD_CHANNELS]
    pynsq_tally, ansq_tally, nsqpy_tally, *script_tallies = tallies
    direct_tally = Tally(DIRECT_CHANNEL, f"n{LOST}-".encode(), loss)
    survivors = [index for index in range(SIZE) if index != LOST]
    direct_node = min(survivors, key=lambda index: group.ports[index])
    pynsq_consumer(pynsq, group.lookupd, topic, pynsq_tally)
    reader = await ansq.create_reader(
        topic=topic,
        channel=ansq_tally.name,
        lookupd_http_addresses=[group.lookupd.http],
        lookupd_poll_interval=1000,  # milliseconds
        connection_options=ANSQ_OPTIONS,
    )
    ansq_closer.append(reader)
    ansq_task = asyncio.create_task(ansq_consume(reader, ansq_tally))
    consumers = [
        nsqpy_consumer(nsqpy_tally, topic, lookupd_http_addresses=[group.lookupd.http]),
        nsqpy_consumer(direct_tally, topic, nsqd_tcp_addresses=[group.address(direct_node)]),
    ]
    for consumer in consumers:
        await consumer.start()
    scripts: list[ScriptClient] = []
    try:
        for kind, tally in zip(SCRIPT_KINDS, script_tallies, strict=True):
            scripts.append(await script_consumer(kind, group.lookupd, topic, tally))
        await wait_held(tallies)
        lost_node = group.nodes[LOST]
        for channel in LOOKUPD_CHANNELS:
            depth, in_flight = unfinished(lost_node, topic, channel)
            assert depth > 0 and in_flight > 0, (channel, depth, in_flight)
        loss.set()
        for script in scripts:
            script.release()
        group.lose(LOST)
        await wait_producers(group.lookupd, topic, group.survivors())

        # the survivors still take publishes (acks 2 of the two left) from every client
        for index in range(SIZE):
            if index != LOST:
                node = group.nodes[index]
                tag = f"after{index}"
                published[tag] = await publish_with_every_client(pynsq, node, topic, tag)

        # the lost node's unfinished messages come from the survivors after --replica-timeout
        everything = [body for batch in published.values() for body in batch]
        await wait_all(tallies, everything, timeout=25.0)
        # straight to one node: its own messages and the lost node's it took over, no others
        direct_tags = (f"n{direct_node}", f"after{direct_node}", f"n{LOST}")
        through_direct = [body for tag in direct_tags for body in published[tag]]
        await wait_all([direct_tally], through_direct, timeout=10.0)
        for script in scripts:  # each ends by itself once it finished every body
            assert await script.wait(timeout=10.0) == 0, script.explain()
    finally:
        for script in scripts:
            await script.stop()
        ansq_task.cancel()
        for consumer in consumers:
            await consumer.close(timeout=2.0)
    for tally in tallies:
        print(tally.report(everything))
    print(direct_tally.report(through_direct))
    other_survivors = [
        body for tag in published if tag not in direct_tags for body in published[tag]
    ]
    assert other_survivors and not set(other_survivors) & set(direct_tally.delivered)
