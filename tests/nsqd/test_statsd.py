"""nsqd pushes stats to statsd over UDP, as Go: ``<prefix><stat>:<value>|c`` (counters, deltas
since the last push) and ``|g`` (gauges) lines, packed into datagrams of at most
``--statsd-udp-packet-size`` bytes without splitting a line."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd

PACKET_SIZE = 120


@pytest.fixture
def statsd() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    yield sock
    sock.close()


def publish(nsqd: DaemonProcess, topic: str, count: int) -> None:
    body = b"\n".join(b"m%d" % i for i in range(count))
    url = f"{nsqd.http_url}/mpub?topic={topic}"
    urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST")).read()


def receive_push(sock: socket.socket, seconds: float) -> list[bytes]:
    """Datagrams of one push (the push ends when a gap follows its last datagram)."""
    datagrams: list[bytes] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            datagrams.append(sock.recv(65536))
        except TimeoutError:
            if datagrams:
                break
    return datagrams


def lines_of(datagrams: list[bytes]) -> dict[str, str]:
    stats: dict[str, str] = {}
    for datagram in datagrams:
        for line in datagram.decode().splitlines():
            name, _, value = line.partition(":")
            stats[name] = value
    return stats


def test_counters_are_deltas_and_gauges_are_values(tmp_path: Path, statsd: socket.socket) -> None:
    port = statsd.getsockname()[1]
    nsqd = start_nsqd(
        tmp_path,
        f"--statsd-address=127.0.0.1:{port}",
        "--statsd-interval=1s",
        f"--statsd-udp-packet-size={PACKET_SIZE}",
        "--statsd-prefix=nsq.%s",
    )
    try:
        urllib.request.urlopen(
            urllib.request.Request(f"{nsqd.http_url}/topic/create?topic=t", method="POST")
        ).read()
        urllib.request.urlopen(
            urllib.request.Request(
                f"{nsqd.http_url}/channel/create?topic=t&channel=c", method="POST"
            )
        ).read()
        publish(nsqd, "t", 5)
        first = receive_push(statsd, 5.0)
        assert first, "no datagram from nsqd"
        assert all(len(d) <= PACKET_SIZE for d in first)
        assert all(d.endswith(b"\n") for d in first)  # a line is never split
        prefix = f"nsq.127_0_0_1_{nsqd.http_port}."
        stats = lines_of(first)
        assert stats[prefix + "topic.t.message_count"] == "5|c"
        assert stats[prefix + "topic.t.channel.c.message_count"] == "5|c"
        assert stats[prefix + "topic.t.channel.c.depth"] == "5|g"
        assert stats[prefix + "topic.t.channel.c.clients"] == "0|g"
        assert prefix + "mem.gc_runs" in stats

        publish(nsqd, "t", 2)
        second = lines_of(receive_push(statsd, 5.0))
        assert second[prefix + "topic.t.message_count"] == "2|c"  # the delta since the last push
        assert second[prefix + "topic.t.channel.c.depth"] == "7|g"
    finally:
        nsqd.stop()


def test_exclude_ephemeral(tmp_path: Path, statsd: socket.socket) -> None:
    port = statsd.getsockname()[1]
    nsqd = start_nsqd(
        tmp_path,
        f"--statsd-address=127.0.0.1:{port}",
        "--statsd-interval=1s",
        "--statsd-exclude-ephemeral",
        "--statsd-mem-stats=false",
    )
    try:
        publish(nsqd, "keep", 1)
        publish(nsqd, "gone#ephemeral", 1)
        stats = lines_of(receive_push(statsd, 5.0))
        names = " ".join(stats)
        assert "topic.keep.message_count" in names
        assert "ephemeral" not in names
        assert "mem." not in names
    finally:
        nsqd.stop()
