"""Peeking at queues (--enable-inspect) never changes what consumers get next."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from nsqpy.nsqd.beyond.inspect import AUTH_SECRET_HEADER
from nsqpy.testing import DaemonProcess

from ..nsqd.nsqd_transport_support import AuthQuery, AuthServer
from ..raw_v2 import (
    NsqConn,
    channel_stats,
    decode_message,
    http_ok,
    http_request,
    q,
    unique,
    wait_until,
)
from .support import launch


def peek(nsqd: DaemonProcess, path: str, **params: str) -> list[dict[str, Any]]:
    resp = http_request(nsqd, "GET", f"{path}?{q(**params)}")
    assert resp.status == 200, resp.body
    messages = resp.json()["messages"]
    assert isinstance(messages, list)
    return messages


def test_channel_peek_memory_then_disk_changes_nothing(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(daemons, tmp_path, "--enable-inspect", "--mem-queue-size=3")
    topic = unique("peek")
    http_ok(nsqd, "POST", "/topic/create?" + q(topic=topic))
    http_ok(nsqd, "POST", "/channel/create?" + q(topic=topic, channel="c"))
    bodies = [b"msg-%d" % i for i in range(8)]  # 3 in memory, 5 on disk
    NsqConn(nsqd.tcp_address).mpub(topic, bodies)
    before = channel_stats(nsqd, topic, "c")
    assert before is not None and before["backend_depth"] == 5

    first = peek(nsqd, "/channel/peek", topic=topic, channel="c", n="6")
    again = peek(nsqd, "/channel/peek", topic=topic, channel="c", n="6")
    assert first == again
    assert [base64.b64decode(m["body"]) for m in first] == bodies[:6]
    assert all(m["attempts"] == 0 and len(m["id"]) == 16 for m in first)
    everything = peek(nsqd, "/channel/peek", topic=topic, channel="c", n="100")
    assert [base64.b64decode(m["body"]) for m in everything] == bodies

    raw = http_request(
        nsqd, "GET", "/channel/peek?" + q(topic=topic, channel="c", n="2", format="raw")
    )
    assert raw.status == 200
    records = []
    data = raw.body
    while data:
        (size,) = struct.unpack(">i", data[:4])
        records.append(decode_message(data[4 : 4 + size]))
        data = data[4 + size :]
    assert [r.body for r in records] == bodies[:2]
    assert [r.id.decode() for r in records] == [m["id"] for m in first[:2]]

    after = channel_stats(nsqd, topic, "c")
    assert after is not None
    for key in ("depth", "backend_depth", "in_flight_count", "requeue_count", "message_count"):
        assert after[key] == before[key], key

    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    consumer.rdy(8)
    got = [consumer.expect_message() for _ in range(8)]
    assert [m.body for m in got] == bodies  # same order
    assert [m.id.decode() for m in got] == [m["id"] for m in everything]
    assert all(m.attempts == 1 for m in got)  # peeking is not an attempt
    consumer.close()


@pytest.mark.parametrize("sync_every", ["2500", "1"])  # 1: held reads
def test_peek_after_partial_consumption_and_topic_peek(
    daemons: list[DaemonProcess], tmp_path: Path, sync_every: str
) -> None:
    """In-flight and deferred messages are not listed as queued, also when (--sync-every=1)
    their records stay in the channel's disk queue until they are finished."""
    nsqd = launch(
        daemons, tmp_path, "--enable-inspect", "--mem-queue-size=0", f"--sync-every={sync_every}"
    )
    topic = unique("peek2")
    NsqConn(nsqd.tcp_address).mpub(topic, [b"t%d" % i for i in range(5)])
    topic_view = peek(nsqd, "/topic/peek", topic=topic, n="10")
    assert [base64.b64decode(m["body"]) for m in topic_view] == [b"t%d" % i for i in range(5)]

    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    consumer.rdy(2)
    held = [consumer.expect_message() for _ in range(2)]
    consumer.rdy(0)
    rest = peek(nsqd, "/channel/peek", topic=topic, channel="c", n="10")
    assert [base64.b64decode(m["body"]) for m in rest] == [b"t2", b"t3", b"t4"]
    consumer.req(held[1].id, 60_000)
    NsqConn(nsqd.tcp_address).dpub(topic, 90_000, b"later")  # behind t2-t4 on disk
    inflight = peek(nsqd, "/channel/inflight", topic=topic, channel="c")
    assert [m["id"] for m in inflight] == [held[0].id.decode()]
    assert inflight[0]["attempts"] == 1 and inflight[0]["deadline"] > held[0].timestamp
    deferred = peek(nsqd, "/channel/deferred", topic=topic, channel="c")
    assert deferred[0]["id"] == held[1].id.decode() and deferred[0]["due"] > 0
    assert [base64.b64decode(m["body"]) for m in deferred][1:] == [b"later"]
    rest = peek(nsqd, "/channel/peek", topic=topic, channel="c", n="10")
    assert [base64.b64decode(m["body"]) for m in rest] == [b"t2", b"t3", b"t4"]
    assert (channel_stats(nsqd, topic, "c") or {}).get("depth") == 3

    consumer.fin(held[0].id)
    consumer.rdy(10)
    assert [consumer.expect_message().body for _ in range(3)] == [b"t2", b"t3", b"t4"]
    consumer.expect_nothing(0.3)
    consumer.close()


