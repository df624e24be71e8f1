"""nsqadmin's kick action (nsqpy, nsqio/nsq#418): ``POST /api/topics/:t/:c/clients`` reaches
the nsqd holding the connection, closes that one client, and is audited like Go's actions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.raw_v2 import NsqConn

from ..raw_v2 import wait_until
from .conftest import Cluster, StartAdmin, api
from .test_actions import Receiver

OK = (200, {"message": ""})


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    try:
        yield running
    finally:
        running.close()


def subscribe(cluster: Cluster, node: int, topic: str, channel: str, client_id: str) -> NsqConn:
    conn = NsqConn(cluster.nsqds[node].tcp_address)
    conn.identify(client_id=client_id, hostname=f"{client_id}.example")
    conn.sub(topic, channel)
    return conn


def address_of(conn: NsqConn) -> str:
    host, port = conn.sock.getsockname()[:2]
    return f"{host}:{port}"


def client_ids(cluster: Cluster, node: int, topic: str, channel: str) -> list[str]:
    found = cluster.channel_stats(node, topic, channel) or {}
    return sorted(c["client_id"] for c in found.get("clients") or [])


def test_kick_closes_that_client_only_and_notifies(
    cluster: Cluster, start_admin: StartAdmin, receiver: Receiver
) -> None:
    topic = cluster.new_topic("kick")
    for index in (0, 1):
        cluster.create_channel(topic, "c", index)
    cluster.wait_registered(topic, 2)
    on_zero = subscribe(cluster, 0, topic, "c", "zero")
    target = subscribe(cluster, 1, topic, "c", "target")
    neighbour = subscribe(cluster, 1, topic, "c", "neighbour")
    admin = start_admin(f"--notification-http-endpoint={receiver.url}")
    status, listed = api(admin, "GET", f"/api/topics/{topic}/c")
    assert status == 200
    row = next(c for c in listed["clients"] if c["client_id"] == "target")
    node = cluster.nsqd_address(1)
    assert (row["node"], row["remote_address"]) == (node, address_of(target))

    body = {"action": "kick", "node": node, "remote_address": row["remote_address"]}
    assert api(admin, "POST", f"/api/topics/{topic}/c/clients", body) == OK
    target.expect_closed()
    wait_until(
        lambda: client_ids(cluster, 1, topic, "c") == ["neighbour"],
        what="target gone",
        timeout=20.0,
    )
    assert on_zero.is_open() and neighbour.is_open()
    (note,) = receiver.wait(1)
    assert note["action"] == "kick_client"
    assert (note["topic"], note["channel"], note["node"]) == (topic, "c", node)
    assert note["remote_address"] == address_of(target)
    assert note["url"] == f"{admin.http_url}/api/topics/{topic}/c/clients"
    on_zero.close()
    neighbour.close()


def test_kick_refuses_bad_requests(cluster: Cluster, start_admin: StartAdmin) -> None:
    topic = cluster.new_topic("kickbad")
    cluster.create_channel(topic, "c", 0)
    cluster.create_channel(topic, "other", 0)
    cluster.wait_registered(topic, 1)
    conn = subscribe(cluster, 0, topic, "c", "kept")
    node, address = cluster.nsqd_address(0), address_of(conn)
    admin = start_admin("--admin-user=alice")
    alice = {"X-Forwarded-User": "alice"}
    path = f"/api/topics/{topic}/c/clients"
    good = {"action": "kick", "node": node, "remote_address": address}

    def kick(body: object, channel_path: str = path) -> tuple[int, object]:
        return api(admin, "POST", channel_path, body, alice)

    assert api(admin, "POST", path, good) == (403, {"message": "FORBIDDEN"})
    assert kick({**good, "action": "pause"}) == (400, {"message": "INVALID_ACTION"})
    assert kick({**good, "node": ""}) == (400, {"message": "MISSING_ARG_NODE"})
    assert kick({**good, "remote_address": ""}) == (400, {"message": "MISSING_ARG_REMOTE_ADDRESS"})
    assert kick({**good, "remote_address": 5})[0] == 400
    assert kick(b"not json")[0] == 400
    # Only the topic's own nsqd: nsqadmin does not POST to an address it was handed.
    assert kick({**good, "node": "127.0.0.1:1"}) == (404, {"message": "NODE_NOT_FOUND"})
    assert kick({**good, "node": cluster.nsqd_address(1)}) == (404, {"message": "NODE_NOT_FOUND"})
    assert kick({**good, "remote_address": "127.0.0.1:1"}) == (404, {"message": "CLIENT_NOT_FOUND"})
    # The right client on another channel's page is not a match.
    other = f"/api/topics/{topic}/other/clients"
    assert kick(good, other) == (404, {"message": "CLIENT_NOT_FOUND"})
    assert kick(good, "/api/topics/bad%20topic!/c/clients") == (400, {"message": "INVALID_TOPIC"})
    assert conn.is_open()
    assert kick(good) == OK
    conn.expect_closed()
