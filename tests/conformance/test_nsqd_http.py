"""nsqd HTTP API, black box: the scenarios of Go's http_test.go and the API's quirks (e.g.
``/stats`` for an unknown topic answers ``"topics":null``; ``/info`` durations are integer
nanoseconds)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import (
    BE32,
    HttpResponse,
    channel_stats,
    http_ok,
    http_request,
    pub_cmd,
    q,
    stats,
    topic_stats,
    unique,
)
from .conftest import DaemonPool, connect, create_channel, create_topic, http_pub, wait_channel

V1_HEADER = "nsq; version=1.0"
JSON_TYPE = "application/json; charset=utf-8"
PERCENTILES = (
    "--e2e-processing-latency-percentile=0.99",
    "--e2e-processing-latency-percentile=1.0",
)

TOPIC_KEYS = [
    "topic_name",
    "channels",
    "depth",
    "backend_depth",
    "message_count",
    "message_bytes",
    "paused",
    "e2e_processing_latency",
]
CHANNEL_KEYS = [
    "channel_name",
    "depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "message_count",
    "requeue_count",
    "timeout_count",
    "client_count",
    "clients",
    "paused",
    "e2e_processing_latency",
]
MEMORY_KEYS = [
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
]
NO_E2E = {"count": 0, "percentiles": None}


def assert_v1_error(resp: HttpResponse, status: int, message: str) -> None:
    assert (resp.status, resp.body) == (status, b'{"message":"%s"}' % message.encode())
    assert resp.header("X-NSQ-Content-Type") == V1_HEADER
    assert resp.header("Content-Type") == JSON_TYPE


def assert_v1_empty(resp: HttpResponse) -> None:
    assert (resp.status, resp.body) == (200, b"")
    assert resp.header("X-NSQ-Content-Type") == V1_HEADER


def post(daemon: DaemonProcess, path: str, body: bytes | None = None) -> HttpResponse:
    return http_request(daemon, "POST", path, body)


def get(daemon: DaemonProcess, path: str) -> HttpResponse:
    return http_request(daemon, "GET", path)


# --------------------------------------------------------------------------- /ping, /info


def test_ping(nsqd: DaemonProcess) -> None:
    resp = get(nsqd, "/ping")
    assert (resp.status, resp.body) == (200, b"OK")
    assert resp.header("X-NSQ-Content-Type") is None  # /ping is not a V1 route
    assert (resp.header("Content-Type") or "").startswith("text/plain")


def test_71_info(nsqd: DaemonProcess) -> None:
    resp = get(nsqd, "/info")
    assert resp.status == 200
    assert resp.header("X-NSQ-Content-Type") == V1_HEADER
    assert resp.header("Content-Type") == JSON_TYPE
    info = resp.json()
    keys = [k for k in info if k not in ("topology_zone", "topology_region")]
    assert keys == [
        "version",
        "broadcast_address",
        "hostname",
        "http_port",
        "tcp_port",
        "start_time",
        "max_heartbeat_interval",
        "max_output_buffer_size",
        "max_output_buffer_timeout",
        "max_deflate_level",
    ]
    assert resp.body.startswith(b'{"version":"1.3.0","broadcast_address":"127.0.0.1","hostname":')
    assert info["hostname"] == socket.gethostname()
    assert info["http_port"] == nsqd.http_port
    assert info["tcp_port"] == nsqd.tcp_port
    assert abs(info["start_time"] - time.time()) < 600
    # quirk 11: durations in /info are integer nanoseconds
    assert info["max_heartbeat_interval"] == 60_000_000_000
    assert info["max_output_buffer_size"] == 65536
    assert info["max_output_buffer_timeout"] == 30_000_000_000
    assert info["max_deflate_level"] == 6


# --------------------------------------------------------------------------- /pub


def test_54_pub(nsqd: DaemonProcess) -> None:
    topic = unique()
    resp = post(nsqd, f"/pub?topic={topic}", b"test message")
    assert (resp.status, resp.body) == (200, b"OK")
    assert resp.header("X-NSQ-Content-Type") == V1_HEADER
    t = topic_stats(nsqd, topic)
    assert t is not None
    assert (t["depth"], t["message_count"], t["message_bytes"]) == (1, 1, 12)


def test_pub_body_is_delivered_verbatim(nsqd: DaemonProcess) -> None:
    topic = unique()
    body = bytes(range(256)) + b"\r\n\n"
    with connect(nsqd) as conn:
        conn.sub(topic, "ch")
        assert post(nsqd, f"/pub?topic={topic}", body).body == b"OK"
        conn.rdy(1)
        msg = conn.expect_message()
    assert msg.body == body
    assert msg.attempts == 1


def test_55_pub_empty(nsqd: DaemonProcess) -> None:
    assert_v1_error(post(nsqd, f"/pub?topic={unique()}", b""), 400, "MSG_EMPTY")


def test_pub_body_checks_come_before_the_query(nsqd: DaemonProcess) -> None:
    assert_v1_error(post(nsqd, "/pub", b""), 400, "MSG_EMPTY")
    assert_v1_error(post(nsqd, "/pub?topic=bad!", b""), 400, "MSG_EMPTY")


@pytest.mark.parametrize(
    "query,message",
    [
        ("", "MISSING_ARG_TOPIC"),
        ("?channel=x", "MISSING_ARG_TOPIC"),
        ("?topic=", "INVALID_TOPIC"),
        ("?topic=bad!", "INVALID_TOPIC"),
        ("?topic=" + "x" * 65, "INVALID_TOPIC"),
    ],
)
def test_pub_query_errors(nsqd: DaemonProcess, query: str, message: str) -> None:
    assert_v1_error(post(nsqd, "/pub" + query, b"x"), 400, message)


def test_pub_first_topic_value_wins(nsqd: DaemonProcess) -> None:
    first, second = unique(), unique()
    assert post(nsqd, f"/pub?topic={first}&topic={second}", b"x").body == b"OK"
    assert topic_stats(nsqd, first) is not None
    assert topic_stats(nsqd, second) is None


def test_pub_too_big(nsqd_pool: DaemonPool) -> None:
    daemon = nsqd_pool.get("--max-msg-size=100", "--max-body-size=1000")
    assert post(daemon, f"/pub?topic={unique()}", b"x" * 100).body == b"OK"
    assert_v1_error(post(daemon, f"/pub?topic={unique()}", b"x" * 101), 413, "MSG_TOO_BIG")


def test_58_pub_defer(nsqd: DaemonProcess) -> None:
    topic = unique()
    create_channel(nsqd, topic, "ch")
    assert post(nsqd, f"/pub?topic={topic}&defer=1000", b"later").body == b"OK"
    ch = wait_channel(nsqd, topic, "ch", deferred_count=1)
    assert ch["depth"] == 0
    assert ch["message_count"] == 1


@pytest.mark.parametrize("value", ["-1", "3600001", "abc", "1.5", ""])
def test_59_pub_invalid_defer(nsqd: DaemonProcess, value: str) -> None:
    assert_v1_error(post(nsqd, f"/pub?topic={unique()}&defer={value}", b"x"), 400, "INVALID_DEFER")


def test_pub_topic_is_created_before_defer_is_checked(nsqd: DaemonProcess) -> None:
    topic = unique()
    assert_v1_error(post(nsqd, f"/pub?topic={topic}&defer=-1", b"x"), 400, "INVALID_DEFER")
    t = topic_stats(nsqd, topic)
    assert t is not None and t["message_count"] == 0


def test_pub_defer_at_the_max_is_accepted(nsqd: DaemonProcess) -> None:
    assert post(nsqd, f"/pub?topic={unique()}&defer=3600000", b"x").body == b"OK"


def test_pub_get_is_not_allowed(nsqd: DaemonProcess) -> None:
    assert_v1_error(get(nsqd, f"/pub?topic={unique()}"), 405, "METHOD_NOT_ALLOWED")


# --------------------------------------------------------------------------- /mpub


@pytest.mark.parametrize("body", [b"m\nm\nm\nm", b"m\nm\nm\nm\n"])
def test_56_mpub_text(nsqd: DaemonProcess, body: bytes) -> None:
    topic = unique()
    resp = post(nsqd, f"/mpub?topic={topic}", body)
    assert (resp.status, resp.body) == (200, b"OK")
    t = topic_stats(nsqd, topic)
    assert t is not None and t["depth"] == 4


def test_mpub_text_skips_empty_lines_and_keeps_cr(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as conn:
        conn.sub(topic, "ch")
        assert post(nsqd, f"/mpub?topic={topic}", b"a\r\n\n\nb\n").body == b"OK"
        conn.rdy(5)
        bodies = sorted(conn.expect_message().body for _ in range(2))
        conn.expect_nothing(0.3)
    assert bodies == [b"a\r", b"b"]


def test_mpub_empty_body_publishes_nothing(nsqd: DaemonProcess) -> None:
    topic = unique()
    assert post(nsqd, f"/mpub?topic={topic}", b"").body == b"OK"
    t = topic_stats(nsqd, topic)
    assert t is not None and t["message_count"] == 0


def binary_body(bodies: list[bytes]) -> bytes:
    return BE32.pack(len(bodies)) + b"".join(BE32.pack(len(b)) + b for b in bodies)


@pytest.mark.parametrize("flag", ["true", "1", "non_normalized_binary_param", "yes"])
def test_57_mpub_binary(nsqd: DaemonProcess, flag: str) -> None:
    topic = unique()
    body = binary_body([bytes([i]) * 100 for i in range(5)])
    assert post(nsqd, f"/mpub?topic={topic}&binary={flag}", body).body == b"OK"
    t = topic_stats(nsqd, topic)
    assert t is not None and t["depth"] == 5 and t["message_bytes"] == 500


@pytest.mark.parametrize("flag", ["false", "0"])
def test_mpub_binary_false_is_text(nsqd: DaemonProcess, flag: str) -> None:
    topic = unique()
    assert post(nsqd, f"/mpub?topic={topic}&binary={flag}", b"a\nb").body == b"OK"
    t = topic_stats(nsqd, topic)
    assert t is not None and t["depth"] == 2


@pytest.mark.parametrize(
    "body,message",
    [
        (b"", "BAD_BODY"),  # failed to read message count
        (BE32.pack(0), "BAD_BODY"),  # invalid message count
        (BE32.pack(1) + BE32.pack(0), "BAD_MESSAGE"),  # invalid message(0) body size
        (BE32.pack(1) + BE32.pack(5) + b"ab", "BAD_MESSAGE"),  # failed to read body
        (BE32.pack(1) + BE32.pack(1048577), "BAD_MESSAGE"),  # message too big
    ],
)
def test_mpub_binary_errors(nsqd: DaemonProcess, body: bytes, message: str) -> None:
    assert_v1_error(post(nsqd, f"/mpub?topic={unique()}&binary=true", body), 413, message)


def test_mpub_text_message_too_big(nsqd_pool: DaemonPool) -> None:
    daemon = nsqd_pool.get("--max-msg-size=100", "--max-body-size=1000")
    assert_v1_error(
        post(daemon, f"/mpub?topic={unique()}", b"x\n" + b"y" * 101), 413, "MSG_TOO_BIG"
    )
    assert_v1_error(post(daemon, f"/mpub?topic={unique()}", b"x\n" * 501), 413, "BODY_TOO_BIG")


@pytest.mark.parametrize(
    "query,message",
    [
        ("", "MISSING_ARG_TOPIC"),
        ("?topic=bad!", "INVALID_TOPIC"),
    ],
)
def test_mpub_query_errors(nsqd: DaemonProcess, query: str, message: str) -> None:
    assert_v1_error(post(nsqd, "/mpub" + query, b"a\nb"), 400, message)


def test_quirk15_mpub_ignores_defer(nsqd: DaemonProcess) -> None:
    topic = unique()
    create_channel(nsqd, topic, "ch")
    assert post(nsqd, f"/mpub?topic={topic}&defer=60000", b"a\nb").body == b"OK"
    ch = wait_channel(nsqd, topic, "ch", depth=2)
    assert ch["deferred_count"] == 0


# --------------------------------------------------------------------------- topics and channels


def test_62_topic_and_channel_lifecycle(nsqd: DaemonProcess) -> None:
    topic = unique()
    resp = post(nsqd, f"/topic/create?topic={topic}")
    assert_v1_empty(resp)
    assert_v1_empty(post(nsqd, f"/channel/create?topic={topic}&channel=ch2"))
    assert_v1_error(post(nsqd, "/topic/pause"), 400, "MISSING_ARG_TOPIC")
    assert_v1_error(post(nsqd, f"/topic/pause?topic={topic}abc"), 404, "TOPIC_NOT_FOUND")

    assert_v1_empty(post(nsqd, f"/topic/pause?topic={topic}"))
    t = topic_stats(nsqd, topic)
    assert t is not None and t["paused"] is True
    assert_v1_empty(post(nsqd, f"/topic/unpause?topic={topic}"))
    t = topic_stats(nsqd, topic)
    assert t is not None and t["paused"] is False

    assert_v1_empty(post(nsqd, f"/channel/pause?topic={topic}&channel=ch2"))
    ch = channel_stats(nsqd, topic, "ch2")
    assert ch is not None and ch["paused"] is True
    assert_v1_empty(post(nsqd, f"/channel/unpause?topic={topic}&channel=ch2"))
    ch = channel_stats(nsqd, topic, "ch2")
    assert ch is not None and ch["paused"] is False

    assert_v1_empty(post(nsqd, f"/channel/delete?topic={topic}&channel=ch2"))
    assert channel_stats(nsqd, topic, "ch2") is None
    assert_v1_empty(post(nsqd, f"/topic/delete?topic={topic}"))
    assert topic_stats(nsqd, topic) is None


@pytest.mark.parametrize(
    "query,status,message",
    [
        ("", 400, "MISSING_ARG_TOPIC"),
        ("?topic=", 400, "INVALID_TOPIC"),
        ("?topic=name$", 400, "INVALID_TOPIC"),
    ],
)
def test_topic_create_errors(nsqd: DaemonProcess, query: str, status: int, message: str) -> None:
    assert_v1_error(post(nsqd, "/topic/create" + query), status, message)


def test_topic_create_is_idempotent(nsqd: DaemonProcess) -> None:
    topic = unique()
    assert_v1_empty(post(nsqd, f"/topic/create?topic={topic}"))
    http_pub(nsqd, topic, b"x")
    assert_v1_empty(post(nsqd, f"/topic/create?topic={topic}"))
    t = topic_stats(nsqd, topic)
    assert t is not None and t["depth"] == 1


def test_topic_pause_does_not_validate_the_name(nsqd: DaemonProcess) -> None:
    assert_v1_error(post(nsqd, "/topic/pause?topic=bad!"), 404, "TOPIC_NOT_FOUND")
    assert_v1_error(post(nsqd, "/topic/unpause?topic=bad!"), 404, "TOPIC_NOT_FOUND")


def test_68_delete_topic(nsqd: DaemonProcess) -> None:
    topic = unique()
    assert_v1_error(post(nsqd, "/topic/delete"), 400, "MISSING_ARG_TOPIC")
    assert_v1_error(post(nsqd, f"/topic/delete?topic={topic}"), 404, "TOPIC_NOT_FOUND")
    assert_v1_error(post(nsqd, "/topic/delete?topic=bad!"), 404, "TOPIC_NOT_FOUND")
    create_channel(nsqd, topic, "ch")
    http_pub(nsqd, topic, b"x")
    assert_v1_empty(post(nsqd, f"/topic/delete?topic={topic}"))
    assert topic_stats(nsqd, topic) is None


def test_topic_delete_closes_its_consumers(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as conn:
        conn.sub(topic, "ch")
        assert_v1_empty(post(nsqd, f"/topic/delete?topic={topic}"))
        conn.expect_closed()


def test_69_empty_topic(nsqd: DaemonProcess) -> None:
    topic = unique()
    assert_v1_error(post(nsqd, "/topic/empty"), 400, "MISSING_ARG_TOPIC")
    assert_v1_error(post(nsqd, "/topic/empty?topic=name$"), 400, "INVALID_TOPIC")
    assert_v1_error(post(nsqd, f"/topic/empty?topic={topic}"), 404, "TOPIC_NOT_FOUND")
    for i in range(3):
        http_pub(nsqd, topic, b"%d" % i)
    assert_v1_empty(post(nsqd, f"/topic/empty?topic={topic}"))
    t = topic_stats(nsqd, topic)
    assert t is not None and t["depth"] == 0 and t["message_count"] == 3


def test_70_empty_channel(nsqd: DaemonProcess) -> None:
    topic = unique()
    assert_v1_error(post(nsqd, "/channel/empty"), 400, "MISSING_ARG_TOPIC")
    assert_v1_error(post(nsqd, f"/channel/empty?topic={topic}"), 400, "MISSING_ARG_CHANNEL")
    assert_v1_error(post(nsqd, f"/channel/empty?topic={topic}&channel=ch"), 404, "TOPIC_NOT_FOUND")
    create_topic(nsqd, topic)
    assert_v1_error(
        post(nsqd, f"/channel/empty?topic={topic}&channel=ch"), 404, "CHANNEL_NOT_FOUND"
    )
    create_channel(nsqd, topic, "ch")
    for i in range(3):
        http_pub(nsqd, topic, b"%d" % i)
    wait_channel(nsqd, topic, "ch", depth=3)
    assert_v1_empty(post(nsqd, f"/channel/empty?topic={topic}&channel=ch"))
    ch = channel_stats(nsqd, topic, "ch")
    assert ch is not None and ch["depth"] == 0


def test_channel_empty_discards_in_flight_and_deferred(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as conn:
        conn.sub(topic, "ch")
        http_pub(nsqd, topic, b"a")
        assert post(nsqd, f"/pub?topic={topic}&defer=600000", b"b").body == b"OK"
        conn.rdy(1)
        conn.expect_message()
        wait_channel(nsqd, topic, "ch", in_flight_count=1, deferred_count=1)
        assert_v1_empty(post(nsqd, f"/channel/empty?topic={topic}&channel=ch"))
        ch = channel_stats(nsqd, topic, "ch")
        assert ch is not None
        assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"]) == (0, 0, 0)
        assert ch["clients"][0]["in_flight_count"] == 0


@pytest.mark.parametrize(
    "path", ["/channel/create", "/channel/delete", "/channel/pause", "/channel/unpause"]
)
def test_channel_route_errors(nsqd: DaemonProcess, path: str) -> None:
    topic = unique()
    assert_v1_error(post(nsqd, path), 400, "MISSING_ARG_TOPIC")
    assert_v1_error(post(nsqd, f"{path}?topic=bad!&channel=ch"), 400, "INVALID_ARG_TOPIC")
    assert_v1_error(post(nsqd, f"{path}?topic={topic}"), 400, "MISSING_ARG_CHANNEL")
    assert_v1_error(post(nsqd, f"{path}?topic={topic}&channel=bad!"), 400, "INVALID_ARG_CHANNEL")
    assert_v1_error(post(nsqd, f"{path}?topic={topic}&channel=ch"), 404, "TOPIC_NOT_FOUND")


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/pub?topic=%zz"),
        ("POST", "/mpub?topic=%zz"),
        ("POST", "/topic/create?topic=%zz"),
        ("POST", "/topic/delete?topic=%zz"),
        ("POST", "/topic/empty?topic=%zz"),
        ("POST", "/topic/pause?topic=%zz"),
        ("POST", "/channel/create?topic=%zz&channel=ch"),
        ("POST", "/channel/empty?topic=t&channel=%zz"),
        ("GET", "/stats?format=json&topic=%zz"),
    ],
)
def test_bad_query_string_is_invalid_request(nsqd: DaemonProcess, method: str, path: str) -> None:
    # Go's url.ParseQuery rejects a bad percent escape; the handlers answer INVALID_REQUEST
    assert_v1_error(http_request(nsqd, method, path, b"x"), 400, "INVALID_REQUEST")


@pytest.mark.parametrize("path", ["/channel/delete", "/channel/pause", "/channel/unpause"])
def test_channel_not_found(nsqd: DaemonProcess, path: str) -> None:
    topic = unique()
    create_topic(nsqd, topic)
    assert_v1_error(post(nsqd, f"{path}?topic={topic}&channel=nope"), 404, "CHANNEL_NOT_FOUND")


def test_channel_delete_closes_its_consumers(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as conn:
        conn.sub(topic, "ch")
        assert_v1_empty(post(nsqd, f"/channel/delete?topic={topic}&channel=ch"))
        conn.expect_closed()


def test_ephemeral_names_over_http(nsqd: DaemonProcess) -> None:
    topic = unique() + "#ephemeral"
    assert_v1_empty(post(nsqd, f"/topic/create?{q(topic=topic)}"))
    assert_v1_empty(post(nsqd, f"/channel/create?{q(topic=topic, channel='c#ephemeral')}"))
    assert channel_stats(nsqd, topic, "c#ephemeral") is not None


# --------------------------------------------------------------------------- errors, routing


def test_67_errors(nsqd: DaemonProcess) -> None:
    assert_v1_error(post(nsqd, "/stats"), 405, "METHOD_NOT_ALLOWED")
    assert_v1_error(get(nsqd, "/not_found"), 404, "NOT_FOUND")
    assert_v1_error(get(nsqd, "/topic/create"), 405, "METHOD_NOT_ALLOWED")
    assert_v1_error(http_request(nsqd, "DELETE", "/info"), 405, "METHOD_NOT_ALLOWED")


def test_router_options_allow_and_no_implicit_head(nsqd: DaemonProcess) -> None:
    """httprouter answers OPTIONS with the path's methods, names them in Allow on a 405, and
    does not serve HEAD for GET routes."""
    options = http_request(nsqd, "OPTIONS", "/stats")
    assert options.status == 200 and options.headers["Allow"] == "GET, OPTIONS"
    assert http_request(nsqd, "OPTIONS", "/config/log_level").headers["Allow"] == (
        "GET, PUT, OPTIONS"
    )
    head = http_request(nsqd, "HEAD", "/stats")
    assert head.status == 405 and head.headers["Allow"] == "GET, OPTIONS"
    assert post(nsqd, "/stats").headers["Allow"] == "GET, OPTIONS"


@pytest.mark.parametrize("path", ["/", "/create_topic", "/stats/x", "/topic", "/pub2", "/info/x"])
def test_unknown_paths(nsqd: DaemonProcess, path: str) -> None:
    assert_v1_error(get(nsqd, path), 404, "NOT_FOUND")


def test_trailing_slash_redirects(nsqd: DaemonProcess) -> None:
    resp = get(nsqd, "/stats/")
    assert resp.status == 301
    assert (resp.header("Location") or "").endswith("/stats")
    resp = post(nsqd, f"/topic/create/?topic={unique()}")
    assert resp.status in (307, 308)


def test_post_body_form_params_are_ignored(nsqd: DaemonProcess) -> None:
    resp = http_request(
        nsqd,
        "POST",
        "/topic/create",
        b"topic=" + unique().encode(),
        {"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert_v1_error(resp, 400, "MISSING_ARG_TOPIC")


# --------------------------------------------------------------------------- /stats


def test_64_fresh_stats(fresh_nsqd: DaemonProcess) -> None:
    body = get(fresh_nsqd, "/stats?format=json").body
    assert re.match(
        rb'^\{"version":"1\.3\.0","health":"OK","start_time":\d+,"topics":\[\],"memory":\{', body
    ), body[:200]
    data = json.loads(body)
    assert list(data) == ["version", "health", "start_time", "topics", "memory", "producers"]
    assert list(data["memory"]) == MEMORY_KEYS
    assert all(isinstance(v, int) and v >= 0 for v in data["memory"].values())
    assert data["producers"] is None
    assert body.endswith(b',"producers":null}')


def test_stats_memory_reports_the_collector_pauses(tmp_path: Path) -> None:
    # Go reports its collector's pauses here; ours are the cycle collector's, each a stop of
    # the event loop. 30,000 messages kept in memory make CPython collect its young objects.
    daemon = start_nsqd(tmp_path, "--mem-queue-size=50000")
    try:
        topic = unique()
        create_channel(daemon, topic, "c")
        conn = connect(daemon)
        count = 30_000
        conn.send(pub_cmd(topic, b"m") * count)
        for _ in range(count):
            assert conn.read_frame(skip_heartbeats=True) == (0, b"OK")
        memory = stats(daemon)["memory"]
        assert memory["gc_total_runs"] > 0
        assert memory["gc_pause_usec_100"] >= memory["gc_pause_usec_99"]
        assert memory["gc_pause_usec_99"] >= memory["gc_pause_usec_95"]
        assert memory["gc_pause_usec_100"] > 0
    finally:
        daemon.stop()


def test_stats_exact_bytes_for_one_topic(nsqd: DaemonProcess) -> None:
    topic = unique()
    create_channel(nsqd, topic, "ch")
    http_pub(nsqd, topic, b"hello")
    wait_channel(nsqd, topic, "ch", depth=1)
    resp = get(nsqd, f"/stats?format=json&topic={topic}&include_mem=false")
    assert resp.header("Content-Type") == JSON_TYPE
    assert resp.header("X-NSQ-Content-Type") == V1_HEADER
    start = resp.json()["start_time"]
    expected = (
        (
            '{"version":"1.3.0","health":"OK","start_time":START,"topics":[{"topic_name":"TOPIC",'
            '"channels":[{"channel_name":"ch","depth":1,"backend_depth":0,"in_flight_count":0,'
            '"deferred_count":0,"message_count":1,"requeue_count":0,"timeout_count":0,'
            '"client_count":0,"clients":[],"paused":false,'
            '"e2e_processing_latency":{"count":0,"percentiles":null}}],'
            '"depth":0,"backend_depth":0,"message_count":1,"message_bytes":5,"paused":false,'
            '"e2e_processing_latency":{"count":0,"percentiles":null}}],"producers":null}'
        )
        .replace("START", str(start))
        .replace("TOPIC", topic)
    )
    assert resp.body == expected.encode()


def test_63_client_stats(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as conn:
        conn.sub(topic, "ch")
        data = stats(nsqd, f"&topic={topic}")
        ch = data["topics"][0]["channels"][0]
        assert len(ch["clients"]) == 1
        assert ch["client_count"] == 1
        assert "memory" in data

        data = stats(nsqd, f"&topic={topic}&include_clients=false")
        ch = data["topics"][0]["channels"][0]
        assert ch["clients"] is None
        assert ch["client_count"] == 1
        assert data["producers"] is None

        data = stats(nsqd, f"&topic={topic}&include_mem=false")
        assert "memory" not in data
        assert list(data) == ["version", "health", "start_time", "topics", "producers"]


def test_stats_key_orders(nsqd: DaemonProcess) -> None:
    topic = unique()
    create_channel(nsqd, topic, "ch")
    data = stats(nsqd, f"&topic={topic}")
    t = data["topics"][0]
    assert list(t) == TOPIC_KEYS
    assert list(t["channels"][0]) == CHANNEL_KEYS
    assert t["e2e_processing_latency"] == NO_E2E
    assert t["channels"][0]["e2e_processing_latency"] == NO_E2E


def test_quirk9_stats_filters(nsqd: DaemonProcess) -> None:
    topic = unique()
    other = unique()
    create_channel(nsqd, topic, "a")
    create_channel(nsqd, topic, "b")
    create_channel(nsqd, other, "b")

    body = get(nsqd, f"/stats?format=json&topic={unique()}&include_mem=false").body
    assert body.endswith(b',"topics":null,"producers":null}')

    data = stats(nsqd, f"&topic={topic}&channel=nope")
    assert data["topics"] == []

    data = stats(nsqd, f"&topic={topic}&channel=b")
    assert [c["channel_name"] for c in data["topics"][0]["channels"]] == ["b"]

    names = {t["topic_name"]: t for t in stats(nsqd, "&channel=a")["topics"]}
    assert topic in names and other not in names
    assert [c["channel_name"] for c in names[topic]["channels"]] == ["a"]


def test_stats_sorts_topics_and_channels(nsqd: DaemonProcess) -> None:
    base = unique()
    for suffix in ("c", "a", "b"):
        create_channel(nsqd, f"{base}_{suffix}", "z")
        http_ok(nsqd, "POST", f"/channel/create?topic={base}_{suffix}&channel=y")
    names = [t["topic_name"] for t in stats(nsqd)["topics"]]
    assert names == sorted(names)
    t = topic_stats(nsqd, f"{base}_a")
    assert t is not None
    assert [c["channel_name"] for c in t["channels"]] == ["y", "z"]


def test_stats_producers(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as conn:
        conn.identify(client_id="http-stats-producer")
        conn.pub(topic, b"x")
        producers = stats(nsqd)["producers"]
        assert isinstance(producers, list)
        mine = [p for p in producers if p["client_id"] == "http-stats-producer"]
        assert len(mine) == 1
        assert mine[0]["pub_counts"] == [{"topic": topic, "count": 1}]
        assert stats(nsqd, "&include_clients=false")["producers"] is None


def test_65_stats_text(nsqd: DaemonProcess) -> None:
    topic = unique()
    create_channel(nsqd, topic, "ch")
    for path in ("/stats?format=text", "/stats", "/stats?format=xml"):
        resp = get(nsqd, path)
        assert resp.status == 200
        assert resp.header("X-NSQ-Content-Type") == V1_HEADER
        text = resp.body.decode()
        assert text.startswith("nsqd v1.3.0 (built w/")
        assert "\nstart_time " in text
        assert "\nuptime " in text
        assert "\nHealth: OK\n" in text
        topic_line = f"\n   [{topic:<15}] depth: 0     be-depth: 0     msgs: 0        e2e%: \n"
        channel_line = (
            f"      [{'ch':<25}] depth: 0     be-depth: 0     inflt: 0    def: 0    "
            "re-q: 0     timeout: 0     msgs: 0        e2e%: \n"
        )
        assert topic_line + channel_line in text


def test_stats_text_without_topics(fresh_nsqd: DaemonProcess) -> None:
    text = get(fresh_nsqd, "/stats?include_mem=false").body.decode()
    assert "\nTopics: None\n" in text
    assert "Memory:" not in text


# --------------------------------------------------------------------------- quirk 10: JSON


def test_quirk10_html_characters_escaped_in_stats(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as conn:
        conn.identify_json(user_agent="<script>&")
        conn.sub(topic, "ch")
        body = get(nsqd, f"/stats?format=json&topic={topic}").body
    assert b'"user_agent":"\\u003cscript\\u003e\\u0026"' in body


def test_quirk10_percentiles_and_integral_floats(nsqd_pool: DaemonPool) -> None:
    daemon = nsqd_pool.get(*PERCENTILES)
    topic = unique()
    create_topic(daemon, topic)
    raw = get(daemon, f"/stats?format=json&topic={topic}").body
    assert b'"e2e_processing_latency":{"count":0,"percentiles":null}' in raw  # no channels yet
    create_channel(daemon, topic, "ch")
    raw = get(daemon, f"/stats?format=json&topic={topic}").body
    zero = b'{"count":0,"percentiles":[{"quantile":1,"value":0},{"quantile":0.99,"value":0}]}'
    assert raw.count(b'"e2e_processing_latency":' + zero) == 2  # channel and topic
    with connect(daemon) as conn:
        conn.sub(topic, "ch")
        http_pub(daemon, topic, b"x")
        conn.rdy(1)
        msg = conn.expect_message()
        conn.fin(msg.id)
        ch = wait_channel(daemon, topic, "ch", in_flight_count=0)
    e2e = ch["e2e_processing_latency"]
    assert e2e["count"] == 1
    assert [p["quantile"] for p in e2e["percentiles"]] == [1, 0.99]
    assert all(p["value"] > 0 for p in e2e["percentiles"])
    assert list(e2e["percentiles"][0]) == ["quantile", "value"]


# --------------------------------------------------------------------------- /config


@pytest.fixture
def config_nsqd(nsqd_pool: DaemonPool) -> Iterator[DaemonProcess]:
    daemon = nsqd_pool.get("--log-prefix=[config-test] ")
    yield daemon
    http_request(daemon, "PUT", "/config/nsqlookupd_tcp_addresses", b"[]")
    http_request(daemon, "PUT", "/config/log_level", b"info")


def test_66_config(config_nsqd: DaemonProcess) -> None:
    daemon = config_nsqd
    resp = get(daemon, "/config/nsqlookupd_tcp_addresses")
    assert (resp.status, resp.body) == (200, b"[]")
    assert resp.header("X-NSQ-Content-Type") == V1_HEADER
    assert resp.header("Content-Type") == JSON_TYPE

    addresses = b'["127.0.0.1:1","127.0.0.1:2"]'
    resp = http_request(daemon, "PUT", "/config/nsqlookupd_tcp_addresses", addresses)
    assert (resp.status, resp.body) == (200, addresses)
    assert get(daemon, "/config/nsqlookupd_tcp_addresses").body == addresses

    resp = http_request(daemon, "PUT", "/config/log_level", b"fatal")
    assert (resp.status, resp.body) == (200, b"5")
    assert get(daemon, "/config/log_level").body == b"5"
    resp = http_request(daemon, "PUT", "/config/log_level", b"bad")
    assert_v1_error(resp, 400, "INVALID_VALUE")
    assert get(daemon, "/config/log_level").body == b"5"


def test_config_errors(config_nsqd: DaemonProcess) -> None:
    daemon = config_nsqd
    assert_v1_error(get(daemon, "/config/no_such_option"), 400, "INVALID_OPTION")
    assert_v1_error(get(daemon, "/config/mem-queue-size"), 400, "INVALID_OPTION")
    resp = http_request(daemon, "PUT", "/config/mem_queue_size", b"5")
    assert_v1_error(resp, 400, "INVALID_OPTION")
    resp = http_request(daemon, "PUT", "/config/log_level", b"")
    assert_v1_error(resp, 413, "INVALID_VALUE")
    resp = http_request(daemon, "PUT", "/config/nsqlookupd_tcp_addresses", b"not json")
    assert_v1_error(resp, 400, "INVALID_VALUE")
    assert_v1_error(
        http_request(daemon, "POST", "/config/log_level", b"x"), 405, "METHOD_NOT_ALLOWED"
    )


@pytest.mark.parametrize(
    "name,value",
    [
        ("msg_timeout", b"60000000000"),  # quirk 11: integer nanoseconds
        ("max_msg_timeout", b"900000000000"),
        ("mem_queue_size", b"10000"),
        ("max_msg_size", b"1048576"),
        ("log_level", b"2"),
        ("e2e_processing_latency_percentiles", b"[]"),
        ("auth_http_addresses", b"[]"),
        ("tcp_address", b'"127.0.0.1:0"'),
        ("statsd_prefix", b'"nsq.%s"'),
        ("snappy", b"true"),
    ],
)
def test_config_values(config_nsqd: DaemonProcess, name: str, value: bytes) -> None:
    resp = get(config_nsqd, f"/config/{name}")
    assert (resp.status, resp.body) == (200, value)


def test_config_node_id_uses_its_cfg_name(config_nsqd: DaemonProcess) -> None:
    resp = get(config_nsqd, "/config/id")
    assert resp.status == 200
    assert 0 <= int(resp.body) < 1024
    assert_v1_error(get(config_nsqd, "/config/node_id"), 400, "INVALID_OPTION")


# --------------------------------------------------------------------------- quirk 13: TLS


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    openssl = shutil.which("openssl")
    assert openssl is not None, "the TLS tests need the openssl CLI (apt-get install openssl)"
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(cert), str(key)


def _start_tls(tmp_path: Path, tls_files: tuple[str, str], required: str) -> DaemonProcess:
    cert, key = tls_files
    return start_nsqd(
        tmp_path,
        f"--tls-cert={cert}",
        f"--tls-key={key}",
        f"--tls-required={required}",
        "--https-address=127.0.0.1:0",
        https=True,
        timeout=8.0,
    )


def _https_get(daemon: DaemonProcess, path: str) -> tuple[int, bytes]:
    import http.client

    host, port = daemon.addresses["HTTPS"]
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    conn = http.client.HTTPSConnection(host, port, timeout=5, context=context)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_quirk13_tls_required_http_body(tmp_path: Path, tls_files: tuple[str, str]) -> None:
    daemon = _start_tls(tmp_path, tls_files, "true")
    try:
        https_port = daemon.addresses["HTTPS"][1]
        for path in ("/ping", "/stats", "/no/such/path"):
            resp = get(daemon, path)
            assert resp.status == 403
            assert resp.body == b'{"message": "TLS_REQUIRED", "https_port": %d}' % https_port
            assert resp.header("X-NSQ-Content-Type") == V1_HEADER
            assert resp.header("Content-Type") == JSON_TYPE
        assert _https_get(daemon, "/ping") == (200, b"OK")
    finally:
        daemon.stop()


def test_tls_required_tcp_https_leaves_plain_http(
    tmp_path: Path, tls_files: tuple[str, str]
) -> None:
    daemon = _start_tls(tmp_path, tls_files, "tcp-https")
    try:
        assert get(daemon, "/ping").body == b"OK"
        assert post(daemon, f"/pub?topic={unique()}", b"x").body == b"OK"
        with connect(daemon) as conn:
            conn.send(f"SUB {unique()} ch\n".encode())
            conn.expect_error("E_INVALID cannot SUB in current state (TLS required)")
        with connect(daemon) as conn:
            conn.send(b"BOGUS\n")
            conn.expect_error("E_INVALID cannot BOGUS in current state (TLS required)")
    finally:
        daemon.stop()
