"""``POST /client/kick`` (nsqpy, nsqio/nsq#418) against a real nsqd: one connection closed,
its in-flight messages requeued on their timeout as on any disconnect, the others untouched."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from nsqpy.testing import DaemonProcess

from ..raw_v2 import NsqConn, channel_stats, http_request, q, unique, wait_until
from .nsqd_storage_support import launch


def clients_of(nsqd: DaemonProcess, topic: str, channel: str) -> list[dict[str, object]]:
    found = channel_stats(nsqd, topic, channel)
    return list((found or {}).get("clients") or [])


def consumer(nsqd: DaemonProcess, topic: str, channel: str, client_id: str) -> NsqConn:
    conn = NsqConn(nsqd.tcp_address)
    # msg_timeout 3 s: the kicked client's in-flight messages come back soon after the kick
    # (and none times out before it, which would redeliver them to the same client)
    conn.identify(client_id=client_id, hostname=f"{client_id}.example", msg_timeout=3000)
    conn.sub(topic, channel)
    return conn


def local_address(conn: NsqConn) -> str:
    """The connection's ``ip:port`` as nsqd's /stats shows it (``remote_address``)."""
    host, port = conn.sock.getsockname()[:2]
    return f"{host}:{port}"


def kick(nsqd: DaemonProcess, **params: str) -> tuple[int, object]:
    resp = http_request(nsqd, "POST", "/client/kick?" + q(**params))
    return resp.status, json.loads(resp.body) if resp.body else None


def test_kick_by_remote_address_requeues_in_flight(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(daemons, tmp_path, "--queue-scan-interval=20ms")
    topic = unique("kick")
    NsqConn(nsqd.tcp_address).mpub(topic, [b"m%d" % i for i in range(5)])
    bad = consumer(nsqd, topic, "work", "stuck")
    good = consumer(nsqd, topic, "work", "healthy")
    bad.rdy(3)
    taken = [bad.expect_message() for _ in range(3)]
    wait_until(lambda: channel_stats(nsqd, topic, "work")["in_flight_count"] == 3)  # type: ignore[index]
    listed = {c["client_id"]: c for c in clients_of(nsqd, topic, "work")}
    address = str(listed["stuck"]["remote_address"])
    assert address == local_address(bad)

    status, body = kick(nsqd, remote_address=address, topic=topic, channel="work")
    assert status == 200, body
    assert body == {
        "clients": [{"client_id": "stuck", "remote_address": address, "in_flight_count": 3}]
    }
    bad.expect_closed()
    wait_until(
        lambda: [c["client_id"] for c in clients_of(nsqd, topic, "work")] == ["healthy"],
        what="the kicked client gone from /stats",
    )
    # As on any disconnect: the 3 stay in flight until their 3 s timeout, then are requeued.
    wait_until(
        lambda: (channel_stats(nsqd, topic, "work") or {}).get("timeout_count") == 3,
        timeout=15,
        what="the kicked client's messages timed out and requeued",
    )
    after = channel_stats(nsqd, topic, "work")
    assert after is not None
    assert after["in_flight_count"] == 0
    assert after["depth"] == 5
    # ... and the healthy consumer gets all five, the three the kicked one held among them.
    good.rdy(5)
    redelivered = {good.expect_message().body for _ in range(5)}
    assert {m.body for m in taken} <= redelivered
    assert good.is_open()
    good.close()


def test_kick_by_client_id_closes_each_of_its_connections(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(daemons, tmp_path)
    topic = unique("kickid")
    first = consumer(nsqd, topic, "a", "dup")
    second = consumer(nsqd, topic, "b", "dup")
    other = consumer(nsqd, topic, "a", "other")

    status, body = kick(nsqd, client_id="dup")
    assert status == 200
    assert isinstance(body, dict)
    assert sorted(c["remote_address"] for c in body["clients"]) == sorted(
        local_address(c) for c in (first, second)
    )
    first.expect_closed()
    second.expect_closed()
    assert other.is_open()
    other.close()


def test_kick_errors(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    nsqd = launch(daemons, tmp_path)
    topic = unique("kickerr")
    conn = consumer(nsqd, topic, "work", "only")
    address = local_address(conn)

    assert kick(nsqd) == (400, {"message": "MISSING_ARG_CLIENT"})
    assert kick(nsqd, remote_address="") == (400, {"message": "MISSING_ARG_CLIENT"})
    assert kick(nsqd, remote_address="127.0.0.1:1") == (404, {"message": "CLIENT_NOT_FOUND"})
    assert kick(nsqd, client_id="nobody") == (404, {"message": "CLIENT_NOT_FOUND"})
    # The right address on another channel or topic is not a match.
    assert kick(nsqd, remote_address=address, topic=topic, channel="other") == (
        404,
        {"message": "CLIENT_NOT_FOUND"},
    )
    assert kick(nsqd, remote_address=address, topic=unique("x"))[0] == 404
    assert kick(nsqd, remote_address=address, topic="bad topic!") == (
        400,
        {"message": "INVALID_TOPIC"},
    )
    assert kick(nsqd, remote_address=address, channel="bad channel!") == (
        400,
        {"message": "INVALID_CHANNEL"},
    )
    assert http_request(nsqd, "GET", "/client/kick?" + q(remote_address=address)).status == 405
    assert conn.is_open()  # none of the refused requests touched it
    # Both criteria must match.
    assert kick(nsqd, remote_address=address, client_id="someone-else")[0] == 404
    assert kick(nsqd, remote_address=address, client_id="only")[0] == 200
    conn.expect_closed()
    wait_until(lambda: clients_of(nsqd, topic, "work") == [], what="the client gone from /stats")


def test_kick_closes_a_client_that_stopped_reading(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    """The misbehaving client is often one that no longer reads: nsqd's writes to it are
    stuck in full socket buffers. The kick must not wait for them to drain."""
    nsqd = launch(daemons, tmp_path)
    topic = unique("kickstuck")
    body = b"x" * 500_000
    publisher = NsqConn(nsqd.tcp_address)
    for _ in range(8):
        publisher.mpub(topic, [body] * 4)
    stuck = consumer(nsqd, topic, "work", "deaf")
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.rdy(32)  # and never reads again: 16 MB cannot fit in the socket buffers
    wait_until(
        lambda: (channel_stats(nsqd, topic, "work") or {}).get("in_flight_count", 0) > 0,
        what="deliveries started",
    )
    status, _ = kick(nsqd, client_id="deaf")
    assert status == 200
    wait_until(lambda: clients_of(nsqd, topic, "work") == [], what="the deaf client gone")
    assert publisher.is_open()
    stuck.close()
