"""Black-box helpers: a raw-socket V2 client, a raw HTTP client, and nsqd daemons per module.

Everything here speaks bytes over real sockets to a real ``python -m nsqpy.nsqd`` process; it
deliberately does not use nsqpy's own codec, so a codec bug cannot hide a server bug.
"""

from __future__ import annotations

import http.client
import itertools
import json
import socket
import struct
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd

MAGIC = b"  V2"
BE32 = struct.Struct(">i")


def frame(frame_type: int, data: bytes) -> bytes:
    """``BE32(4 + len) BE32(type) data``, spelled out independently of nsqpy.protocol."""
    return BE32.pack(len(data) + 4) + BE32.pack(frame_type) + data


OK_FRAME = bytes.fromhex("00000006 00000000") + b"OK"
HEARTBEAT_FRAME = bytes.fromhex("0000000f 00000000") + b"_heartbeat_"
CLOSE_WAIT_FRAME = bytes.fromhex("0000000e 00000000") + b"CLOSE_WAIT"

#: §2.3: the IDENTIFY response of a default nsqd 1.3.0 (master appends two topology keys).
DEFAULT_IDENTIFY_JSON = (
    b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
    b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
    b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,'
    b'"output_buffer_timeout":250}'
)
MASTER_TOPOLOGY_SUFFIX = b',"topology_region":"","topology_zone":""}'
IDENTIFY_KEYS = [
    "max_rdy_count",
    "version",
    "max_msg_timeout",
    "msg_timeout",
    "tls_v1",
    "deflate",
    "deflate_level",
    "max_deflate_level",
    "snappy",
    "sample_rate",
    "auth_required",
    "output_buffer_size",
    "output_buffer_timeout",
]

_counter = itertools.count()


def unique(prefix: str = "t") -> str:
    """A fresh valid topic/channel name, so tests can share one daemon."""
    return f"{prefix}_{next(_counter)}_{uuid.uuid4().hex[:8]}"


def identify_body(settings: dict[str, Any]) -> bytes:
    return json.dumps(settings, separators=(",", ":")).encode()


def identify_cmd(settings: dict[str, Any]) -> bytes:
    body = identify_body(settings)
    return b"IDENTIFY\n" + BE32.pack(len(body)) + body


def pub_cmd(topic: str | bytes, body: bytes) -> bytes:
    name = topic.encode() if isinstance(topic, str) else topic
    return b"PUB " + name + b"\n" + BE32.pack(len(body)) + body


def dpub_cmd(topic: str, defer_ms: int | str, body: bytes) -> bytes:
    return f"DPUB {topic} {defer_ms}\n".encode() + BE32.pack(len(body)) + body


def mpub_inner(bodies: list[bytes]) -> bytes:
    return BE32.pack(len(bodies)) + b"".join(BE32.pack(len(b)) + b for b in bodies)


def mpub_cmd(topic: str | bytes, bodies: list[bytes]) -> bytes:
    name = topic.encode() if isinstance(topic, str) else topic
    inner = mpub_inner(bodies)
    return b"MPUB " + name + b"\n" + BE32.pack(len(inner)) + inner


@dataclass
class Message:
    timestamp: int
    attempts: int
    id: bytes
    body: bytes


def decode_message(data: bytes) -> Message:
    assert len(data) >= 26, data
    ts, attempts = struct.unpack(">qH", data[:10])
    return Message(ts, attempts, data[10:26], data[26:])


class ConnectionClosed(AssertionError):
    pass


