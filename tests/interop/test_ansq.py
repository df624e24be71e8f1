"""ansq (an asyncio NSQ client) publishing and consuming through nsqpy."""

from __future__ import annotations

import asyncio
import time

import ansq
from ansq.tcp.connection import NSQConnection
from ansq.tcp.types import ConnectionFeatures, ConnectionOptions, NSQMessage
from ansq.typedefs import TCPResponse

from nsqpy.testing import DaemonProcess

from ..raw_v2 import unique
from .helpers import only_client, tcp_address, topic_stats, wait_channel


def assert_ok(response: TCPResponse) -> None:
    assert response is not None and response.is_ok, response


async def next_message(conn: NSQConnection, timeout: float = 5.0) -> NSQMessage:
    message = await asyncio.wait_for(conn.wait_for_message(), timeout)
    assert message is not None, "ansq connection closed"
    return message


async def test_open_connection_pub_mpub_dpub_then_req_touch_fin(nsqd: DaemonProcess) -> None:
    topic, channel = unique("ansq_conn"), "low_level"
    host, port = nsqd.tcp_address
    producer = await ansq.open_connection(host, port)
    consumer = await ansq.open_connection(host, port)
    try:
        assert_ok(await producer.pub(topic, b"one"))
        assert_ok(await producer.mpub(topic, b"two", b"three"))
        dpub_sent = time.monotonic()
        assert_ok(await producer.dpub(topic, b"later", 200))
        assert topic_stats(nsqd, topic)["message_count"] == 4

        await consumer.subscribe(topic, channel, messages_count=4)
        first = [await next_message(consumer) for _ in range(3)]
        assert [m.body for m in first] == [b"one", b"two", b"three"]  # one in-memory queue
        assert {m.attempts for m in first} == {1}
        one, two, three = first

        await one.req(0)  # back at once, one attempt more
        await two.touch()
        await two.fin()
        await three.fin()

        # The REQ'd message and the deferred one, in either order (both may be due by now).
        rest: dict[bytes, NSQMessage] = {}
        for _ in range(2):
            message = await next_message(consumer)
            rest[message.body] = message
            if message.body == b"later":
                assert time.monotonic() - dpub_sent >= 0.18  # DPUB 200 ms; never early
        assert sorted(rest) == [b"later", b"one"]
        assert (rest[b"one"].attempts, rest[b"one"].id) == (2, one.id)
        assert rest[b"later"].attempts == 1
        for message in rest.values():
            await message.fin()

        stats = await wait_channel(
            nsqd,
            topic,
            channel,
            message_count=4,
            requeue_count=1,
            clients_finish_count=4,
            timeout_count=0,
            in_flight_count=0,
            deferred_count=0,
            depth=0,
        )
        client = only_client(stats)
        assert client["user_agent"].startswith("ansq/")
        assert (client["ready_count"], client["message_count"]) == (4, 5)
    finally:
        await producer.close()
        await consumer.close()


async def test_touch_holds_a_message_past_its_negotiated_msg_timeout(nsqd: DaemonProcess) -> None:
    """ansq IDENTIFYs msg_timeout (1000 ms is nsqd's minimum); TOUCH restarts that clock."""
    topic, channel = unique("ansq_touch"), "slow"
    host, port = nsqd.tcp_address
    options = ConnectionOptions(features=ConnectionFeatures(msg_timeout=1000))
    consumer = await ansq.open_connection(host, port, connection_options=options)
    producer = await ansq.open_connection(host, port)
    try:
        assert_ok(await producer.mpub(topic, b"touched", b"untouched"))
        await consumer.subscribe(topic, channel, messages_count=2)
        touched, untouched = [await next_message(consumer) for _ in range(2)]
        assert (touched.body, untouched.body) == (b"touched", b"untouched")

        for _ in range(4):  # 1.2 s in all, past the 1 s timeout, a TOUCH every 0.3 s
            await asyncio.sleep(0.3)
            await touched.touch()
        # The untouched one timed out meanwhile and was delivered again.
        redelivered = await next_message(consumer)
        assert (redelivered.body, redelivered.attempts) == (b"untouched", 2)
        await touched.fin()
        await redelivered.fin()

        await wait_channel(
            nsqd,
            topic,
            channel,
            timeout_count=1,
            clients_finish_count=2,
            in_flight_count=0,
            depth=0,
        )
    finally:
        await producer.close()
        await consumer.close()


async def test_create_writer_and_create_reader(nsqd: DaemonProcess) -> None:
    topic, channel = unique("ansq_rw"), "high_level"
    writer = await ansq.create_writer(nsqd_tcp_addresses=[tcp_address(nsqd)])
    reader = await ansq.create_reader(
        topic=topic, channel=channel, nsqd_tcp_addresses=[tcp_address(nsqd)]
    )
    try:
        expected = [b"pub-%d" % i for i in range(10)]
        for body in expected:
            assert_ok(await writer.pub(topic, body))
        batch = [b"mpub-%d" % i for i in range(10)]
        assert_ok(await writer.mpub(topic, *batch))
        assert_ok(await writer.dpub(topic, b"dpub", 100))
        expected += [*batch, b"dpub"]

        async def read_all() -> list[bytes]:
            bodies: list[bytes] = []
            async for message in reader.messages():
                assert message.attempts == 1
                bodies.append(message.body)
                await message.fin()
                if len(bodies) == len(expected):
                    break
            return bodies

        bodies = await asyncio.wait_for(read_all(), 10)
        assert sorted(bodies) == sorted(expected)
        stats = await wait_channel(
            nsqd,
            topic,
            channel,
            message_count=len(expected),
            clients_finish_count=len(expected),
            in_flight_count=0,
            depth=0,
            deferred_count=0,
        )
        assert only_client(stats)["ready_count"] == 1  # ansq keeps RDY 1 per connection
    finally:
        await writer.close()
        await reader.close()
