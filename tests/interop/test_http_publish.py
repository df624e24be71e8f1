"""Messages published over nsqd's HTTP API, consumed by pynsq and ansq over TCP."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import ansq
from ansq.http import NSQDHTTPWriter

from nsqpy.testing import DaemonProcess

from ..raw_v2 import unique
from .helpers import ansq_read, http_post, only_client, tcp_address, topic_stats, wait_channel
from .pynsq_harness import PynsqClients


def binary_mpub(bodies: list[bytes]) -> bytes:
    """The ``/mpub?binary=true`` body: BE32 count, then BE32 size + bytes for each message."""
    parts = [struct.pack(">i", len(bodies))]
    parts += [struct.pack(">i", len(body)) + body for body in bodies]
    return b"".join(parts)


async def test_http_pub_mpub_deferred_fan_out_to_pynsq_and_ansq_channels(
    nsqd: DaemonProcess, pynsq: PynsqClients
) -> None:
    topic = unique("http_pub")
    # Both channels exist before the first publish, so each gets every message.
    http_post(nsqd, "/topic/create", topic=topic)
    for channel in ("pynsq", "ansq"):
        http_post(nsqd, "/channel/create", topic=topic, channel=channel)

    assert http_post(nsqd, "/pub", b"single", topic=topic) == b"OK"
    assert http_post(nsqd, "/mpub", b"line-1\nline-2\nline-3", topic=topic) == b"OK"
    binary = [b"bin\n1", b"bin\x002\r\n"]  # newlines and NULs survive a binary MPUB
    assert http_post(nsqd, "/mpub", binary_mpub(binary), topic=topic, binary="true") == b"OK"
    assert http_post(nsqd, "/pub", b"deferred", topic=topic, defer="150") == b"OK"
    expected = [b"single", b"line-1", b"line-2", b"line-3", *binary, b"deferred"]
    assert topic_stats(nsqd, topic)["message_count"] == len(expected)

    pynsq_bodies: list[bytes] = []
    pynsq_done = asyncio.get_running_loop().create_future()

    def handler(message: Any) -> bool:
        pynsq_bodies.append(message.body)
        if len(pynsq_bodies) == len(expected):
            pynsq_done.set_result(None)
        return True

    pynsq.reader(nsqd, topic, "pynsq", handler, max_in_flight=5)
    reader = await ansq.create_reader(
        topic=topic, channel="ansq", nsqd_tcp_addresses=[tcp_address(nsqd)]
    )
    try:
        ansq_bodies = await asyncio.wait_for(ansq_read(reader, len(expected)), 10)
        await asyncio.wait_for(pynsq_done, 10)
    finally:
        await reader.close()

    assert sorted(pynsq_bodies) == sorted(expected)
    assert sorted(ansq_bodies) == sorted(expected)
    for channel in ("pynsq", "ansq"):
        await wait_channel(
            nsqd,
            topic,
            channel,
            message_count=len(expected),
            in_flight_count=0,
            deferred_count=0,
            depth=0,
            requeue_count=0,
        )


async def test_ansq_http_writer_publishes_and_reads_info_and_stats(nsqd: DaemonProcess) -> None:
    topic, channel = unique("ansq_http"), "readers"
    host, port = nsqd.http_address
    http = NSQDHTTPWriter(host, port)
    reader = None
    try:
        assert await http.ping() == "OK"
        info = await http.info()
        assert isinstance(info, dict)
        assert (info["version"], info["tcp_port"], info["http_port"]) == (
            "1.3.0",
            nsqd.tcp_port,
            port,
        )
        await http.create_topic(topic)
        await http.create_channel(topic, channel)
        assert await http.pub(topic, "hello") == "OK"
        assert await http.mpub(topic, "a", "b", "c") == "OK"  # ansq joins them with newlines

        stats = await http.stats()
        assert isinstance(stats, dict)
        (topic_entry,) = [t for t in stats["topics"] if t["topic_name"] == topic]
        assert topic_entry["message_count"] == 4
        assert [c["channel_name"] for c in topic_entry["channels"]] == [channel]

        reader = await ansq.create_reader(
            topic=topic, channel=channel, nsqd_tcp_addresses=[tcp_address(nsqd)]
        )
        bodies = await asyncio.wait_for(ansq_read(reader, 4), 10)
        assert sorted(bodies) == [b"a", b"b", b"c", b"hello"]
        channel_entry = await wait_channel(
            nsqd, topic, channel, clients_finish_count=4, in_flight_count=0, depth=0
        )
        assert only_client(channel_entry)["user_agent"].startswith("ansq/")
    finally:
        if reader is not None:
            await reader.close()
        await http.close()