def test_inspect_is_off_by_default_and_validates(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    for sub in ("plain", "on"):
        (tmp_path / sub).mkdir()
    plain = launch(daemons, tmp_path / "plain")
    resp = http_request(plain, "GET", "/channel/peek?" + q(topic="a", channel="b"))
    assert resp.status == 404 and resp.json() == {"message": "NOT_FOUND"}
    nsqd = launch(daemons, tmp_path / "on", "--enable-inspect")
    assert http_request(nsqd, "GET", "/topic/peek?" + q(topic="nope")).status == 404
    http_ok(nsqd, "POST", "/topic/create?" + q(topic="x"))
    assert http_request(nsqd, "GET", "/topic/peek?" + q(topic="x", n="0")).status == 400
    assert http_request(nsqd, "GET", "/topic/peek?" + q(topic="x", n="abc")).status == 400
    assert http_request(nsqd, "GET", "/channel/peek?" + q(topic="x", channel="y")).status == 404


# --------------------------------------------------------------------------- behind AUTH

SUB_C = {"topic": "^guarded_", "channels": ["^c$"], "permissions": ["subscribe"]}
SUB_OTHER = {"topic": "^guarded_", "channels": ["^other$"], "permissions": ["subscribe"]}
PUBLISH = {"topic": ".*", "channels": [".*"], "permissions": ["publish"]}
GRANTS = {"reader": [SUB_C], "other-reader": [SUB_OTHER], "publisher": [PUBLISH]}


def answer_by_secret(query: AuthQuery) -> tuple[int, Any]:
    secret = parse_qs(urlsplit(query.path_qs).query).get("secret", [""])[0]
    if secret not in GRANTS:
        return 403, {"message": "unknown secret"}
    return 200, {"ttl": 3600, "authorizations": GRANTS[secret]}


@pytest.fixture
def authd() -> Iterator[AuthServer]:
    server = AuthServer(answer=answer_by_secret).start()
    yield server
    server.stop()


def inspect_as(nsqd: DaemonProcess, path: str, secret: str | None, **params: str) -> Any:
    headers = {} if secret is None else {AUTH_SECRET_HEADER: secret}
    resp = http_request(nsqd, "GET", f"{path}?{q(**params)}", headers=headers)
    return resp.status, resp.json()


def test_inspection_needs_the_grant_a_sub_needs(
    daemons: list[DaemonProcess], tmp_path: Path, authd: AuthServer
) -> None:
    nsqd = launch(daemons, tmp_path, "--enable-inspect", f"--auth-http-address={authd.address}")
    topic = unique("guarded")
    http_ok(nsqd, "POST", "/topic/create?" + q(topic=topic))
    http_ok(nsqd, "POST", "/channel/create?" + q(topic=topic, channel="c"))
    http_ok(nsqd, "POST", "/pub?" + q(topic=topic), b"private")
    channel_routes = ("/channel/peek", "/channel/inflight", "/channel/deferred")
    routes = [(path, {"topic": topic, "channel": "c"}) for path in channel_routes]
    routes.append(("/topic/peek", {"topic": topic}))

    for path, params in routes:
        assert inspect_as(nsqd, path, None, **params) == (401, {"message": "AUTH_REQUIRED"})
        assert inspect_as(nsqd, path, "", **params) == (401, {"message": "AUTH_REQUIRED"})
        assert inspect_as(nsqd, path, "nobody", **params) == (403, {"message": "AUTH_FAILED"})
        assert inspect_as(nsqd, path, "publisher", **params) == (403, {"message": "UNAUTHORIZED"})
        assert inspect_as(nsqd, path, "reader", **params)[0] == 200, path
    # a channel nobody may read is refused before it is looked up: its absence is not told
    missing = {"topic": unique("guarded"), "channel": "c"}
    assert inspect_as(nsqd, "/channel/peek", None, **missing)[0] == 401
    assert inspect_as(nsqd, "/channel/peek", "reader", **missing)[0] == 404
    # SUB to another channel of the topic: not this channel, but the topic's own queue
    # (every message of it reaches any channel)
    other = inspect_as(nsqd, "/channel/peek", "other-reader", topic=topic, channel="c")
    assert other == (403, {"message": "UNAUTHORIZED"})
    assert inspect_as(nsqd, "/topic/peek", "other-reader", topic=topic)[0] == 200

    status, found = inspect_as(nsqd, "/channel/peek", "reader", topic=topic, channel="c")
    assert status == 200
    assert [base64.b64decode(m["body"]) for m in found["messages"]] == [b"private"]
    # asked as AUTH asks, and once per secret while its answer's ttl lasts
    asked = [parse_qs(urlsplit(a.path_qs).query, True) for a in authd.queries]
    reader = [a for a in asked if a["secret"] == ["reader"]]
    assert len(reader) == 1
    assert reader[0] == {
        "common_name": [""],
        "remote_ip": ["127.0.0.1"],
        "secret": ["reader"],
        "tls": ["false"],
    }
    # the unknown secret, logged before the answer but read from stderr by another thread
    wait_until(lambda: "AUTH failed for 127.0.0.1" in nsqd.log, what="the auth failure logged")


def test_inspection_without_auth_needs_no_secret(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(daemons, tmp_path, "--enable-inspect")
    topic = unique("open")
    http_ok(nsqd, "POST", "/topic/create?" + q(topic=topic))
    http_ok(nsqd, "POST", "/channel/create?" + q(topic=topic, channel="c"))
    assert inspect_as(nsqd, "/channel/peek", None, topic=topic, channel="c") == (
        200,
        {"messages": []},
    )
