"""nsqadmin's admin actions: their effect on the real nsqd and nsqlookupd, the ACL, the
notification webhook and the refusal of cross-site writes."""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ..raw_v2 import wait_until
from .conftest import Cluster, QuietHandler, StartAdmin, api, http, serve_http, stop_http

OK = (200, {"message": ""})


def lookupd_topics(cluster: Cluster) -> list[str]:
    return list(cluster.lookupd_json("/topics")["topics"])


def lookupd_channels(cluster: Cluster, topic: str) -> list[str]:
    return list(cluster.lookupd_json(f"/channels?topic={topic}")["channels"])


def spread(cluster: Cluster, prefix: str, channel: str = "c", count: int = 2) -> str:
    """A topic on both nsqd with ``channel`` holding ``count`` messages on each."""
    topic = cluster.new_topic(prefix)
    for node in (0, 1):
        cluster.create_channel(topic, channel, node)
        cluster.pub(topic, b"m", node, count)
    cluster.wait_registered(topic, 2)
    return topic


def test_create_topic_and_channel(cluster: Cluster, start_admin: StartAdmin) -> None:
    admin = start_admin()
    topic = cluster.new_topic("created")
    assert api(admin, "POST", "/api/topics", {"topic": topic, "channel": "billing"}) == OK
    assert topic in lookupd_topics(cluster)
    assert lookupd_channels(cluster, topic) == ["billing"]
    only_topic = cluster.new_topic("created")
    assert api(admin, "POST", "/api/topics", {"topic": only_topic}) == OK
    assert only_topic in lookupd_topics(cluster)
    assert lookupd_channels(cluster, only_topic) == []


def test_create_channel_reaches_the_producing_nsqd(
    cluster: Cluster, start_admin: StartAdmin
) -> None:
    topic = cluster.new_topic("produced")
    cluster.pub(topic, node=1)
    cluster.wait_registered(topic, 1)
    admin = start_admin()
    assert api(admin, "POST", "/api/topics", {"topic": topic, "channel": "late"}) == OK
    assert cluster.channel_stats(1, topic, "late") is not None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"topic": "bad topic!"}, "INVALID_TOPIC"),
        ({"topic": ""}, "INVALID_TOPIC"),
        ({"topic": "ok", "channel": "bad channel!"}, "INVALID_CHANNEL"),
        (b"", "EOF"),
        (b"nope", "invalid character 'n' looking for beginning of value"),
        (
            {"topic": 5},
            "json: cannot unmarshal number into Go struct field .topic of type string",
        ),
    ],
)
def test_create_refuses_bad_input(start_admin: StartAdmin, body: Any, message: str) -> None:
    admin = start_admin()
    assert api(admin, "POST", "/api/topics", body) == (400, {"message": message})


@pytest.mark.parametrize("mode", ["lookupd", "nsqd"])
def test_topic_pause_unpause_empty(cluster: Cluster, start_admin: StartAdmin, mode: str) -> None:
    topic = cluster.new_topic("actions")
    for node in (0, 1):
        cluster.pub(topic, b"m", node, 3)  # no channel: the messages stay in the topic
    cluster.wait_registered(topic, 2)
    admin = start_admin(mode=mode)
    path = f"/api/topics/{topic}"
    assert api(admin, "POST", path, {"action": "pause"}) == OK
    assert [cluster.topic_stats(n, topic)["paused"] for n in (0, 1)] == [True, True]
    assert api(admin, "POST", path, {"action": "unpause"}) == OK
    assert [cluster.topic_stats(n, topic)["paused"] for n in (0, 1)] == [False, False]
    assert [cluster.topic_stats(n, topic)["depth"] for n in (0, 1)] == [3, 3]
    assert api(admin, "POST", path, {"action": "empty"}) == OK
    assert [cluster.topic_stats(n, topic)["depth"] for n in (0, 1)] == [0, 0]
    assert api(admin, "POST", path, {"action": "explode"}) == (400, {"message": "INVALID_ACTION"})


@pytest.mark.parametrize("mode", ["lookupd", "nsqd"])
def test_channel_pause_unpause_empty(cluster: Cluster, start_admin: StartAdmin, mode: str) -> None:
    topic = spread(cluster, "chan")
    admin = start_admin(mode=mode)
    path = f"/api/topics/{topic}/c"

    def channels(key: str) -> list[Any]:
        return [cluster.channel_stats(n, topic, "c")[key] for n in (0, 1)]

    assert api(admin, "POST", path, {"action": "pause"}) == OK
    assert channels("paused") == [True, True]
    assert api(admin, "POST", path, {"action": "unpause"}) == OK
    assert channels("paused") == [False, False]
    assert channels("depth") == [2, 2]
    assert api(admin, "POST", path, {"action": "empty"}) == OK
    assert channels("depth") == [0, 0]
    assert api(admin, "POST", path, {"action": ""}) == (400, {"message": "INVALID_ACTION"})


