"""nsqadmin's view of nsqd's ``--enable-inspect`` listings and dead-lettering figures.

``GET /api/topics/:topic/:channel/inspect?n=`` fans out to the topic's producers' ``/channel/
peek``, ``/channel/inflight`` and ``/channel/deferred``; an nsqd without them (Go's, or nsqpy's
without the flag) is listed as unsupported. Nothing it does may change what consumers get.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from nsqpy.nsqadmin.inspect_auth import AUTH_SECRET_HEADER
from nsqpy.nsqd.beyond.inspect import AUTH_SECRET_HEADER as NSQD_AUTH_SECRET_HEADER
from nsqpy.testing import DaemonProcess, start_nsqd

from ..nsqd.nsqd_transport_support import AuthServer
from ..raw_v2 import NsqConn, wait_until
from .conftest import Cluster, StartAdmin, api, http


@pytest.fixture
def inspect_nsqd(tmp_path: Path) -> Iterator[DaemonProcess]:
    """An nsqd of the test's own with inspection and dead-lettering on."""
    nsqd = start_nsqd(tmp_path, "--enable-inspect", "--max-attempts=2", "--msg-timeout=60s")
    try:
        yield nsqd
    finally:
        nsqd.stop()


def post(nsqd: DaemonProcess, path: str, body: bytes = b"") -> None:
    assert http(nsqd.http_url + path, "POST", body)[0] == 200, path


def channel_stats(nsqd: DaemonProcess, topic: str, channel: str) -> dict[str, Any]:
    status, raw, _ = http(f"{nsqd.http_url}/stats?format=json&topic={topic}&channel={channel}")
    assert status == 200
    for entry in json.loads(raw)["topics"]:
        for found in entry["channels"]:
            if found["channel_name"] == channel:
                return dict(found)
    raise AssertionError(f"{topic}/{channel} not on {nsqd.http_url}")


def bodies(messages: list[dict[str, Any]]) -> list[bytes]:
    return [base64.b64decode(m["body"]) for m in messages]


def address(nsqd: DaemonProcess) -> str:
    return f"127.0.0.1:{nsqd.http_port}"


def test_inspect_lists_a_channel_and_changes_nothing(
    cluster: Cluster, start_admin: StartAdmin, inspect_nsqd: DaemonProcess
) -> None:
    topic = cluster.new_topic("peek")
    post(inspect_nsqd, f"/topic/create?topic={topic}")
    post(inspect_nsqd, f"/channel/create?topic={topic}&channel=c")
    for body in (b"m0", b"m1", b"m2", b"x" * 5000):
        post(inspect_nsqd, f"/pub?topic={topic}", body)
    cluster.create_channel(topic, "c", 0)  # the same channel on an nsqd without inspection
    cluster.pub(topic, b"plain", 0, 2)
    consumer = NsqConn(inspect_nsqd.tcp_address)
    try:
        consumer.identify(client_id="peeker", heartbeat_interval=60000)
        consumer.dpub(topic, 60_000, b"later")
        consumer.sub(topic, "c")
        consumer.rdy(1)
        held = consumer.expect_message()
        assert held.body == b"m0"
        admin = start_admin(
            f"--nsqd-http-address={address(inspect_nsqd)}",
            f"--nsqd-http-address={cluster.nsqd_address(0)}",
            mode="none",
        )
        before = channel_stats(inspect_nsqd, topic, "c")
        status, found = api(admin, "GET", f"/api/topics/{topic}/c/inspect?n=10")
        assert status == 200, found
        assert (found["topic_name"], found["channel_name"], found["n"]) == (topic, "c", 10)
        assert found["unsupported"] == [cluster.nsqd_address(0)]
        assert (found["message"], found["unreachable"]) == ("", [])
        [node] = found["nodes"]
        assert node["node"] == address(inspect_nsqd)
        queued = node["queued"]
        assert bodies(queued) == [b"m1", b"m2", b"x" * 4096]  # cut to 4 KiB
        assert [m["body_size"] for m in queued] == [2, 2, 5000]
        assert [m["body_truncated"] for m in queued] == [False, False, True]
        assert [m["attempts"] for m in queued] == [0, 0, 0]
        assert all(len(m["id"]) == 16 and m["timestamp"] > 0 for m in queued)
        now_ns = time.time_ns()
        [flying] = node["in_flight"]
        assert (base64.b64decode(flying["body"]), flying["client_id"]) == (b"m0", "peeker")
        assert flying["id"] == held.id.decode() and flying["attempts"] == 1
        assert now_ns < flying["deadline"] < now_ns + 70 * 10**9
        [waiting] = node["deferred"]
        assert base64.b64decode(waiting["body"]) == b"later"
        assert now_ns < waiting["due"] < now_ns + 70 * 10**9
        assert (node["in_flight_total"], node["deferred_total"]) == (1, 1)

        status, two = api(admin, "GET", f"/api/topics/{topic}/c/inspect?n=2")
        assert status == 200 and bodies(two["nodes"][0]["queued"]) == [b"m1", b"m2"]
        after = channel_stats(inspect_nsqd, topic, "c")
        for key in ("depth", "in_flight_count", "deferred_count", "message_count"):
            assert after[key] == before[key], key
        # Consumers get exactly what they would have: the same order, first attempts.
        consumer.fin(held.id)
        consumer.rdy(10)
        got = [consumer.expect_message() for _ in range(3)]
        assert [m.body[:2] for m in got] == [b"m1", b"m2", b"xx"]
        assert [m.attempts for m in got] == [1, 1, 1]
        assert [m.id.decode() for m in got] == [m["id"] for m in queued]
    finally:
        consumer.close()


