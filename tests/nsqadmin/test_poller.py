"""nsqpy's poller: /api/overview and /api/history, and "nothing hidden" when a node is down."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import NsqConn, wait_until
from .conftest import Cluster, StartAdmin, api, http

TOPIC_ROW_KEYS = [
    "topic_name",
    "depth",
    "memory_depth",
    "backend_depth",
    "message_count",
    "in_flight_count",
    "deferred_count",
    "channel_count",
    "client_count",
    "paused",
    "producer_count",
    "tombstoned_count",
    "rate_in",
    "rate_out",
    "depth_trend",
    "channel_depth",
    "history",
]


def overview_row(admin: DaemonProcess, topic: str) -> dict[str, Any] | None:
    status, body = api(admin, "GET", "/api/overview")
    assert status == 200
    return next((row for row in body["topics"] if row["topic_name"] == topic), None)


def test_overview_shape(cluster: Cluster, start_admin: StartAdmin) -> None:
    topic = cluster.new_topic("shape")
    cluster.create_channel(topic, "c", 0)
    cluster.pub(topic, b"m", 0, 4)
    cluster.wait_registered(topic, 1)
    admin = start_admin()
    row = wait_until(
        lambda: overview_row(admin, topic), what="the topic in the overview", timeout=20.0
    )
    status, body = api(admin, "GET", "/api/overview")
    assert status == 200
    assert list(body) == ["updated_at", "poll_interval_ms", "nodes", "lookupd", "topics", "message"]
    assert body["poll_interval_ms"] == 200
    assert abs(body["updated_at"] - time.time() * 1000) < 30_000
    assert body["nodes"] == {"total": 2, "reachable": 2, "unreachable": []}
    assert body["lookupd"] == {"total": 1, "reachable": 1, "unreachable": []}
    assert body["message"] == ""
    assert list(row) == TOPIC_ROW_KEYS
    assert (row["depth"], row["channel_depth"], row["message_count"]) == (0, 4, 4)
    assert (row["channel_count"], row["producer_count"], row["tombstoned_count"]) == (1, 1, 0)
    names = [r["topic_name"] for r in body["topics"]]
    assert names == sorted(names)


def test_topic_known_only_to_lookupd_is_listed(cluster: Cluster, start_admin: StartAdmin) -> None:
    topic = cluster.new_topic("lonely")
    assert http(f"{cluster.lookupd.http_url}/topic/create?topic={topic}", "POST")[0] == 200
    admin = start_admin()
    row = wait_until(
        lambda: overview_row(admin, topic), what="the lookupd-only topic", timeout=20.0
    )
    assert (row["producer_count"], row["message_count"], row["channel_count"]) == (0, 0, 0)


@pytest.fixture
def worker(cluster: Cluster) -> Iterator[tuple[str, NsqConn]]:
    """A topic on nsqd 0 with channel ``work`` read by a raw consumer that finishes all."""
    topic = cluster.new_topic("busy")
    cluster.create_channel(topic, "work", 0)
    cluster.wait_registered(topic, 1)
    conn = NsqConn(cluster.nsqds[0].tcp_address)
    conn.identify()
    conn.sub(topic, "work")
    conn.rdy(100)
    try:
        yield topic, conn
    finally:
        conn.close()


def test_rates_appear_while_publishing(
    cluster: Cluster, start_admin: StartAdmin, worker: tuple[str, NsqConn]
) -> None:
    topic, conn = worker
    admin = start_admin("--history-points=8")
    deadline = time.monotonic() + 30
    row: dict[str, Any] | None = None
    rounds = 0
    while time.monotonic() < deadline and rounds < 300:
        rounds += 1
        cluster.pub(topic, b"event", 0, 20)
        for _ in range(20):
            conn.fin(conn.expect_message().id)
        row = overview_row(admin, topic)
        if row is not None and row["rate_in"] > 0 and row["rate_out"] > 0:
            break
        time.sleep(0.05)
    assert row is not None and row["rate_in"] > 0 and row["rate_out"] > 0, row
    status, history = api(admin, "GET", f"/api/history?topic={topic}")
    assert status == 200 and history["interval_ms"] == 200
    points = history["points"]
    assert 1 <= len(points) <= 8  # --history-points bounds it
    assert [p["t"] for p in points] == sorted(p["t"] for p in points)
    assert set(points[-1]) == {"t", "depth", "rate_in", "rate_out", "channel_depth"}
    assert any(p["rate_in"] > 0 for p in points)
    status, channel = api(admin, "GET", f"/api/history?topic={topic}&channel=work")
    assert status == 200 and any(p["rate_out"] > 0 for p in channel["points"])
    assert set(channel["points"][-1]) == {"t", "depth", "rate_in", "rate_out"}
    status, node = api(admin, "GET", f"/api/history?node={cluster.nsqd_address(0)}")
    assert status == 200 and any(p["rate_in"] > 0 for p in node["points"])


def test_growing_backlog_has_a_positive_trend(cluster: Cluster, start_admin: StartAdmin) -> None:
    topic = cluster.new_topic("backlog")
    cluster.create_channel(topic, "stuck", 1)
    cluster.wait_registered(topic, 1)
    admin = start_admin()

    def trend() -> float:
        cluster.pub(topic, b"m", 1, 10)
        time.sleep(0.1)
        row = overview_row(admin, topic)
        return float(row["depth_trend"]) if row is not None else 0.0

    assert wait_until(lambda: trend() > 0, what="a positive depth trend", timeout=20.0)


def test_history_of_a_series_not_polled_yet_is_empty(
    cluster: Cluster, start_admin: StartAdmin
) -> None:
    # The browser asks for a topic's history as soon as it shows the topic; an answer of 404
    # for one the poller has not met yet was logged as an error by the browser.
    admin = start_admin()
    wait_until(
        lambda: api(admin, "GET", "/api/overview")[1]["updated_at"],
        what="a first poll",
        timeout=20.0,
    )
    missing = cluster.new_topic("missing")
    empty = (200, {"interval_ms": 200, "points": []})
    assert api(admin, "GET", f"/api/history?topic={missing}") == empty
    assert api(admin, "GET", f"/api/history?topic={missing}&channel=x") == empty
    assert api(admin, "GET", f"/api/history?topic={missing}&channel=x%23ephemeral") == empty
    assert api(admin, "GET", "/api/history?node=127.0.0.1:1") == empty
    assert api(admin, "GET", "/api/history?node=%5B::1%5D:4151") == empty


def test_malformed_history_queries_are_400(start_admin: StartAdmin) -> None:
    admin = start_admin()
    assert api(admin, "GET", "/api/history") == (400, {"message": "MISSING_ARG_TOPIC"})
    bad_topic = (400, {"message": "INVALID_TOPIC"})
    assert api(admin, "GET", "/api/history?topic=a%20b") == bad_topic
    assert api(admin, "GET", "/api/history?topic=") == bad_topic
    assert api(admin, "GET", f"/api/history?topic={'x' * 65}") == bad_topic
    bad_channel = (400, {"message": "INVALID_CHANNEL"})
    assert api(admin, "GET", "/api/history?topic=t&channel=c/d") == bad_channel
    bad_node = (400, {"message": "INVALID_NODE"})
    for node in ("", "127.0.0.1", "127.0.0.1:http", ":4151", "h:99999"):
        assert api(admin, "GET", f"/api/history?node={node}") == bad_node, node


def test_poller_disabled(cluster: Cluster, start_admin: StartAdmin) -> None:
    admin = start_admin("--poll-interval=0")
    status, body = api(admin, "GET", "/api/overview")
    assert status == 200
    assert (body["updated_at"], body["poll_interval_ms"], body["topics"]) == (0, 0, [])
    assert api(admin, "GET", "/api/history?topic=x") == (200, {"interval_ms": 0, "points": []})


# --------------------------------------------------------------------------- a node down


@pytest.fixture
def doomed_nsqd(tmp_path: Path) -> Iterator[DaemonProcess]:
    """An nsqd of the test's own (not registered with the shared lookupd), to be stopped."""
    nsqd = start_nsqd(tmp_path)
    try:
        yield nsqd
    finally:
        nsqd.stop()