def test_delete_channel_everywhere(cluster: Cluster, start_admin: StartAdmin) -> None:
    topic = spread(cluster, "delchan")
    assert "c" in wait_until(
        lambda: lookupd_channels(cluster, topic), what="channel in lookupd", timeout=20.0
    )
    admin = start_admin()
    assert api(admin, "DELETE", f"/api/topics/{topic}/c") == OK
    assert [cluster.channel_stats(n, topic, "c") for n in (0, 1)] == [None, None]
    wait_until(
        lambda: "c" not in lookupd_channels(cluster, topic), what="channel gone", timeout=20.0
    )


def test_delete_topic_everywhere(cluster: Cluster, start_admin: StartAdmin) -> None:
    topic = spread(cluster, "deltopic")
    admin = start_admin()
    assert api(admin, "DELETE", f"/api/topics/{topic}") == OK
    assert [cluster.topic_stats(n, topic) for n in (0, 1)] == [None, None]
    wait_until(
        lambda: topic not in lookupd_topics(cluster), what="topic gone from lookupd", timeout=20.0
    )


def test_tombstone_deletes_the_topic_on_that_node_only(
    cluster: Cluster, start_admin: StartAdmin
) -> None:
    topic = spread(cluster, "tomb")
    admin = start_admin()
    node = cluster.nsqd_address(0)
    assert api(admin, "DELETE", f"/api/nodes/{node}", {"topic": topic}) == OK
    assert cluster.topic_stats(0, topic) is None
    assert cluster.topic_stats(1, topic) is not None
    cluster.wait_registered(topic, 1)
    found = cluster.lookupd_json(f"/lookup?topic={topic}")["producers"]
    assert [p["http_port"] for p in found] == [cluster.nsqds[1].http_port]


@pytest.mark.parametrize(
    ("body", "message"),
    [(b"", "INVALID_BODY"), (b"[", "INVALID_BODY"), ({"topic": "no good"}, "INVALID_TOPIC")],
)
def test_tombstone_refuses_bad_input(
    cluster: Cluster, start_admin: StartAdmin, body: Any, message: str
) -> None:
    admin = start_admin()
    path = f"/api/nodes/{cluster.nsqd_address(0)}"
    assert api(admin, "DELETE", path, body) == (400, {"message": message})


def test_action_on_a_dead_lookupd_is_a_warning(cluster: Cluster, start_admin: StartAdmin) -> None:
    admin = start_admin("--lookupd-http-address=127.0.0.1:1")
    topic = cluster.new_topic("warned")
    status, body = api(admin, "POST", "/api/topics", {"topic": topic})
    assert status == 200
    assert body["message"].startswith('WARNING: Post "http://127.0.0.1:1/topic/create?topic=')
    assert topic in lookupd_topics(cluster)  # the live lookupd still got it


# --------------------------------------------------------------------------- ACL


def test_admin_users_only(cluster: Cluster, start_admin: StartAdmin) -> None:
    topic = spread(cluster, "acl")
    admin = start_admin("--admin-user=alice", "--admin-user=bob")
    forbidden = (403, {"message": "FORBIDDEN"})
    pause = {"action": "pause"}
    assert api(admin, "POST", f"/api/topics/{topic}", pause) == forbidden
    assert api(admin, "POST", f"/api/topics/{topic}/c", pause) == forbidden
    assert api(admin, "DELETE", f"/api/topics/{topic}") == forbidden
    assert api(admin, "DELETE", f"/api/topics/{topic}/c") == forbidden
    assert api(admin, "POST", "/api/topics", {"topic": "x"}) == forbidden
    node = cluster.nsqd_address(0)
    assert api(admin, "DELETE", f"/api/nodes/{node}", {"topic": topic}) == forbidden
    as_carol = {"X-Forwarded-User": "carol"}
    assert api(admin, "POST", f"/api/topics/{topic}", pause, as_carol) == forbidden
    assert cluster.topic_stats(0, topic)["paused"] is False
    assert cluster.topic_stats(0, topic) is not None
    as_bob = {"X-Forwarded-User": "bob"}
    assert api(admin, "POST", f"/api/topics/{topic}", pause, as_bob) == OK
    assert cluster.topic_stats(0, topic)["paused"] is True
    assert api(admin, "GET", f"/api/topics/{topic}")[0] == 200  # reads are open


def test_acl_header_is_configurable(cluster: Cluster, start_admin: StartAdmin) -> None:
    topic = spread(cluster, "aclh")
    admin = start_admin("--admin-user=alice", "--acl-http-header=X-Auth-User")
    pause = {"action": "pause"}
    path = f"/api/topics/{topic}"
    assert api(admin, "POST", path, pause, {"X-Forwarded-User": "alice"})[0] == 403
    assert api(admin, "POST", path, pause, {"X-Auth-User": "alice"}) == OK


# --------------------------------------------------------------------------- notifications