def test_inspect_without_supporting_nsqd_lists_them_as_unsupported(
    cluster: Cluster, start_admin: StartAdmin
) -> None:
    topic = cluster.new_topic("plain")
    for node in (0, 1):
        cluster.create_channel(topic, "c", node)
    cluster.wait_registered(topic, 2)
    admin = start_admin()
    status, found = api(admin, "GET", f"/api/topics/{topic}/c/inspect")
    assert status == 200, found
    assert found["nodes"] == [] and found["n"] == 20
    assert found["unsupported"] == sorted(cluster.nsqd_addresses)


def test_inspect_arguments_and_access(
    cluster: Cluster, start_admin: StartAdmin, inspect_nsqd: DaemonProcess
) -> None:
    topic = cluster.new_topic("guarded")
    post(inspect_nsqd, f"/topic/create?topic={topic}")
    post(inspect_nsqd, f"/channel/create?topic={topic}&channel=c")
    post(inspect_nsqd, f"/pub?topic={topic}", b"secret")
    nsqd_flag = f"--nsqd-http-address={address(inspect_nsqd)}"
    open_admin = start_admin(nsqd_flag, mode="none")
    path = f"/api/topics/{topic}/c/inspect"
    for bad in ("0", "101", "x", ""):
        assert api(open_admin, "GET", f"{path}?n={bad}") == (400, {"message": "INVALID_N"})
    assert api(open_admin, "GET", "/api/topics/a%20b/c/inspect")[0] == 400
    assert api(open_admin, "GET", f"/api/topics/{topic}/c%20d/inspect") == (
        400,
        {"message": "INVALID_CHANNEL"},
    )
    # A channel this nsqd does not have: no node, and no error.
    status, other = api(open_admin, "GET", f"/api/topics/{topic}/nope/inspect")
    assert status == 200 and (other["nodes"], other["unsupported"]) == ([], [])
    # Bodies can be sensitive: with --admin-user, only admins read them.
    guarded = start_admin(nsqd_flag, "--admin-user=alice", mode="none")
    assert api(guarded, "GET", path) == (403, {"message": "FORBIDDEN"})
    status, found = api(guarded, "GET", path, headers={"X-Forwarded-User": "alice"})
    assert status == 200 and bodies(found["nodes"][0]["queued"]) == [b"secret"]