def test_one_nsqd_down_is_a_warning_not_a_gap(
    cluster: Cluster, start_admin: StartAdmin, doomed_nsqd: DaemonProcess
) -> None:
    topic = cluster.new_topic("partial")
    cluster.pub(topic, b"m", 0, 3)
    assert http(f"{doomed_nsqd.http_url}/pub?topic={topic}", "POST", b"m")[0] == 200
    doomed = f"127.0.0.1:{doomed_nsqd.http_port}"
    admin = start_admin(
        f"--nsqd-http-address={cluster.nsqd_address(0)}",
        f"--nsqd-http-address={doomed}",
        mode="none",
    )
    status, body = api(admin, "GET", f"/api/topics/{topic}")
    assert (status, body["message_count"], body["unreachable"]) == (200, 4, [])
    doomed_nsqd.stop()

    status, body = api(admin, "GET", f"/api/topics/{topic}")
    assert status == 200
    assert body["message"].startswith(f'WARNING: Get "http://{doomed}/stats?format=json&topic=')
    assert "connection refused" in body["message"]
    assert [u["address"] for u in body["unreachable"]] == [doomed]
    assert body["message_count"] == 3  # what the live node holds

    status, body = api(admin, "GET", f"/api/topics/{topic}/nochannel")
    assert status == 200 and [u["address"] for u in body["unreachable"]] == [doomed]

    status, body = api(admin, "GET", "/api/topics")
    assert status == 200 and topic in body["topics"] and body["message"].startswith("WARNING: ")

    status, body = api(admin, "GET", "/api/nodes")
    assert status == 200 and body["message"].startswith("WARNING: ")
    assert doomed in [u["address"] for u in body["unreachable"]]
    assert [f"{n['broadcast_address']}:{n['http_port']}" for n in body["nodes"]] == [
        cluster.nsqd_address(0)
    ]

    def overview_sees_it() -> dict[str, Any] | None:
        nodes = api(admin, "GET", "/api/overview")[1]["nodes"]
        return nodes if nodes["reachable"] == 1 else None

    nodes = wait_until(overview_sees_it, what="the overview to count the node down", timeout=20.0)
    assert nodes["total"] == 2
    assert [u["address"] for u in nodes["unreachable"]] == [doomed]
    assert "connection refused" in nodes["unreachable"][0]["error"]


