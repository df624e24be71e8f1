"""The test suite's one raw NSQ V2 client, raw HTTP client and stats helpers, and its shared
test helpers: fresh names (:func:`unique`), polling for an event (:func:`wait_for`,
:func:`wait_until` and their ``_async`` twins for tests that run on an event loop) and a
misbehaving client run in a thread beside an innocent one (:class:`Attack`).

Everything here speaks bytes over real sockets to a real nsqd process. It deliberately does not
use nsqpy's own codec (``nsqpy.protocol``), so a codec bug cannot hide a server bug: frames,
commands, TLS (the stdlib ``ssl`` module), snappy (cramjam) and deflate (zlib) are written from
the protocol description.

:class:`NsqConn` serves two kinds of test. Protocol conformance tests want to see every frame,
heartbeats included, and to decide themselves whether to answer them (``answer_heartbeats=False``,
what ``tests/conformance`` uses). The storage and transport tests just want a well-behaved client
(the default): heartbeats are answered with ``NOP`` and never surface.
"""

from __future__ import annotations

import asyncio
import http.client
import inspect
import itertools
import json
import socket
import ssl
import struct
import threading
import time
import urllib.parse
import uuid
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import cramjam

from nsqpy.testing import DaemonProcess

MAGIC = b"  V2"
BE32 = struct.Struct(">i")
HEARTBEAT = b"_heartbeat_"
SNAPPY_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"


def frame(frame_type: int, data: bytes) -> bytes:
    """``BE32(4 + len) BE32(type) data``, spelled out independently of nsqpy.protocol."""
    return BE32.pack(len(data) + 4) + BE32.pack(frame_type) + data


OK_FRAME = bytes.fromhex("00000006 00000000") + b"OK"
HEARTBEAT_FRAME = bytes.fromhex("0000000f 00000000") + HEARTBEAT
CLOSE_WAIT_FRAME = bytes.fromhex("0000000e 00000000") + b"CLOSE_WAIT"

_counter = itertools.count()


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def unique(prefix: str = "t") -> str:
    """A fresh valid topic/channel name, so tests can share one daemon."""
    return f"{prefix}_{next(_counter)}_{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- commands


def command(line: str, body: bytes | None = None) -> bytes:
    """``line\\n``, then ``BE32(len) body`` if there is a body."""
    data = line.encode() + b"\n"
    if body is not None:
        data += BE32.pack(len(body)) + body
    return data


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


def mpub_inner(bodies: Sequence[bytes]) -> bytes:
    return BE32.pack(len(bodies)) + b"".join(BE32.pack(len(b)) + b for b in bodies)


def mpub_cmd(topic: str | bytes, bodies: Sequence[bytes]) -> bytes:
    name = topic.encode() if isinstance(topic, str) else topic
    inner = mpub_inner(bodies)
    return b"MPUB " + name + b"\n" + BE32.pack(len(inner)) + inner


def auth_cmd(secret: bytes) -> bytes:
    return b"AUTH\n" + BE32.pack(len(secret)) + secret


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Message:
    timestamp: int
    attempts: int
    id: bytes
    body: bytes


def decode_message(data: bytes) -> Message:
    """``BE64(timestamp_ns) BE16(attempts) 16-byte ID body`` (also a diskqueue record)."""
    assert len(data) >= 26, data
    timestamp, attempts = struct.unpack(">qH", data[:10])
    return Message(timestamp, attempts, data[10:26], data[26:])


class ConnectionClosed(AssertionError):
    pass


# --------------------------------------------------------------------------- stream codecs


class SnappyStreamDecoder:
    """The snappy framing format, chunk by chunk; CRCs are checked by cramjam."""

    def __init__(self) -> None:
        self.raw = bytearray()  # everything received, for assertions on the wire format
        self._buf = bytearray()

    def __call__(self, data: bytes) -> bytes:
        self.raw += data
        self._buf += data
        end = 0
        while len(self._buf) - end >= 4:
            length = int.from_bytes(self._buf[end + 1 : end + 4], "little")
            if len(self._buf) - end - 4 < length:
                break
            end += 4 + length
        if end == 0:
            return b""
        chunks = bytes(self._buf[:end])
        del self._buf[:end]
        if not chunks.startswith(SNAPPY_IDENTIFIER):
            chunks = SNAPPY_IDENTIFIER + chunks
        return bytes(cramjam.snappy.decompress(chunks))


