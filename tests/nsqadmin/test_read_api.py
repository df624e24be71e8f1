"""nsqadmin's read routes against a real cluster, in lookupd and nsqd mode (Go's JSON)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from ..raw_v2 import NsqConn, wait_until
from .conftest import Cluster, StartAdmin, api, http

MODES = ["lookupd", "nsqd"]
HOSTNAME = socket.gethostname()

TOPIC_KEYS = [
    "node",
    "hostname",
    "topic_name",
    "depth",
    "memory_depth",
    "backend_depth",
    "message_count",
    "nodes",
    "channels",
    "paused",
    "e2e_processing_latency",
]
CHANNEL_KEYS = [
    "node",
    "hostname",
    "topic_name",
    "channel_name",
    "depth",
    "memory_depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "requeue_count",
    "timeout_count",
    "message_count",
    "client_count",
    "nodes",
    "clients",
    "paused",
    "e2e_processing_latency",
]
CLIENT_KEYS = [
    "node",
    "remote_address",
    "version",
    "client_id",
    "hostname",
    "user_agent",
    "connect_ts",
    "connected",
    "in_flight_count",
    "ready_count",
    "finish_count",
    "requeue_count",
    "message_count",
    "sample_rate",
    "deflate",
    "snappy",
    "authed",
    "auth_identity",
    "auth_identity_url",
    "tls",
    "tls_cipher_suite",
    "tls_version",
    "tls_negotiated_protocol",
    "tls_negotiated_protocol_is_mutual",
]
PRODUCER_KEYS = [
    "remote_addresses",
    "remote_address",
    "hostname",
    "broadcast_address",
    "tcp_port",
    "http_port",
    "version",
    "topics",
    "out_of_date",
]


@pytest.fixture(scope="module")
def spread_topic(cluster: Cluster) -> str:
    """A topic on both nsqd with channel ``c``: 3 messages on nsqd 0, 2 on nsqd 1."""
    topic = cluster.new_topic("spread")
    for node, count in ((0, 3), (1, 2)):
        cluster.create_channel(topic, "c", node)
        cluster.pub(topic, b"x", node, count)
    cluster.wait_registered(topic, 2)
    return topic


@pytest.fixture(scope="module")
def consumer(cluster: Cluster, spread_topic: str) -> Iterator[NsqConn]:
    """A raw V2 client on nsqd 0 holding one message of ``spread_topic/c`` in flight."""
    conn = NsqConn(cluster.nsqds[0].tcp_address)
    # it reads nothing more, so it asks for nsqd's longest heartbeat interval (60 s): nsqd
    # would drop a client that misses two heartbeats
    conn.identify(
        client_id="worker-1", hostname="box-1", user_agent="tests/1.0", heartbeat_interval=60000
    )
    conn.sub(spread_topic, "c")
    conn.rdy(1)
    conn.expect_message()
    try:
        yield conn
    finally:
        conn.close()


def test_ping(start_admin: StartAdmin) -> None:
    admin = start_admin()
    assert api(admin, "GET", "/ping") == (200, "OK")


@pytest.mark.parametrize("mode", MODES)
def test_topics_lists_every_topic_sorted(
    cluster: Cluster, start_admin: StartAdmin, mode: str
) -> None:
    first, second = cluster.new_topic("b"), cluster.new_topic("a")
    cluster.pub(first, node=0)
    cluster.pub(second, node=1)
    cluster.wait_registered(first, 1)
    cluster.wait_registered(second, 1)
    admin = start_admin(mode=mode)
    status, body = api(admin, "GET", "/api/topics")
    assert status == 200
    assert list(body) == ["topics", "message"]
    assert body["message"] == ""
    assert body["topics"] == sorted(body["topics"])
    assert {first, second} <= set(body["topics"])


@pytest.mark.parametrize("mode", MODES)
def test_topic_aggregates_every_node(
    cluster: Cluster, start_admin: StartAdmin, spread_topic: str, mode: str
) -> None:
    admin = start_admin(mode=mode)
    status, body = api(admin, "GET", f"/api/topics/{spread_topic}")
    assert status == 200
    assert list(body) == [*TOPIC_KEYS, "message", "unreachable"]
    assert body["node"] == "*"
    assert body["topic_name"] == spread_topic
    assert (body["depth"], body["message_count"], body["paused"]) == (0, 5, False)
    assert body["message"] == "" and body["unreachable"] == []
    assert body["e2e_processing_latency"] == {
        "count": 0,
        "percentiles": None,
        "topic": spread_topic,
        "channel": "",
        "host": "*",
    }
    nodes = body["nodes"]
    assert sorted(n["node"] for n in nodes) == sorted(cluster.nsqd_addresses)
    counts = {n["node"]: n["message_count"] for n in nodes}
    assert counts == {cluster.nsqd_address(0): 3, cluster.nsqd_address(1): 2}
    for node in nodes:
        assert list(node) == [*TOPIC_KEYS, "tombstoned"]
        assert node["hostname"] == HOSTNAME and node["nodes"] is None
        assert node["tombstoned"] is False
        assert [c["channel_name"] for c in node["channels"]] == ["c"]
        assert node["channels"][0]["node"] == node["node"]
    (channel,) = body["channels"]
    assert list(channel) == CHANNEL_KEYS
    assert channel["node"] == "*"
    assert (channel["depth"], channel["memory_depth"], channel["message_count"]) == (5, 5, 5)
    assert channel["clients"] is None  # include_clients=false, as Go asks nsqd
    assert sorted(n["node"] for n in channel["nodes"]) == sorted(cluster.nsqd_addresses)


@pytest.mark.parametrize("mode", MODES)
def test_channel_lists_clients(
    cluster: Cluster, start_admin: StartAdmin, spread_topic: str, consumer: NsqConn, mode: str
) -> None:
    admin = start_admin(mode=mode)
    status, body = api(admin, "GET", f"/api/topics/{spread_topic}/c")
    assert status == 200
    assert list(body) == [*CHANNEL_KEYS, "message", "unreachable"]
    assert (body["node"], body["topic_name"], body["channel_name"]) == ("*", spread_topic, "c")
    assert (body["in_flight_count"], body["client_count"]) == (1, 1)
    assert body["depth"] == 4  # 5 published, 1 in flight
    (client,) = body["clients"]
    assert list(client) == CLIENT_KEYS
    assert client["node"] == cluster.nsqd_address(0)
    assert (client["client_id"], client["hostname"], client["user_agent"]) == (
        "worker-1",
        "box-1",
        "tests/1.0",
    )
    assert (client["version"], client["in_flight_count"], client["ready_count"]) == ("V2", 1, 1)
    assert client["connected"] >= 0 and client["connected"] % 1_000_000_000 == 0
    per_node = {n["node"]: n for n in body["nodes"]}
    assert per_node[cluster.nsqd_address(0)]["clients"][0]["client_id"] == "worker-1"
    assert per_node[cluster.nsqd_address(1)]["clients"] == []


def test_unknown_channel_is_an_empty_answer(start_admin: StartAdmin, spread_topic: str) -> None:
    admin = start_admin()
    assert api(admin, "GET", f"/api/topics/{spread_topic}/nope") == (
        200,
        {"message": "", "unreachable": []},
    )


def test_unknown_topic_is_an_upstream_error_in_lookupd_mode(
    cluster: Cluster, start_admin: StartAdmin
) -> None:
    admin = start_admin()
    status, body = api(admin, "GET", f"/api/topics/{cluster.new_topic('unknown')}")
    assert status == 502
    assert body["message"].startswith(
        "UPSTREAM_ERROR: failed to query any nsqlookupd: got response 404"
    )
    assert "TOPIC_NOT_FOUND" in body["message"]


def test_topic_known_only_to_lookupd_answers_no_producers(
    cluster: Cluster, start_admin: StartAdmin
) -> None:
    topic = cluster.new_topic("inactive")
    status, _, _ = http(f"{cluster.lookupd.http_url}/topic/create?topic={topic}", "POST")
    assert status == 200
    admin = start_admin()
    status, body = api(admin, "GET", f"/api/topics/{topic}")
    assert status == 200  # Go: 502 "failed to query any nsqd: " with nothing failed
    assert (body["topic_name"], body["nodes"], body["channels"]) == (topic, None, None)
    assert (body["message"], body["unreachable"]) == ("", [])


def test_inactive_topics_tree(cluster: Cluster, start_admin: StartAdmin, spread_topic: str) -> None:
    bare, with_channels = cluster.new_topic("bare"), cluster.new_topic("tree")
    lookupd = cluster.lookupd.http_url
    for path in (
        f"/topic/create?topic={bare}",
        f"/topic/create?topic={with_channels}",
        f"/channel/create?topic={with_channels}&channel=z",
        f"/channel/create?topic={with_channels}&channel=a",
    ):
        assert http(lookupd + path, "POST")[0] == 200
    admin = start_admin()
    status, body = api(admin, "GET", "/api/topics?inactive=true")
    assert status == 200 and body["message"] == ""
    assert body["topics"][bare] is None
    assert body["topics"][with_channels] == ["a", "z"]
    assert spread_topic not in body["topics"]  # it has producers
    nsqd_mode = start_admin(mode="nsqd")
    assert api(nsqd_mode, "GET", "/api/topics?inactive=true") == (
        200,
        {"topics": {}, "message": ""},
    )


def _producers_by_address(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{p['broadcast_address']}:{p['http_port']}": p for p in body["nodes"]}


@pytest.mark.parametrize("mode", MODES)
def test_nodes(cluster: Cluster, start_admin: StartAdmin, spread_topic: str, mode: str) -> None:
    admin = start_admin(mode=mode)
    status, body = api(admin, "GET", "/api/nodes")
    assert status == 200
    assert list(body) == ["nodes", "message", "unreachable"]
    producers = _producers_by_address(body)
    assert sorted(producers) == sorted(cluster.nsqd_addresses)
    for i, address in enumerate(cluster.nsqd_addresses):
        producer = producers[address]
        assert list(producer) == PRODUCER_KEYS
        assert producer["tcp_port"] == cluster.nsqds[i].tcp_port
        assert (producer["hostname"], producer["version"]) == (HOSTNAME, "1.3.0")
        assert producer["out_of_date"] is False
        assert {"topic": spread_topic, "tombstoned": False} in producer["topics"]
        topics = [t["topic"] for t in producer["topics"]]
        assert topics == sorted(topics)
        if mode == "lookupd":
            remote = producer["remote_address"]
            assert producer["remote_addresses"] == [f"{cluster.lookupd_address}/{remote}"]
        else:
            assert (producer["remote_addresses"], producer["remote_address"]) == (None, "")


@pytest.mark.parametrize("mode", MODES)
def test_node(
    cluster: Cluster, start_admin: StartAdmin, spread_topic: str, consumer: NsqConn, mode: str
) -> None:
    admin = start_admin(mode=mode)
    address = cluster.nsqd_address(0)
    status, body = api(admin, "GET", f"/api/nodes/{address}")
    assert status == 200
    assert list(body) == [
        "node",
        "topics",
        "total_messages",
        "total_clients",
        "message",
        "total_topics",
        "unreachable",
    ]
    stats = cluster.stats(0)
    assert body["node"] == address
    assert body["total_topics"] == len(stats["topics"]) == len(body["topics"])
    assert body["total_messages"] == sum(t["message_count"] for t in stats["topics"])
    assert body["total_clients"] == 1
    topic = next(t for t in body["topics"] if t["topic_name"] == spread_topic)
    assert (topic["node"], topic["message_count"]) == (address, 3)
    assert topic["channels"][0]["clients"][0]["client_id"] == "worker-1"
    assert api(admin, "GET", "/api/nodes/127.0.0.1:1") == (404, {"message": "NODE_NOT_FOUND"})


@pytest.mark.parametrize("mode", MODES)
def test_counter(cluster: Cluster, start_admin: StartAdmin, spread_topic: str, mode: str) -> None:
    admin = start_admin(mode=mode)
    status, body = api(admin, "GET", "/api/counter")
    assert status == 200 and body["message"] == ""
    for node, count in ((0, 3), (1, 2)):
        address = cluster.nsqd_address(node)
        assert body["stats"][f"{spread_topic}:c:{address}"] == {
            "node": address,
            "topic_name": spread_topic,
            "channel_name": "c",
            "message_count": count,
        }


def test_every_response_is_v1(start_admin: StartAdmin) -> None:
    admin = start_admin()
    status, _, headers = http(admin.http_url + "/api/topics")
    assert status == 200
    assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
    assert headers["Content-Type"].startswith("application/json")
    status, body, _ = http(admin.http_url + "/api/topics", "PATCH")
    assert (status, body) == (405, b'{"message":"METHOD_NOT_ALLOWED"}')
    assert api(admin, "GET", "/api/nope") == (404, {"message": "NOT_FOUND"})


def test_partial_lookupd_failure_is_a_warning(
    cluster: Cluster, start_admin: StartAdmin, spread_topic: str
) -> None:
    admin = start_admin("--lookupd-http-address=127.0.0.1:1")
    status, body = api(admin, "GET", "/api/topics")
    assert status == 200
    assert spread_topic in body["topics"]
    assert body["message"].startswith('WARNING: Get "http://127.0.0.1:1/topics": dial tcp')
    assert "connection refused" in body["message"]
    status, body = api(admin, "GET", f"/api/topics/{spread_topic}")
    assert status == 200 and body["message"].startswith("WARNING: ")
    assert [u["address"] for u in body["unreachable"]] == ["127.0.0.1:1"]
    assert body["message_count"] == 5
    status, body = api(admin, "GET", "/api/nodes")
    assert status == 200 and body["message"].startswith("WARNING: ")
    assert body["unreachable"][0]["address"] == "127.0.0.1:1"


def test_all_lookupd_down_is_a_502(start_admin: StartAdmin) -> None:
    admin = start_admin("--lookupd-http-address=127.0.0.1:1", mode="none")
    status, body = api(admin, "GET", "/api/topics")
    assert status == 502
    assert body["message"].startswith(
        'UPSTREAM_ERROR: failed to query any nsqlookupd: Get "http://127.0.0.1:1/topics"'
    )
    wait_until(lambda: "failed to get topics" in admin.log, what="the error log line", timeout=20.0)