def test_dead_lettering_figures_on_the_channel(
    cluster: Cluster, start_admin: StartAdmin, inspect_nsqd: DaemonProcess
) -> None:
    topic = cluster.new_topic("poison")
    post(inspect_nsqd, f"/topic/create?topic={topic}")
    post(inspect_nsqd, f"/channel/create?topic={topic}&channel=c")
    cluster.create_channel(topic, "c", 0)
    post(inspect_nsqd, f"/pub?topic={topic}", b"bad")
    admin = start_admin(
        f"--nsqd-http-address={address(inspect_nsqd)}",
        f"--nsqd-http-address={cluster.nsqd_address(0)}",
        mode="none",
    )
    status, channel = api(admin, "GET", f"/api/topics/{topic}/c")
    assert status == 200
    assert (channel["max_attempts"], channel["dead_letter_count"]) == (2, 0)
    mine = {n["node"]: n for n in channel["nodes"]}
    assert mine[address(inspect_nsqd)]["max_attempts"] == 2
    assert "max_attempts" not in mine[cluster.nsqd_address(0)]  # Go's keys, nothing more
    consumer = NsqConn(inspect_nsqd.tcp_address)
    try:
        consumer.identify(heartbeat_interval=60000)
        consumer.sub(topic, "c")
        consumer.rdy(1)
        for _ in range(2):  # attempt 2 is the last; its REQ dead-letters the message
            consumer.req(consumer.expect_message().id, 0)

        def dead() -> int:
            return int(api(admin, "GET", f"/api/topics/{topic}/c")[1]["dead_letter_count"])

        wait_until(lambda: dead() == 1, what="the message to be dead-lettered", timeout=20.0)
    finally:
        consumer.close()
    status, plain = api(admin, "GET", f"/api/topics/{cluster.new_topic('x')}/c")
    assert status == 200 and "max_attempts" not in plain


# --------------------------------------------------------------------------- nsqd behind AUTH


class HeaderRecorder(BaseHTTPRequestHandler):
    """A stand-in daemon that answers 404 to everything and keeps each request's headers."""

    seen: ClassVar[list[tuple[str, dict[str, str]]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, dict(self.headers)))
        body = b'{"message":"NOT_FOUND"}'
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_nsqadmin_sends_its_secret_to_inspection_routes_only(
    start_admin: StartAdmin, tmp_path: Path
) -> None:
    authd = AuthServer().start()
    authd.grant([{"topic": ".*", "channels": ["^c$"], "permissions": ["subscribe"]}])
    recorder = ThreadingHTTPServer(("127.0.0.1", 0), HeaderRecorder)
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    nsqd = start_nsqd(tmp_path, "--enable-inspect", f"--auth-http-address={authd.address}")
    try:
        topic = f"authed_{time.monotonic_ns()}"
        post(nsqd, f"/topic/create?topic={topic}")
        post(nsqd, f"/channel/create?topic={topic}&channel=c")
        post(nsqd, f"/pub?topic={topic}", b"private")
        nodes = [f"--nsqd-http-address={address(nsqd)}"]
        nodes.append(f"--nsqd-http-address=127.0.0.1:{recorder.server_port}")
        path = f"/api/topics/{topic}/c/inspect"

        without = start_admin(*nodes, mode="none")
        status, refused = api(without, "GET", path)
        assert status == 502 and "401" in refused["message"], refused
        assert authd.queries == []

        admin = start_admin(*nodes, "--nsqd-auth-secret=s3cret", mode="none")
        status, found = api(admin, "GET", path)
        assert status == 200, found
        assert bodies(found["nodes"][0]["queued"]) == [b"private"]
        assert ["secret=s3cret" in q.path_qs for q in authd.queries] == [True]
        # the secret went to no other request (the stand-in daemon saw /stats and others)
        assert HeaderRecorder.seen
        for seen_path, headers in HeaderRecorder.seen:
            assert "X-NSQ-Auth-Secret" not in headers, seen_path
        assert AUTH_SECRET_HEADER == NSQD_AUTH_SECRET_HEADER
        assert api(admin, "GET", "/config/nsqd_auth_secret") == (
            400,
            {"message": "INVALID_OPTION"},
        )
    finally:
        nsqd.stop()
        recorder.shutdown()
        authd.stop()