def snappy_encode(data: bytes) -> bytes:
    """A complete framed stream per write: repeating the identifier chunk is allowed."""
    return bytes(cramjam.snappy.compress(data))


class DeflateEncoder:
    def __init__(self, level: int = 6) -> None:
        self._z = zlib.compressobj(level, zlib.DEFLATED, -15)

    def __call__(self, data: bytes) -> bytes:
        return self._z.compress(data) + self._z.flush(zlib.Z_SYNC_FLUSH)


class DeflateDecoder:
    def __init__(self) -> None:
        self._z = zlib.decompressobj(-15)

    def __call__(self, data: bytes) -> bytes:
        return self._z.decompress(data)


# --------------------------------------------------------------------------- the raw client


class NsqConn:
    """A raw V2 connection with blocking, deadline-bounded reads and optional upgrades.

    ``magic=None`` sends no protocol magic. With ``answer_heartbeats`` (the default) every
    heartbeat is answered with ``NOP`` and skipped; without it, heartbeats are frames like any
    other unless a read is asked to ``skip_heartbeats`` (skipped, not answered).
    """

    def __init__(
        self,
        address: tuple[str, int],
        magic: bytes | None = MAGIC,
        answer_heartbeats: bool = True,
    ) -> None:
        self.sock: socket.socket = socket.create_connection(address, timeout=5.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.answer_heartbeats = answer_heartbeats
        self._buf = bytearray()
        self._eof = False
        self.encode: Callable[[bytes], bytes] | None = None
        self.decode: Callable[[bytes], bytes] | None = None
        self.snappy_decoder: SnappyStreamDecoder | None = None
        if magic is not None:
            self.send(magic)

    # ------------------------------------------------------------------ raw I/O

    def send(self, data: bytes) -> None:
        if self.encode is not None:
            data = self.encode(data)
        self.sock.sendall(data)

    def send_raw(self, data: bytes) -> None:
        """Bytes below every layer but TLS (for broken-stream tests)."""
        self.sock.sendall(data)

    def fileno(self) -> int:
        return self.sock.fileno()

    def _fill(self, deadline: float) -> None:
        """Read (and decode) at least one more byte into the buffer, or raise."""
        if self._eof:
            raise ConnectionClosed(f"connection closed; unread bytes {bytes(self._buf)[:200]!r}")
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out; unread bytes {bytes(self._buf)[:200]!r}")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                raise TimeoutError(f"timed out; unread {bytes(self._buf)[:200]!r}") from None
            except (ConnectionResetError, ssl.SSLEOFError):
                chunk = b""
            if not chunk:
                self._eof = True
                raise ConnectionClosed(f"connection closed; unread {bytes(self._buf)[:200]!r}")
            if self.decode is not None:
                chunk = self.decode(chunk)
            if chunk:
                self._buf += chunk
                return

    def receive_some(self, timeout: float = 5.0) -> None:
        """One read into the buffer (for callers that know the socket is readable)."""
        self._fill(time.monotonic() + timeout)

    def read_exact(self, n: int, timeout: float = 5.0) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self._buf) < n:
            self._fill(deadline)
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def _take_frame(self) -> bytes | None:
        """A whole frame (header included) if the buffer holds one."""
        if len(self._buf) < 4:
            return None
        (size,) = BE32.unpack_from(self._buf, 0)
        assert 4 <= size <= 64 << 20, f"bad frame size {size}: {bytes(self._buf[:64])!r}"
        if len(self._buf) < 4 + size:
            return None
        raw = bytes(self._buf[: 4 + size])
        del self._buf[: 4 + size]
        return raw

    def read_frame_bytes(self, timeout: float = 5.0) -> bytes:
        """One whole frame, header included; heartbeats are not treated specially."""
        deadline = time.monotonic() + timeout
        while (raw := self._take_frame()) is None:
            self._fill(deadline)
        return raw

    def _skips(self, raw: bytes, skip_heartbeats: bool) -> bool:
        """Whether ``raw`` is a heartbeat this read passes over (answering it if we do)."""
        if raw != HEARTBEAT_FRAME:
            return False
        if self.answer_heartbeats:
            self.send(b"NOP\n")
            return True
        return skip_heartbeats

    def read_frame(self, timeout: float = 5.0, skip_heartbeats: bool = False) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout
        while True:
            raw = self.read_frame_bytes(max(deadline - time.monotonic(), 0.001))
            if self._skips(raw, skip_heartbeats):
                continue
            (frame_type,) = BE32.unpack_from(raw, 4)
            return frame_type, raw[8:]

    def poll_frame(self) -> tuple[int, bytes] | None:
        """A frame if one is complete in the buffer, else None (no blocking)."""
        while (raw := self._take_frame()) is not None:
            if not self._skips(raw, skip_heartbeats=False):
                (frame_type,) = BE32.unpack_from(raw, 4)
                return frame_type, raw[8:]
        return None

    def _drop_heartbeats(self, answer: bool) -> None:
        while self._buf.startswith(HEARTBEAT_FRAME):
            del self._buf[: len(HEARTBEAT_FRAME)]
            if answer:
                self.send(b"NOP\n")

    # ------------------------------------------------------------------ expectations

    def expect_frame(self, expected: bytes, timeout: float = 5.0) -> None:
        got = self.read_frame_bytes(timeout)
        assert got == expected

    def expect_ok(self, timeout: float = 5.0, skip_heartbeats: bool = False) -> None:
        assert self.read_frame(timeout, skip_heartbeats) == (0, b"OK")

    def expect_response(self, timeout: float = 5.0, skip_heartbeats: bool = False) -> bytes:
        frame_type, data = self.read_frame(timeout, skip_heartbeats)
        assert frame_type == 0, (frame_type, data)
        return data

    def expect_error(
        self,
        text: str | bytes,
        fatal: bool = True,
        timeout: float = 5.0,
        skip_heartbeats: bool = False,
    ) -> None:
        """An error frame; a ``fatal`` one is followed by the server closing the connection."""
        expected = text.encode() if isinstance(text, str) else text
        assert self.read_frame(timeout, skip_heartbeats) == (1, expected)
        if fatal:
            self.expect_closed()

    def expect_message(self, timeout: float = 5.0, skip_heartbeats: bool = False) -> Message:
        frame_type, data = self.read_frame(timeout, skip_heartbeats)
        assert frame_type == 2, (frame_type, data[:200])
        return decode_message(data)

    def expect_closed(self, timeout: float = 3.0, allow_heartbeats: bool = False) -> None:
        """The server closes the connection without sending anything (more)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._fill(deadline)
            except ConnectionClosed:
                break
            except ssl.SSLError:  # the peer's alert, or a torn TLS stream
                break
            if allow_heartbeats or self.answer_heartbeats:
                self._drop_heartbeats(answer=False)  # the peer is going away: no NOP
        assert bytes(self._buf) == b"", f"unexpected bytes before close: {bytes(self._buf)!r}"

    def expect_nothing(self, duration: float, allow_heartbeats: bool = False) -> None:
        """No bytes arrive (and the connection stays open) for ``duration`` seconds."""
        deadline = time.monotonic() + duration
        while True:
            try:
                self._fill(deadline)
            except TimeoutError:
                break
            if allow_heartbeats or self.answer_heartbeats:
                self._drop_heartbeats(answer=self.answer_heartbeats)
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

    # ------------------------------------------------------------------ negotiation

    def identify(self, skip_heartbeats: bool = False, **settings: Any) -> bytes:
        """IDENTIFY and return the response data (``OK`` or the negotiation JSON)."""
        self.send(identify_cmd(settings))
        return self.expect_response(skip_heartbeats=skip_heartbeats)

    def identify_json(self, skip_heartbeats: bool = False, **settings: Any) -> dict[str, Any]:
        """IDENTIFY with feature negotiation; returns the JSON (no upgrade performed yet)."""
        data = self.identify(skip_heartbeats=skip_heartbeats, feature_negotiation=True, **settings)
        result = json.loads(data)
        assert isinstance(result, dict)
        return result

    def upgrade(self, response: dict[str, Any], tls_context: Any = None) -> None:
        """Follow the upgrades the IDENTIFY response promised, checking each ``OK``."""
        if response["tls_v1"]:
            assert tls_context is not None
            assert not self._buf, "nsqd sent bytes before the TLS handshake"
            self.sock = tls_context.wrap_socket(self.sock, server_hostname="127.0.0.1")
            self.expect_ok()
        if response["snappy"]:
            self.snappy_decoder = SnappyStreamDecoder()
            self._switch(snappy_encode, self.snappy_decoder)
            self.expect_ok()
        if response["deflate"]:
            self._switch(DeflateEncoder(), DeflateDecoder())
            self.expect_ok()

    def _switch(self, encode: Callable[[bytes], bytes], decode: Callable[[bytes], bytes]) -> None:
        leftover = bytes(self._buf)  # bytes after the last plain frame are already compressed
        self._buf.clear()
        self.encode, self.decode = encode, decode
        self._buf += decode(leftover)

    def negotiate(self, tls_context: Any = None, **settings: Any) -> dict[str, Any]:
        response = self.identify_json(**settings)
        self.upgrade(response, tls_context)
        return response

    # ------------------------------------------------------------------ commands

    def sub(self, topic: str, channel: str, skip_heartbeats: bool = False) -> None:
        self.send(f"SUB {topic} {channel}\n".encode())
        self.expect_ok(skip_heartbeats=skip_heartbeats)

    def pub(self, topic: str, body: bytes, skip_heartbeats: bool = False) -> None:
        self.send(pub_cmd(topic, body))
        self.expect_ok(skip_heartbeats=skip_heartbeats)

    def mpub(self, topic: str, bodies: Sequence[bytes]) -> None:
        self.send(mpub_cmd(topic, bodies))
        self.expect_ok()

    def dpub(self, topic: str, defer_ms: int, body: bytes) -> None:
        self.send(dpub_cmd(topic, defer_ms, body))
        self.expect_ok()

    def rdy(self, count: int) -> None:
        self.send(b"RDY %d\n" % count)

    def fin(self, msg_id: bytes) -> None:
        self.send(b"FIN " + msg_id + b"\n")

    def req(self, msg_id: bytes, delay_ms: int) -> None:
        self.send(b"REQ " + msg_id + b" %d\n" % delay_ms)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> NsqConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- HTTP(S)


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
    target: DaemonProcess | tuple[str, int],
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    *,
    timeout: float = 5.0,
    tls_context: Any = None,
) -> HttpResponse:
    """One request to a daemon's HTTP address, or to an explicit (host, port) such as HTTPS."""
    host, port = target.http_address if isinstance(target, DaemonProcess) else target
    conn: http.client.HTTPConnection
    if tls_context is not None:
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=tls_context)
    else:
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