class NsqConn:
    """A raw V2 connection with blocking reads bounded by timeouts."""

    def __init__(self, address: tuple[str, int], magic: bytes | None = MAGIC) -> None:
        self.sock = socket.create_connection(address, timeout=5.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self._eof = False
        if magic is not None:
            self.send(magic)

    # ------------------------------------------------------------------ raw I/O

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> None:
        """Read at least one more chunk into the buffer, or raise."""
        if self._eof:
            raise ConnectionClosed(f"connection closed; unread bytes {bytes(self._buf)!r}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"timed out; unread bytes {bytes(self._buf)[:200]!r}")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(1 << 20)
        except TimeoutError:
            raise TimeoutError(f"timed out; unread bytes {bytes(self._buf)[:200]!r}") from None
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self._eof = True
            raise ConnectionClosed(f"connection closed; unread bytes {bytes(self._buf)!r}")
        self._buf += chunk

    def read_exact(self, n: int, timeout: float = 5.0) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self._buf) < n:
            self._fill(deadline)
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def read_frame_bytes(self, timeout: float = 5.0) -> bytes:
        """One whole frame, header included."""
        deadline = time.monotonic() + timeout
        while len(self._buf) < 4:
            self._fill(deadline)
        (size,) = BE32.unpack_from(self._buf, 0)
        assert 4 <= size <= 64 << 20, f"bad frame size {size}: {bytes(self._buf[:64])!r}"
        return self.read_exact(4 + size, max(deadline - time.monotonic(), 0.001))

    def read_frame(self, timeout: float = 5.0, skip_heartbeats: bool = False) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout
        while True:
            raw = self.read_frame_bytes(max(deadline - time.monotonic(), 0.001))
            (frame_type,) = BE32.unpack_from(raw, 4)
            if skip_heartbeats and raw == HEARTBEAT_FRAME:
                continue
            return frame_type, raw[8:]

    # ------------------------------------------------------------------ expectations

    def expect_frame(self, expected: bytes, timeout: float = 5.0) -> None:
        got = self.read_frame_bytes(timeout)
        assert got == expected

    def expect_ok(self, timeout: float = 5.0, skip_heartbeats: bool = False) -> None:
        assert self.read_frame(timeout, skip_heartbeats) == (0, b"OK")

    def expect_response(self, timeout: float = 5.0, skip_heartbeats: bool = False) -> bytes:
        frame_type, data = self.read_frame(timeout, skip_heartbeats)
        assert frame_type == 0, data
        return data

    def expect_error(
        self,
        text: str | bytes,
        fatal: bool = True,
        timeout: float = 5.0,
        skip_heartbeats: bool = False,
    ) -> None:
        expected = text.encode() if isinstance(text, str) else text
        assert self.read_frame(timeout, skip_heartbeats) == (1, expected)
        if fatal:
            self.expect_closed()

    def expect_message(self, timeout: float = 5.0, skip_heartbeats: bool = False) -> Message:
        frame_type, data = self.read_frame(timeout, skip_heartbeats)
        assert frame_type == 2, (frame_type, data)
        return decode_message(data)

    def expect_closed(self, timeout: float = 3.0, allow_heartbeats: bool = False) -> None:
        """The server closes the connection without sending anything (more)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._fill(deadline)
            except ConnectionClosed:
                break
            if allow_heartbeats:
                while self._buf[: len(HEARTBEAT_FRAME)] == HEARTBEAT_FRAME:
                    del self._buf[: len(HEARTBEAT_FRAME)]
        assert bytes(self._buf) == b"", f"unexpected bytes before close: {bytes(self._buf)!r}"

    def expect_nothing(self, duration: float, allow_heartbeats: bool = False) -> None:
        """No bytes arrive (and the connection stays open) for ``duration`` seconds."""
        deadline = time.monotonic() + duration
        while True:
            try:
                self._fill(deadline)
            except TimeoutError:
                break
            if allow_heartbeats:
                while self._buf[: len(HEARTBEAT_FRAME)] == HEARTBEAT_FRAME:
                    del self._buf[: len(HEARTBEAT_FRAME)]
            assert bytes(self._buf) == b"", f"unexpected bytes: {bytes(self._buf)[:200]!r}"
        assert bytes(self._buf) == b""

    def is_open(self, skip_heartbeats: bool = False) -> bool:
        """Round-trip a PUB to prove the connection still works."""
        self.send(pub_cmd(unique("alive"), b"x"))
        try:
            self.expect_ok(skip_heartbeats=skip_heartbeats)
        except (ConnectionClosed, OSError):
            return False
        return True

    # ------------------------------------------------------------------ commands

    def identify(self, skip_heartbeats: bool = False, **settings: Any) -> bytes:
        """IDENTIFY and return the response data (``OK`` or the negotiation JSON)."""
        self.send(identify_cmd(settings))
        return self.expect_response(skip_heartbeats=skip_heartbeats)

    def identify_json(self, skip_heartbeats: bool = False, **settings: Any) -> dict[str, Any]:
        data = self.identify(skip_heartbeats=skip_heartbeats, feature_negotiation=True, **settings)
        result = json.loads(data)
        assert isinstance(result, dict)
        return result

    def sub(self, topic: str, channel: str, skip_heartbeats: bool = False) -> None:
        self.send(f"SUB {topic} {channel}\n".encode())
        self.expect_ok(skip_heartbeats=skip_heartbeats)

    def pub(self, topic: str, body: bytes, skip_heartbeats: bool = False) -> None:
        self.send(pub_cmd(topic, body))
        self.expect_ok(skip_heartbeats=skip_heartbeats)

    def rdy(self, count: int) -> None:
        self.send(b"RDY %d\n" % count)

    def fin(self, msg_id: bytes) -> None:
        self.send(b"FIN " + msg_id + b"\n")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> NsqConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- HTTP


@dataclass
class HttpResponse:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


def http_request(
    daemon: DaemonProcess,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
) -> HttpResponse:
    host, port = daemon.http_address
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return HttpResponse(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def http_ok(daemon: DaemonProcess, method: str, path: str, body: bytes | None = None) -> bytes:
    resp = http_request(daemon, method, path, body)
    assert resp.status == 200, (method, path, resp.status, resp.body)
    return resp.body


def q(**params: str) -> str:
    """A query string with every value percent-encoded (``#`` in ephemeral names!)."""
    return urllib.parse.urlencode(params)


def create_topic(daemon: DaemonProcess, topic: str) -> None:
    http_ok(daemon, "POST", f"/topic/create?{q(topic=topic)}")


def create_channel(daemon: DaemonProcess, topic: str, channel: str) -> None:
    http_ok(daemon, "POST", f"/topic/create?{q(topic=topic)}")
    http_ok(daemon, "POST", f"/channel/create?{q(topic=topic, channel=channel)}")


def http_pub(daemon: DaemonProcess, topic: str, body: bytes) -> None:
    assert http_ok(daemon, "POST", f"/pub?{q(topic=topic)}", body) == b"OK"


def stats(daemon: DaemonProcess, query: str = "") -> dict[str, Any]:
    resp = http_request(daemon, "GET", f"/stats?format=json{query}")
    assert resp.status == 200, resp.body
    result = resp.json()
    assert isinstance(result, dict)
    return result


def topic_stats(daemon: DaemonProcess, topic: str) -> dict[str, Any] | None:
    for t in stats(daemon, "&" + q(topic=topic))["topics"] or []:
        if t["topic_name"] == topic:
            assert isinstance(t, dict)
            return t
    return None


def channel_stats(daemon: DaemonProcess, topic: str, channel: str) -> dict[str, Any] | None:
    t = topic_stats(daemon, topic)
    for c in (t or {}).get("channels") or []:
        if c["channel_name"] == channel:
            assert isinstance(c, dict)
            return c
    return None


T = TypeVar("T")


def wait_for(
    probe: Callable[[], T], done: Callable[[T], bool], timeout: float = 3.0, what: str = ""
) -> T:
    """Poll ``probe`` until ``done(value)``; fail with the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or 'condition'}; last: {value!r}")
        time.sleep(0.01)


def wait_channel(
    daemon: DaemonProcess, topic: str, channel: str, timeout: float = 3.0, **expected: Any
) -> dict[str, Any]:
    """Wait until the channel's stats have all the ``expected`` values."""

    def matches(c: dict[str, Any] | None) -> bool:
        return c is not None and all(c.get(k) == v for k, v in expected.items())

    result = wait_for(
        lambda: channel_stats(daemon, topic, channel),
        matches,
        timeout,
        f"{topic}/{channel} {expected}",
    )
    assert result is not None
    return result


# --------------------------------------------------------------------------- daemons


class DaemonPool:
    """nsqd processes keyed by their extra flags; tests with the same flags share one."""

    def __init__(self, tmp_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_factory
        self._daemons: dict[tuple[str, ...], DaemonProcess] = {}
        self.crashes: list[str] = []

    def get(self, *flags: str) -> DaemonProcess:
        daemon = self._daemons.get(flags)
        if daemon is not None and daemon.proc is not None and daemon.proc.poll() is not None:
            self.crashes.append(f"nsqd {flags} exited with {daemon.proc.returncode}:\n{daemon.log}")
            daemon = None
        if daemon is None:
            daemon = start_nsqd(self._tmp.mktemp("nsqd"), *flags)
            self._daemons[flags] = daemon
        return daemon

    def stop_all(self) -> None:
        for flags, daemon in self._daemons.items():
            if daemon.proc is not None and daemon.proc.poll() is not None:
                self.crashes.append(f"nsqd {flags} exited with {daemon.proc.returncode}")
            daemon.stop()
        self._daemons.clear()


@pytest.fixture(scope="module")
def nsqd_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonPool]:
    pool = DaemonPool(tmp_path_factory)
    yield pool
    pool.stop_all()
    assert not pool.crashes, "nsqd died during the module:\n" + "\n".join(pool.crashes)


@pytest.fixture(scope="module")
def nsqd(nsqd_pool: DaemonPool) -> DaemonProcess:
    """A default nsqd shared by the module."""
    return nsqd_pool.get()


@pytest.fixture
def fresh_nsqd(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A default nsqd of its own for a test that needs an empty daemon."""
    daemon = start_nsqd(tmp_path)
    yield daemon
    daemon.stop()


def connect(daemon: DaemonProcess, magic: bytes | None = MAGIC) -> NsqConn:
    return NsqConn(daemon.tcp_address, magic)