class Receiver:
    """A real HTTP server collecting the JSON bodies POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.content_types: list[str] = []
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                receiver.content_types.append(self.headers.get("Content-Type", ""))
                receiver.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

        self.server = serve_http(Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/notify"

    def wait(self, count: int) -> list[dict[str, Any]]:
        wait_until(lambda: len(self.bodies) >= count, what=f"{count} notifications", timeout=20.0)
        return self.bodies[:count]

    def close(self) -> None:
        stop_http(self.server)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    try:
        yield running
    finally:
        running.close()


def test_notifications(cluster: Cluster, start_admin: StartAdmin, receiver: Receiver) -> None:
    topic = spread(cluster, "audited")
    admin = start_admin(f"--notification-http-endpoint={receiver.url}")
    base = admin.http_url
    basic = "Basic " + base64.b64encode(b"alice:secret").decode()
    headers = {"User-Agent": "audit-test/1", "Authorization": basic}
    before = int(time.time())
    assert api(admin, "POST", f"/api/topics/{topic}/c", {"action": "pause"}, headers) == OK
    created = cluster.new_topic("audited")
    assert api(admin, "POST", "/api/topics", {"topic": created, "channel": "z"}) == OK
    node = cluster.nsqd_address(1)
    assert api(admin, "DELETE", f"/api/nodes/{node}", {"topic": topic}) == OK
    pause, create_topic, create_channel, tombstone = receiver.wait(4)
    assert set(receiver.content_types) == {"application/json"}
    assert list(pause) == [
        "action",
        "topic",
        "channel",
        "timestamp",
        "user",
        "remote_ip",
        "user_agent",
        "url",
        "via",
    ]
    assert pause["action"] == "pause_channel"
    assert (pause["topic"], pause["channel"], pause["user"]) == (topic, "c", "alice")
    assert before <= pause["timestamp"] <= int(time.time())
    assert pause["remote_ip"].startswith("127.0.0.1:")
    assert pause["user_agent"] == "audit-test/1"
    assert pause["url"] == f"{base}/api/topics/{topic}/c"
    assert pause["via"] == socket.gethostname()
    assert (create_topic["action"], create_topic["topic"]) == ("create_topic", created)
    assert "channel" not in create_topic and "user" not in create_topic
    assert (create_channel["action"], create_channel["channel"]) == ("create_channel", "z")
    assert tombstone["action"] == "tombstone_topic_producer"
    assert (tombstone["topic"], tombstone["node"]) == (topic, node)
    assert tombstone["url"] == f"{base}/api/nodes/{node}"


# --------------------------------------------------------------------------- cross-site


def test_cross_site_writes_are_refused(cluster: Cluster, start_admin: StartAdmin) -> None:
    topic = spread(cluster, "csrf")
    admin = start_admin()
    path = f"/api/topics/{topic}"
    pause = {"action": "pause"}
    forbidden = (403, {"message": "FORBIDDEN"})
    assert api(admin, "POST", path, pause, {"Origin": "http://evil.example"}) == forbidden
    other_port = {"Origin": f"http://127.0.0.1:{admin.http_port + 1}"}
    assert api(admin, "POST", path, pause, other_port) == forbidden
    assert api(admin, "DELETE", path, None, {"Origin": "null"}) == forbidden
    assert api(admin, "POST", path, pause, {"Sec-Fetch-Site": "cross-site"}) == forbidden
    assert api(admin, "PUT", "/config/log_level", b"debug", {"Origin": "http://x.example"}) == (
        forbidden
    )
    assert cluster.topic_stats(0, topic)["paused"] is False
    assert api(admin, "GET", path, None, {"Origin": "http://evil.example"})[0] == 200
    bad_port = {"Origin": "http://127.0.0.1:port"}
    assert api(admin, "POST", path, pause, bad_port) == forbidden
    proxied = {"Origin": "https://admin.example", "X-Forwarded-Host": "admin.example"}
    assert api(admin, "POST", path, pause, proxied) == OK  # a TLS proxy in front
    assert api(admin, "POST", path, {"action": "unpause"}) == OK
    same_origin = {"Origin": admin.http_url, "Sec-Fetch-Site": "same-origin"}
    assert api(admin, "POST", path, pause, same_origin) == OK
    assert api(admin, "POST", path, {"action": "unpause"}) == OK  # no Origin: a script
    assert cluster.topic_stats(0, topic)["paused"] is False


def test_tombstoned_producers_stay_listed(cluster: Cluster, start_admin: StartAdmin) -> None:
    topic = spread(cluster, "marked")
    node = cluster.nsqd_address(0)
    lookupd = cluster.lookupd.http_url
    assert http(f"{lookupd}/topic/tombstone?topic={topic}&node={node}", "POST")[0] == 200
    cluster.wait_registered(topic, 1)  # lookupd's /lookup now leaves nsqd 0 out
    admin = start_admin()
    status, body = api(admin, "GET", f"/api/topics/{topic}")
    assert status == 200
    marks = {n["node"]: n["tombstoned"] for n in body["nodes"]}
    assert marks == {node: True, cluster.nsqd_address(1): False}
    assert body["message_count"] == 4  # the tombstoned node's messages still count
    status, body = api(admin, "GET", f"/api/topics/{topic}/c")
    assert {n["node"]: n["tombstoned"] for n in body["nodes"]}[node] is True
    status, body = api(admin, "GET", "/api/nodes")
    producer = next(p for p in body["nodes"] if f"127.0.0.1:{p['http_port']}" == node)
    assert {"topic": topic, "tombstoned": True} in producer["topics"]