def test_one_poll_is_one_stats_request_per_nsqd(
    start_admin: StartAdmin, doomed_nsqd: DaemonProcess
) -> None:
    address = f"127.0.0.1:{doomed_nsqd.http_port}"
    admin = start_admin(f"--nsqd-http-address={address}", "--poll-interval=250ms", mode="none")
    wait_until(
        lambda: api(admin, "GET", "/api/overview")[1]["updated_at"],
        what="a first poll",
        timeout=20.0,
    )
    started = time.monotonic()
    before = doomed_nsqd.log.count("GET /stats?format=json&include_clients=false")
    time.sleep(2.0)
    elapsed = time.monotonic() - started
    polls = doomed_nsqd.log.count("GET /stats?format=json&include_clients=false") - before
    assert 1 <= polls <= elapsed / 0.25 + 3  # two requests per poll would be twice this
    assert doomed_nsqd.log.count("GET /info") <= 1  # learnt once, not per poll


def test_overview_and_history_show_the_same_rate(
    cluster: Cluster, start_admin: StartAdmin, worker: tuple[str, NsqConn]
) -> None:
    """The topics list (an overview row) and the topic page (its history's newest point) show
    one figure for one poll: the same rates, from the same window."""
    topic, conn = worker
    admin = start_admin("--poll-interval=500ms")
    deadline = time.monotonic() + 40
    compared = 0
    rounds = 0
    while compared < 3 and time.monotonic() < deadline and rounds < 400:
        rounds += 1
        cluster.pub(topic, b"event", 0, 5 + 10 * (rounds % 3))  # bursty on purpose
        for _ in range(5 + 10 * (rounds % 3)):
            conn.fin(conn.expect_message().id)
        before = api(admin, "GET", "/api/overview")[1]
        status, history = api(admin, "GET", f"/api/history?topic={topic}")
        after = api(admin, "GET", "/api/overview")[1]
        row = next((r for r in after["topics"] if r["topic_name"] == topic), None)
        if status != 200 or row is None or not history["points"]:
            continue
        last = history["points"][-1]
        if before["updated_at"] != after["updated_at"] or last["t"] != after["updated_at"]:
            continue  # a poll landed between the requests: try again
        if row["rate_in"] == 0:
            continue
        assert (row["rate_in"], row["rate_out"]) == (last["rate_in"], last["rate_out"])
        assert row["history"]["rate_in"][-1] == last["rate_in"]
        assert row["history"]["t"][-1] == last["t"]
        status, channel = api(admin, "GET", f"/api/history?topic={topic}&channel=work")
        assert status == 200
        if channel["points"][-1]["t"] == last["t"]:
            assert channel["points"][-1]["rate_in"] == last["rate_in"]
        compared += 1
    assert compared == 3, f"only {compared} polls compared"


def test_a_backlog_that_stopped_growing_stops_being_flagged(
    cluster: Cluster, start_admin: StartAdmin
) -> None:
    topic = cluster.new_topic("filled")
    cluster.create_channel(topic, "stuck", 1)
    cluster.wait_registered(topic, 1)
    admin = start_admin("--poll-interval=200ms")

    def trend() -> float:
        row = overview_row(admin, topic)
        return float(row["depth_trend"]) if row is not None else 0.0

    def fill() -> float:
        cluster.pub(topic, b"m", 1, 10)
        time.sleep(0.1)
        return trend()

    wait_until(lambda: fill() > 0, what="a positive depth trend while filling", timeout=20.0)
    stopped = time.monotonic()
    # TREND_POLLS polls of 200 ms: the flag goes within ~2.4 s (generous on a loaded machine),
    # while the first, empty point stays in the 360-point history for 72 s.
    wait_until(lambda: trend() == 0.0, timeout=30, what="the trend to go flat after filling")
    assert time.monotonic() - stopped < 30
    status, history = api(admin, "GET", f"/api/history?topic={topic}")
    assert status == 200
    first = history["points"][0]
    assert first["depth"] + first["channel_depth"] < queued_now(cluster, topic)


def queued_now(cluster: Cluster, topic: str) -> int:
    stats = cluster.topic_stats(1, topic) or {}
    return int(stats.get("depth", 0)) + sum(c["depth"] for c in stats.get("channels") or [])
