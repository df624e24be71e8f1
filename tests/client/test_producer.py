"""Producer: pipelining and failover (scripted fake nsqd), publishing to a real nsqd."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from nsqpy.client import (
    Consumer,
    HTTPPublishError,
    Message,
    NoConnectionsError,
    Producer,
    ServerError,
    http_multi_publish,
    http_publish,
)
from nsqpy.protocol.commands import parse_mpub_body
from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import wait_until_async
from .daemons import stats, tcp
from .fake_nsqd import FakeNsqd, Step, close, error, identify_response, respond, wait_for


def producer_handshake() -> list[Step]:
    return [wait_for(b"IDENTIFY"), identify_response()]


# ---------------------------------------------------------------------- scripted


async def test_publishes_pipeline_and_answers_match_in_order() -> None:
    first = [
        *producer_handshake(),
        wait_for(b"PUB", 3),  # all three are on the wire before any answer
        respond(b"OK"),
        error(b"E_BAD_MESSAGE PUB invalid message body size 0"),
        close(),
    ]
    second = [*producer_handshake(), wait_for(b"PUB"), respond(b"OK")]
    async with FakeNsqd(first, second) as fake:
        producer = Producer(fake.address)
        results = await asyncio.gather(
            producer.publish("t", b"one"),
            producer.publish("t", b"two"),
            producer.publish("t", b"three"),
            return_exceptions=True,
        )
        await producer.close()
    assert results[0] is None
    assert isinstance(results[1], ServerError) and results[1].code == "E_BAD_MESSAGE"
    # the third lost its connection before an answer, so it was sent again, on a new one
    assert results[2] is None
    assert fake.connections[0].bodies[b"PUB"] == [b"one", b"two", b"three"]
    assert fake.connections[1].bodies[b"PUB"] == [b"three"]


async def test_failover_to_the_next_nsqd_when_one_dies() -> None:
    dying = [*producer_handshake(), wait_for(b"PUB"), close()]
    healthy = [*producer_handshake(), wait_for(b"PUB"), respond(), wait_for(b"PUB", 2), respond()]
    async with FakeNsqd(dying) as a, FakeNsqd(healthy) as b:
        producer = Producer([a.address, b.address], reconnect_interval=30)
        await producer.publish("t", b"first")  # a dies without answering: b gets it
        await producer.publish("t", b"second")  # a is backing off: straight to b
        assert producer.connected_addresses == [b.address]
        await producer.close()
    assert a.connections[0].bodies[b"PUB"] == [b"first"]
    assert b.connections[0].bodies[b"PUB"] == [b"first", b"second"]
    # the retry turn reconnected to a once (the fake closes connections beyond its scripts)
    assert len(a.connections) <= 2


async def test_pub_failed_fails_over_but_bad_topic_does_not() -> None:
    a_script = [
        *producer_handshake(),
        wait_for(b"PUB", 1),
        error(b"E_PUB_FAILED PUB failed exiting"),
        close(),
    ]
    b_script = [
        *producer_handshake(),
        wait_for(b"PUB", 1),
        respond(),
        wait_for(b"PUB", 2),
        error(b"E_BAD_TOPIC PUB topic name is not valid"),
    ]
    async with FakeNsqd(a_script) as a, FakeNsqd(b_script) as b:
        producer = Producer([a.address, b.address], reconnect_interval=30)
        await producer.publish("t", b"x")
        with pytest.raises(ServerError) as info:
            await producer.publish("t", b"y")
        await producer.close()
    assert info.value.code == "E_BAD_TOPIC"
    assert b.connections[0].bodies[b"PUB"] == [b"x", b"y"]


async def test_refused_publish_reports_nsqds_error_not_the_closed_connection(
    tmp_path: Path,
) -> None:
    # a draining nsqd answers E_PUB_FAILED and closes; the retry turn then finds the
    # connection closed, which must not hide why nsqd refused
    with start_nsqd(tmp_path, "--drain-timeout=30s") as nsqd:
        async with aiohttp.ClientSession() as session:
            await session.post(f"{nsqd.http_url}/pub?topic=t", data=b"held")
            await session.post(f"{nsqd.http_url}/channel/create?topic=t&channel=c")
        nsqd.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        await wait_until_async(lambda: "draining" in nsqd.log, what="nsqd draining", timeout=10.0)
        producer = Producer(tcp(nsqd))
        with pytest.raises(NoConnectionsError) as info:
            await producer.publish("t", b"refused")
        await producer.close()
        nsqd.kill()
    cause = info.value.__cause__
    assert isinstance(cause, ServerError), repr(cause)
    assert cause.code == "E_PUB_FAILED"


async def test_no_reachable_nsqd() -> None:
    fake = await FakeNsqd().start()
    address = fake.address
    await fake.stop()
    producer = Producer(address)
    with pytest.raises(NoConnectionsError):
        await producer.publish("t", b"x")
    with pytest.raises(NoConnectionsError):
        await producer.connect()
    await producer.close()


async def test_mpub_and_dpub_wire_format() -> None:
    script = [*producer_handshake(), wait_for(b"DPUB"), respond(), respond()]
    async with FakeNsqd(script) as fake:
        async with Producer(fake.address) as producer:
            await asyncio.gather(
                producer.multi_publish("t", [b"a", b"bc"]),
                producer.deferred_publish("t", 1.5, b"later"),
            )
        conn = fake.connections[0]
    assert conn.lines[1:3] == [b"MPUB t", b"DPUB t 1500"]
    assert parse_mpub_body(conn.bodies[b"MPUB"][0], 100, 1000) == [b"a", b"bc"]
    assert conn.bodies[b"DPUB"] == [b"later"]


async def test_invalid_arguments_are_refused_locally() -> None:
    producer = Producer("127.0.0.1:1")
    with pytest.raises(ValueError):
        await producer.publish("bad topic!", b"x")
    with pytest.raises(ValueError):
        await producer.multi_publish("t", [])
    await producer.close()
    with pytest.raises(Exception, match="closed"):
        await producer.publish("t", b"x")


# ---------------------------------------------------------------------- real nsqd


@pytest.fixture
def nsqd(tmp_path: Path) -> Iterator[DaemonProcess]:
    daemon = start_nsqd(tmp_path)
    try:
        yield daemon
    finally:
        daemon.stop()


def topic_stats(nsqd: DaemonProcess, topic: str) -> dict[str, int]:
    topics = stats(nsqd, topic)["topics"] or []
    return {"message_count": topics[0]["message_count"], "depth": topics[0]["depth"]}


async def test_concurrent_publishes_share_one_connection(nsqd: DaemonProcess) -> None:
    async with Producer(tcp(nsqd)) as producer:
        await asyncio.gather(*(producer.publish("many", b"m%d" % i) for i in range(1000)))
        await producer.multi_publish("many", [b"x"] * 100)
        assert len(producer.connected_addresses) == 1
    assert topic_stats(nsqd, "many") == {"message_count": 1100, "depth": 1100}


async def test_pre_framed_mpub_publishes_every_message(nsqd: DaemonProcess) -> None:
    bodies = [b"one", b"two!", b"x" * 300]
    framed = b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
    async with Producer(tcp(nsqd)) as producer:
        await producer.multi_publish_encoded("framed", len(bodies), memoryview(framed))
        with pytest.raises(ValueError):  # fewer bytes than the count's size words
            await producer.multi_publish_encoded("framed", 4, framed[:12])
    assert topic_stats(nsqd, "framed") == {"message_count": 3, "depth": 3}


async def test_deferred_publish_arrives_after_the_delay(nsqd: DaemonProcess) -> None:
    arrived: list[float] = []
    consumer = Consumer(
        "deferred", "ch", lambda m: arrived.append(time.monotonic()), nsqd_tcp_addresses=[tcp(nsqd)]
    )
    async with consumer:
        await consumer.wait_connected()
        async with Producer(tcp(nsqd)) as producer:
            sent = time.monotonic()
            await producer.deferred_publish("deferred", 0.3, b"later")
        await wait_until_async(lambda: bool(arrived), what="the deferred message", timeout=10.0)
    assert arrived[0] - sent >= 0.29


async def test_http_publish_helpers(nsqd: DaemonProcess) -> None:
    received: list[bytes] = []

    def collect(msg: Message) -> None:
        received.append(msg.body)

    async with aiohttp.ClientSession() as session:
        await http_publish(nsqd.http_url, "http_t", b"one", session=session)
        await http_multi_publish(nsqd.http_url, "http_t", [b"two", b"th\nree"], session=session)
        await http_multi_publish(nsqd.http_url, "http_t", [b"four", b"five"], binary=False)
        host, port = nsqd.http_address
        await http_publish(f"{host}:{port}", "http_t", b"six", defer=0.05)
        with pytest.raises(ValueError):
            await http_publish(nsqd.http_url, "bad!topic", b"x", session=session)
    async with Consumer("http_t", "ch", collect, nsqd_tcp_addresses=[tcp(nsqd)], max_in_flight=10):
        await wait_until_async(lambda: len(received) == 6, what="six messages", timeout=10.0)
    assert sorted(received) == sorted([b"one", b"two", b"th\nree", b"four", b"five", b"six"])


async def test_http_errors_carry_nsqd_message(nsqd: DaemonProcess) -> None:
    with pytest.raises(HTTPPublishError) as info:
        await http_publish(nsqd.http_url, "t", b"")
    assert info.value.status == 400
    assert info.value.message == "MSG_EMPTY"
    with pytest.raises(ValueError):
        await http_multi_publish(nsqd.http_url, "t", [b"a\nb"], binary=False)


async def test_request_timeout_moves_on_from_a_paused_nsqd(tmp_path: Path) -> None:
    # found by the chaos harness: a SIGSTOPped nsqd keeps its socket open (and the kernel
    # still accepts new connections for it), so every publish that rotated onto it waited for
    # the connection's read timeout, or for a reconnect's IDENTIFY, while another nsqd was up
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    paused, live = start_nsqd(tmp_path / "a"), start_nsqd(tmp_path / "b")
    try:
        producer = Producer(
            [tcp(paused), tcp(live)],
            request_timeout=0.3,
            reconnect_interval=0.1,  # reconnects to the paused nsqd keep coming
            max_reconnect_interval=5,
            read_timeout=60,
        )
        await producer.connect()
        os.kill(paused.pid, signal.SIGSTOP)
        waited = 0.0  # in publish calls
        for i in range(80):  # over 4 s, so reconnects to the paused nsqd come due
            began = time.monotonic()
            await producer.publish("t", b"m%d" % i)
            waited += time.monotonic() - began
            await asyncio.sleep(0.05)
        assert producer.connected_addresses == [tcp(live)]
        await producer.close()
        os.kill(paused.pid, signal.SIGCONT)
        # the first publish after the pause waited out the timeout; reconnects then happen in
        # the background while the live nsqd takes the publishes (waiting on each one that
        # rotated onto the paused nsqd would take 40 x 0.3 s)
        assert waited < 1.0, waited
        assert topic_stats(live, "t")["message_count"] >= 80
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        paused.stop()
        live.stop()


async def test_request_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="request_timeout"):
        Producer("127.0.0.1:1", request_timeout=0)
