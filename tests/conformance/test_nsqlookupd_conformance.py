"""nsqlookupd black-box: the scenarios of Go's nsqlookupd_test.go, http_test.go and
lookup_protocol_v1_test.go, plus the details of its TCP protocol (responses carry no frame type,
unlike nsqd's) and HTTP API, over real sockets against a real ``python -m nsqpy.nsqlookupd``
process."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import time
from collections.abc import Iterator
from operator import not_
from typing import Any

import pytest

from nsqpy.testing import DaemonProcess, start_nsqlookupd

from ..raw_v2 import wait_for

HOST_ADDR = "ip.address"
TCP_PORT = 5000
HTTP_PORT = 5555
NSQD_VERSION = "fake-version"
IDENTITY = {
    "broadcast_address": HOST_ADDR,
    "hostname": HOST_ADDR,
    "http_port": HTTP_PORT,
    "tcp_port": TCP_PORT,
    "version": NSQD_VERSION,
}
V1_HEADER = ("X-NSQ-Content-Type", "nsq; version=1.0")
JSON_TYPE = "application/json; charset=utf-8"


def be32(n: int) -> bytes:
    return struct.pack(">i", n)


def sized(data: bytes) -> bytes:
    return be32(len(data)) + data


def identify_cmd(info: dict[str, Any]) -> bytes:
    body = json.dumps(info, separators=(",", ":"), sort_keys=True).encode()
    return b"IDENTIFY\n" + sized(body)


class Conn:
    """One nsqd-like TCP connection to the lookupd under test."""

    def __init__(self, lookupd: DaemonProcess, magic: bytes = b"  V1") -> None:
        self.sock = socket.create_connection(lookupd.tcp_address, timeout=5)
        if magic:
            self.sock.sendall(magic)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise EOFError(f"closed after {out!r}")
            out += chunk
        return out

    def read_raw_response(self) -> bytes:
        """``BE32(len) data`` exactly as received."""
        header = self.read_exact(4)
        return header + self.read_exact(struct.unpack(">i", header)[0])

    def command(self, data: bytes) -> bytes:
        self.send(data)
        return self.read_raw_response()[4:]

    def identify(self, info: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = self.command(identify_cmd(info or IDENTITY))
        result: dict[str, Any] = json.loads(reply)
        return result

    def assert_closed(self) -> None:
        """The server closes the connection (EOF or reset) with nothing more to say."""
        try:
            assert self.sock.recv(1) == b""
        except ConnectionResetError:
            pass

    @property
    def local_address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    def close(self) -> None:
        self.sock.close()


class Response:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def request(lookupd: DaemonProcess, method: str, path: str) -> Response:
    conn = http.client.HTTPConnection(*lookupd.http_address, timeout=5)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return Response(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def get(lookupd: DaemonProcess, path: str) -> Response:
    return request(lookupd, "GET", path)


def post(lookupd: DaemonProcess, path: str) -> Response:
    return request(lookupd, "POST", path)


def assert_error(resp: Response, status: int, message: str) -> None:
    assert resp.status == status
    assert resp.body == b'{"message":"' + message.encode() + b'"}'
    assert resp.headers["Content-Type"] == JSON_TYPE
    assert resp.headers[V1_HEADER[0]] == V1_HEADER[1]


def assert_empty_ok(resp: Response) -> None:
    assert (resp.status, resp.body) == (200, b"")
    assert resp.headers[V1_HEADER[0]] == V1_HEADER[1]


@pytest.fixture(scope="module")
def shared() -> Iterator[DaemonProcess]:
    """One lookupd for the tests that use their own topic names and count nothing globally."""
    with start_nsqlookupd() as lookupd:
        yield lookupd


@pytest.fixture
def lookupd() -> Iterator[DaemonProcess]:
    with start_nsqlookupd() as proc:
        yield proc


def lookup(lookupd: DaemonProcess, topic: str) -> dict[str, Any]:
    resp = get(lookupd, f"/lookup?topic={topic}")
    assert resp.status == 200, resp.body
    result: dict[str, Any] = resp.json()
    return result


# --------------------------------------------------------------------------- TCP protocol


def test_76_basic_lookupd(lookupd: DaemonProcess) -> None:
    assert get(lookupd, "/topics").body == b'{"topics":[]}'
    assert get(lookupd, "/nodes").body == b'{"producers":[]}'

    conn = Conn(lookupd)
    conn.send(identify_cmd(IDENTITY))
    hostname = socket.gethostname()
    expected_body = (
        f'{{"broadcast_address":"127.0.0.1","hostname":"{hostname}",'
        f'"http_port":{lookupd.http_port},"tcp_port":{lookupd.tcp_port},"version":"1.3.0"}}'
    ).encode()
    assert conn.read_raw_response() == sized(expected_body)

    conn.send(b"REGISTER connectmsg channel1\n")
    assert conn.read_raw_response() == b"\x00\x00\x00\x02OK"

    nodes = get(lookupd, "/nodes")
    assert nodes.status == 200 and nodes.headers["Content-Type"] == JSON_TYPE
    assert nodes.body == (
        b'{"producers":[{"remote_address":"%s","hostname":"ip.address",'
        b'"broadcast_address":"ip.address","tcp_port":5000,"http_port":5555,'
        b'"version":"fake-version","tombstones":[false],"topics":["connectmsg"]}]}'
        % conn.local_address.encode()
    )
    assert get(lookupd, "/topics").body == b'{"topics":["connectmsg"]}'
    assert get(lookupd, "/lookup?topic=connectmsg").body == (
        b'{"channels":["channel1"],"producers":[{"remote_address":"%s","hostname":"ip.address",'
        b'"broadcast_address":"ip.address","tcp_port":5000,"http_port":5555,'
        b'"version":"fake-version"}]}' % conn.local_address.encode()
    )

    conn.close()
    wait_for(lambda: lookup(lookupd, "connectmsg")["producers"], not_, 10.0, "the producer gone")
    assert lookup(lookupd, "connectmsg") == {"channels": ["channel1"], "producers": []}
    assert get(lookupd, "/nodes").json() == {"producers": []}


def test_77_channel_unregister(shared: DaemonProcess) -> None:
    conn = Conn(shared)
    conn.identify()
    assert conn.command(b"REGISTER channel_unregister ch1\n") == b"OK"
    assert conn.command(b"UNREGISTER channel_unregister ch1\n") == b"OK"
    result = lookup(shared, "channel_unregister")
    # the channel key stays, and the producer is still listed through its topic registration
    assert result["channels"] == ["ch1"]
    assert len(result["producers"]) == 1
    debug = get(shared, "/debug").json()
    assert "topic:channel_unregister:" in debug
    assert "channel:channel_unregister:ch1" not in debug  # no producers -> not shown
    conn.close()


def test_ephemeral_channel_and_topic_keys_go_with_their_last_producer(
    shared: DaemonProcess,
) -> None:
    conn = Conn(shared)
    conn.identify()
    assert conn.command(b"REGISTER eph#ephemeral c#ephemeral\n") == b"OK"
    assert conn.command(b"REGISTER eph#ephemeral keep\n") == b"OK"
    assert conn.command(b"UNREGISTER eph#ephemeral c#ephemeral\n") == b"OK"
    assert conn.command(b"UNREGISTER eph#ephemeral keep\n") == b"OK"
    assert lookup(shared, "eph%23ephemeral")["channels"] == ["keep"]
    assert conn.command(b"UNREGISTER eph#ephemeral\n") == b"OK"
    assert get(shared, "/lookup?topic=eph%23ephemeral").status == 404
    assert "eph#ephemeral" not in get(shared, "/topics").json()["topics"]
    conn.close()


def test_topic_unregister_removes_channel_producers_too(shared: DaemonProcess) -> None:
    conn = Conn(shared)
    conn.identify()
    assert conn.command(b"REGISTER tu ch1\n") == b"OK"
    assert conn.command(b"UNREGISTER tu\n") == b"OK"
    debug = get(shared, "/debug").json()
    assert "topic:tu:" not in debug and "channel:tu:ch1" not in debug
    assert lookup(shared, "tu") == {"channels": ["ch1"], "producers": []}
    conn.close()


def test_78_tombstone_recover() -> None:
    lifetime = 0.5
    with start_nsqlookupd(f"--tombstone-lifetime={int(lifetime * 1000)}ms") as lookupd:
        conn = Conn(lookupd)
        conn.identify()
        assert conn.command(b"REGISTER tombstone_recover channel1\n") == b"OK"
        assert conn.command(b"REGISTER tombstone_recover2 channel2\n") == b"OK"
        started = time.monotonic()
        resp = post(lookupd, "/topic/tombstone?topic=tombstone_recover&node=ip.address:5555")
        assert_empty_ok(resp)
        hidden = lookup(lookupd, "tombstone_recover")["producers"]
        other = lookup(lookupd, "tombstone_recover2")["producers"]
        assert time.monotonic() - started < lifetime, "too slow to observe the tombstone"
        assert hidden == []
        assert len(other) == 1
        time.sleep(max(0.0, started + lifetime + 0.1 - time.monotonic()))
        assert len(lookup(lookupd, "tombstone_recover")["producers"]) == 1
        conn.close()


def test_79_tombstone_unregister() -> None:
    with start_nsqlookupd("--tombstone-lifetime=50ms") as lookupd:
        conn = Conn(lookupd)
        conn.identify()
        assert conn.command(b"REGISTER tombstone_unregister channel1\n") == b"OK"
        resp = post(lookupd, "/topic/tombstone?topic=tombstone_unregister&node=ip.address:5555")
        assert_empty_ok(resp)
        assert conn.command(b"UNREGISTER tombstone_unregister\n") == b"OK"
        time.sleep(0.055)
        assert lookup(lookupd, "tombstone_unregister")["producers"] == []
        conn.close()


def test_80_inactive_nodes_and_ping_keeps_alive() -> None:
    timeout = 0.6
    with start_nsqlookupd(f"--inactive-producer-timeout={int(timeout * 1000)}ms") as lookupd:
        conn = Conn(lookupd)
        conn.identify()
        identified = time.monotonic()
        assert conn.command(b"REGISTER inactive_nodes channel1\n") == b"OK"
        [node] = get(lookupd, "/nodes").json()["producers"]
        assert (node["topics"], node["tombstones"]) == (["inactive_nodes"], [False])

        time.sleep(max(0.0, identified + timeout / 2 - time.monotonic()))
        assert conn.command(b"PING\n") == b"OK"
        pinged = time.monotonic()
        time.sleep(max(0.0, identified + timeout + 0.05 - time.monotonic()))
        # older than the timeout since IDENTIFY, but the PING refreshed it
        if time.monotonic() - pinged < timeout:
            assert len(get(lookupd, "/nodes").json()["producers"]) == 1
            assert len(lookup(lookupd, "inactive_nodes")["producers"]) == 1

        time.sleep(max(0.0, pinged + timeout + 0.05 - time.monotonic()))
        assert get(lookupd, "/nodes").json() == {"producers": []}
        assert lookup(lookupd, "inactive_nodes") == {"channels": ["channel1"], "producers": []}
        conn.close()


def test_81_tombstoned_nodes(lookupd: DaemonProcess) -> None:
    conn = Conn(lookupd)
    conn.identify()
    assert conn.command(b"REGISTER inactive_nodes channel1\n") == b"OK"
    assert conn.command(b"REGISTER other\n") == b"OK"
    [node] = get(lookupd, "/nodes").json()["producers"]
    assert dict(zip(node["topics"], node["tombstones"], strict=True)) == {
        "inactive_nodes": False,
        "other": False,
    }
    assert_empty_ok(post(lookupd, "/topic/tombstone?topic=inactive_nodes&node=ip.address:5555"))
    [node] = get(lookupd, "/nodes").json()["producers"]
    assert dict(zip(node["topics"], node["tombstones"], strict=True)) == {
        "inactive_nodes": True,
        "other": False,
    }
    debug = get(lookupd, "/debug").json()
    [record] = debug["topic:inactive_nodes:"]
    assert record["tombstoned"] is True and record["tombstoned_at"] > 0
    assert debug["topic:other:"][0]["tombstoned_at"] == -6795364578871345152
    conn.close()


def test_tombstone_needs_the_exact_node(shared: DaemonProcess) -> None:
    conn = Conn(shared)
    conn.identify()
    assert conn.command(b"REGISTER tomb_exact\n") == b"OK"
    assert_empty_ok(post(shared, "/topic/tombstone?topic=tomb_exact&node=ip.address:5000"))
    assert_empty_ok(post(shared, "/topic/tombstone?topic=nope&node=ip.address:5555"))
    assert len(lookup(shared, "tomb_exact")["producers"]) == 1
    assert_error(post(shared, "/topic/tombstone"), 400, "MISSING_ARG_TOPIC")
    assert_error(post(shared, "/topic/tombstone?topic=tomb_exact"), 400, "MISSING_ARG_NODE")
    conn.close()


def test_88_invalid_command_is_fatal(shared: DaemonProcess) -> None:
    conn = Conn(shared)
    conn.send(b"INVALID_COMMAND\n")
    assert conn.read_raw_response() == be32(41) + b"E_INVALID invalid command INVALID_COMMAND"
    conn.assert_closed()


def test_89_order_of_commands(shared: DaemonProcess) -> None:
    conn = Conn(shared)
    assert conn.command(b"PING\n") == b"OK"  # PING before IDENTIFY is fine
    conn.send(b"REGISTER t\n")
    assert conn.read_raw_response() == sized(b"E_INVALID client must IDENTIFY")
    conn.assert_closed()

    conn = Conn(shared)
    conn.send(b"UNREGISTER t\n")
    assert conn.read_raw_response() == sized(b"E_INVALID client must IDENTIFY")
    conn.assert_closed()

    conn = Conn(shared)
    conn.send(identify_cmd({k: v for k, v in IDENTITY.items() if k != "version"}))
    assert conn.read_raw_response() == sized(b"E_BAD_BODY IDENTIFY missing fields")
    conn.assert_closed()


@pytest.mark.parametrize(
    ("data", "reply"),
    [
        (b"IDENTIFY\n" + sized(b"{bad json"), b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (
            b"IDENTIFY\n" + sized(b'{"tcp_port":"5000"}'),
            b"E_BAD_BODY IDENTIFY failed to decode JSON body",
        ),
        (b"IDENTIFY\n" + sized(b"{}"), b"E_BAD_BODY IDENTIFY missing fields"),
        (b"IDENTIFY\n" + be32(-1), b"E_BAD_BODY IDENTIFY failed to read body"),
        (b"\n", b"E_INVALID invalid command "),
        (b"  \t\r\n", b"E_INVALID invalid command "),
        (b"ping\n", b"E_INVALID invalid command ping"),
        (b"BAD\xff\xfe\n", b"E_INVALID invalid command BAD\xff\xfe"),
    ],
)
def test_fatal_errors_before_identify(shared: DaemonProcess, data: bytes, reply: bytes) -> None:
    conn = Conn(shared)
    conn.send(data)
    assert conn.read_raw_response() == sized(reply)
    conn.assert_closed()


@pytest.mark.parametrize(
    ("line", "reply"),
    [
        (b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
        (b"REGISTER \n", b"E_INVALID REGISTER insufficient number of params"),
        (b"UNREGISTER\n", b"E_INVALID UNREGISTER insufficient number of params"),
        (b"REGISTER a$\n", b"E_BAD_TOPIC REGISTER topic name 'a$' is not valid"),
        (b"REGISTER  t\n", b"E_BAD_TOPIC REGISTER topic name '' is not valid"),
        (b"UNREGISTER t c!\n", b"E_BAD_CHANNEL UNREGISTER channel name 'c!' is not valid"),
        (
            b"REGISTER " + b"t" * 65 + b"\n",
            b"E_BAD_TOPIC REGISTER topic name '" + b"t" * 65 + b"' is not valid",
        ),
        (b"IDENTIFY\n", b"E_INVALID cannot IDENTIFY again"),
    ],
)
def test_fatal_errors_after_identify(shared: DaemonProcess, line: bytes, reply: bytes) -> None:
    conn = Conn(shared)
    conn.identify()
    conn.send(line)
    assert conn.read_raw_response() == sized(reply)
    conn.assert_closed()


def test_bad_magic(shared: DaemonProcess) -> None:
    conn = Conn(shared, magic=b"  V2")
    assert conn.read_raw_response() == be32(14) + b"E_BAD_PROTOCOL"
    conn.assert_closed()


def test_pipelined_commands_and_crlf(shared: DaemonProcess) -> None:
    conn = Conn(shared, magic=b"")
    conn.send(
        b"  V1"
        + identify_cmd(IDENTITY)
        + b"REGISTER pipelined a\r\nREGISTER pipelined b\nPING\nREGISTER pipelined c  extra\n"
    )
    conn.read_raw_response()
    for _ in range(4):
        assert conn.read_raw_response() == b"\x00\x00\x00\x02OK"
    assert sorted(lookup(shared, "pipelined")["channels"]) == ["a", "b", "c"]
    conn.close()


def test_eof_in_identify_body_gets_an_answer(shared: DaemonProcess) -> None:
    conn = Conn(shared)
    conn.send(b"IDENTIFY\n" + be32(100) + b"{")
    conn.sock.shutdown(socket.SHUT_WR)
    assert conn.read_raw_response() == sized(b"E_BAD_BODY IDENTIFY failed to read body")
    conn.assert_closed()


def test_disconnect_removes_only_that_peer(lookupd: DaemonProcess) -> None:
    first, second = Conn(lookupd), Conn(lookupd)
    first.identify()
    second.identify({**IDENTITY, "broadcast_address": "other", "http_port": 6666})
    assert first.command(b"REGISTER shared_t ch\n") == b"OK"
    assert second.command(b"REGISTER shared_t ch\n") == b"OK"
    assert len(lookup(lookupd, "shared_t")["producers"]) == 2
    first.close()
    producers = lambda: lookup(lookupd, "shared_t")["producers"]  # noqa: E731
    wait_for(producers, lambda found: len(found) == 1, 10.0, "one producer")
    [producer] = lookup(lookupd, "shared_t")["producers"]
    assert producer["broadcast_address"] == "other"
    assert [n["broadcast_address"] for n in get(lookupd, "/nodes").json()["producers"]] == ["other"]
    second.close()


# --------------------------------------------------------------------------- HTTP API


def test_82_ping_and_info(shared: DaemonProcess) -> None:
    resp = get(shared, "/ping")
    assert (resp.status, resp.body) == (200, b"OK")
    assert V1_HEADER[0] not in resp.headers  # /ping is plain text, not V1
    resp = get(shared, "/info")
    assert (resp.status, resp.body) == (200, b'{"version":"1.3.0"}')
    assert resp.headers["Content-Type"] == JSON_TYPE
    assert resp.headers[V1_HEADER[0]] == V1_HEADER[1]


def test_83_create_topic(shared: DaemonProcess) -> None:
    assert_error(post(shared, "/topic/create"), 400, "MISSING_ARG_TOPIC")
    assert_error(post(shared, "/topic/create?topic=sometopic$"), 400, "INVALID_ARG_TOPIC")
    assert_error(post(shared, "/topic/create?topic="), 400, "INVALID_ARG_TOPIC")
    assert_empty_ok(post(shared, "/topic/create?topic=created_topic"))
    assert "created_topic" in get(shared, "/topics").json()["topics"]
    assert lookup(shared, "created_topic") == {"channels": [], "producers": []}


def test_84_delete_topic(shared: DaemonProcess) -> None:
    assert_error(post(shared, "/topic/delete"), 400, "MISSING_ARG_TOPIC")
    assert_empty_ok(post(shared, "/topic/create?topic=deleted_topic"))
    assert_empty_ok(post(shared, "/topic/delete?topic=deleted_topic"))
    assert_empty_ok(post(shared, "/channel/create?topic=deleted_topic2&channel=c"))
    assert_empty_ok(post(shared, "/topic/delete?topic=deleted_topic2"))
    assert_empty_ok(post(shared, "/topic/delete?topic=never_existed$"))  # no validation, no 404
    topics = get(shared, "/topics").json()["topics"]
    assert "deleted_topic" not in topics and "deleted_topic2" not in topics
    assert get(shared, "/channels?topic=deleted_topic2").json() == {"channels": []}


def test_85_get_channels(shared: DaemonProcess) -> None:
    assert_error(get(shared, "/channels"), 400, "MISSING_ARG_TOPIC")
    assert_empty_ok(post(shared, "/topic/create?topic=chan_topic"))
    assert get(shared, "/channels?topic=chan_topic").body == b'{"channels":[]}'
    assert_empty_ok(post(shared, "/channel/create?topic=chan_topic&channel=foobar"))
    assert get(shared, "/channels?topic=chan_topic").body == b'{"channels":["foobar"]}'
    assert get(shared, "/channels?topic=unknown$").body == b'{"channels":[]}'


def test_86_create_channel(shared: DaemonProcess) -> None:
    assert_error(post(shared, "/channel/create"), 400, "MISSING_ARG_TOPIC")
    assert_error(post(shared, "/channel/create?topic=a$"), 400, "INVALID_ARG_TOPIC")
    assert_error(post(shared, "/channel/create?topic=cc"), 400, "MISSING_ARG_CHANNEL")
    assert_error(post(shared, "/channel/create?topic=cc&channel=b$"), 400, "INVALID_ARG_CHANNEL")
    assert_empty_ok(post(shared, "/channel/create?topic=cc&channel=foobar"))
    assert "cc" in get(shared, "/topics").json()["topics"]  # the topic key comes with it
    assert lookup(shared, "cc") == {"channels": ["foobar"], "producers": []}


def test_87_delete_channel(shared: DaemonProcess) -> None:
    assert_error(post(shared, "/channel/delete"), 400, "MISSING_ARG_TOPIC")
    assert_error(post(shared, "/channel/delete?topic=a$"), 400, "INVALID_ARG_TOPIC")
    assert_error(post(shared, "/channel/delete?topic=dc"), 400, "MISSING_ARG_CHANNEL")
    assert_error(post(shared, "/channel/delete?topic=dc&channel=b$"), 400, "INVALID_ARG_CHANNEL")
    assert_error(post(shared, "/channel/delete?topic=dc&channel=nope"), 404, "CHANNEL_NOT_FOUND")
    assert_empty_ok(post(shared, "/channel/create?topic=dc&channel=foobar"))
    assert_empty_ok(post(shared, "/channel/delete?topic=dc&channel=foobar"))
    assert get(shared, "/channels?topic=dc").json() == {"channels": []}


def test_lookup_errors(shared: DaemonProcess) -> None:
    assert_error(get(shared, "/lookup"), 400, "MISSING_ARG_TOPIC")
    assert_error(get(shared, "/lookup?topic=never_seen"), 404, "TOPIC_NOT_FOUND")
    assert_error(get(shared, "/lookup?topic="), 404, "TOPIC_NOT_FOUND")


def test_query_is_parsed_like_go(shared: DaemonProcess) -> None:
    assert_empty_ok(post(shared, "/topic/create?topic=q_topic&topic=ignored"))
    assert_empty_ok(post(shared, "/channel/create?channel=c%2Dd&topic=q%5Ftopic"))
    assert get(shared, "/channels?topic=q_topic").json() == {"channels": ["c-d"]}
    assert_error(
        post(shared, "/channel/create?topic=q_topic&channel=a+b"), 400, "INVALID_ARG_CHANNEL"
    )
    # Go's url.ParseQuery refuses ';' separators and bad escapes
    assert_error(get(shared, "/channels?topic=q_topic;x=1"), 400, "INVALID_REQUEST")
    assert_error(get(shared, "/channels?topic=%zz"), 400, "INVALID_REQUEST")
    assert_error(post(shared, "/topic/create?topic=a%2"), 400, "INVALID_REQUEST")


def test_debug_shape(lookupd: DaemonProcess) -> None:
    assert get(lookupd, "/debug").body == b"{}"
    conn = Conn(lookupd)
    conn.identify()
    before = time.time_ns()
    assert conn.command(b"REGISTER dbg ch\n") == b"OK"
    assert_empty_ok(post(lookupd, "/topic/create?topic=empty_topic"))
    debug = get(lookupd, "/debug").json()
    assert sorted(debug) == ["channel:dbg:ch", "client::", "topic:dbg:"]
    [record] = debug["client::"]
    assert list(record) == sorted(record)  # a Go map: keys sorted
    assert record == {
        "broadcast_address": "ip.address",
        "hostname": "ip.address",
        "http_port": 5555,
        "id": conn.local_address,
        "last_update": record["last_update"],
        "tcp_port": 5000,
        "tombstoned": False,
        "tombstoned_at": -6795364578871345152,
        "version": "fake-version",
    }
    assert before - 5 * 10**9 < record["last_update"] <= time.time_ns()
    conn.close()


def test_not_found_and_method_not_allowed(shared: DaemonProcess) -> None:
    assert_error(get(shared, "/not_found"), 404, "NOT_FOUND")
    resp = post(shared, "/lookup")
    assert_error(resp, 405, "METHOD_NOT_ALLOWED")
    assert resp.headers["Allow"] == "GET, OPTIONS"
    assert_error(get(shared, "/topic/create"), 405, "METHOD_NOT_ALLOWED")
    # httprouter does not answer HEAD for GET routes
    assert request(shared, "HEAD", "/info").status == 405
    resp = request(shared, "OPTIONS", "/topic/create")
    assert (resp.status, resp.headers["Allow"], resp.body) == (200, "POST, OPTIONS", b"")


def test_trailing_slash_redirects(shared: DaemonProcess) -> None:
    resp = get(shared, "/topics/")
    assert resp.status == 301
    assert resp.headers["Location"] == "/topics"
    resp = post(shared, "/topic/create/?topic=x")
    assert resp.status in (307, 308)
    assert resp.headers["Location"] == "/topic/create?topic=x"