# --------------------------------------------------------------------------- waiting

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


def wait_until(probe: Callable[[], T | None], timeout: float = 5.0, what: str = "") -> T:
    """Poll ``probe`` until it returns something truthy, and return that."""
    value = wait_for(probe, bool, timeout, what)
    assert value is not None  # it is truthy
    return value


@overload
async def wait_for_async(
    probe: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    timeout: float = ...,
    what: str = ...,
) -> T: ...
@overload
async def wait_for_async(
    probe: Callable[[], T], done: Callable[[T], bool], timeout: float = ..., what: str = ...
) -> T: ...
async def wait_for_async(
    probe: Callable[[], Any], done: Callable[[Any], bool], timeout: float = 3.0, what: str = ""
) -> Any:
    """:func:`wait_for` that sleeps on the event loop, so what runs there can make progress.

    ``probe`` may be a coroutine function (awaited each time) or a plain function (called on
    the loop: keep it short, e.g. one loopback HTTP request).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or 'condition'}; last: {value!r}")
        await asyncio.sleep(0.01)


@overload
async def wait_until_async(
    probe: Callable[[], Awaitable[T | None]], timeout: float = ..., what: str = ...
) -> T: ...
@overload
async def wait_until_async(
    probe: Callable[[], T | None], timeout: float = ..., what: str = ...
) -> T: ...
async def wait_until_async(probe: Callable[[], Any], timeout: float = 5.0, what: str = "") -> Any:
    """:func:`wait_until` that sleeps on the event loop (see :func:`wait_for_async`)."""
    return await wait_for_async(probe, bool, timeout, what)


# --------------------------------------------------------------------------- a misbehaving client


@dataclass
class Attack:
    """A misbehaving client run in a thread (the fairness tests), so that an innocent client's
    probes can be placed within it.

    ``run`` sets ``started`` once the attack is under way; ``finished`` is set and ``ended_at``
    taken once it has sent its last byte or had its last answer (or gave up), and ``error`` is
    what it raised. Entering starts the thread and waits until the attack is under way (or
    over); leaving waits for it to end by itself.
    """

    run: Callable[[Attack], None]
    started: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    sent: int = 0  # bytes sent, for attacks that count them
    ended_at: float = float("inf")

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            self.run(self)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.started.set()
            self.finished.set()

    def __enter__(self) -> Attack:
        self.thread.start()
        assert self.started.wait(10), "the attack did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(120)
        assert not self.thread.is_alive(), "the attack did not stop by itself"

    @property
    def running(self) -> bool:
        return not self.finished.is_set()
