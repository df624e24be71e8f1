"""Helpers for the nsqd TLS, compression and AUTH tests (issue 5).

* :func:`make_certs` builds a throwaway PKI with the ``openssl`` command: a CA, a server
  certificate for 127.0.0.1/localhost, a CA-signed client certificate (CN ``test.local``) and a
  self-signed one (CN ``selfsigned``).
* :class:`LayeredConn` is a blocking raw V2 client that can switch on TLS (the stdlib ``ssl``
  module), snappy (cramjam) and deflate (zlib) at the points IDENTIFY says, written
  independently of ``nsqpy.protocol`` so that a codec bug cannot hide a server bug.
* :class:`AuthServer` is a real aiohttp auth server on 127.0.0.1 in a background thread that
  records every query and answers what the test tells it to.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import struct
import subprocess
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cramjam
from aiohttp import web

from nsqpy.client import Consumer, Producer
from nsqpy.client import Message as ClientMessage
from nsqpy.testing import DaemonProcess

MAGIC = b"  V2"
BE32 = struct.Struct(">i")
OK_FRAME = bytes.fromhex("00000006 00000000") + b"OK"
HEARTBEAT = b"_heartbeat_"
SNAPPY_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"

# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Certs:
    directory: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path  # signed by the CA, CN=test.local
    client_key: Path
    self_signed_cert: Path  # signed by nobody, CN=selfsigned
    self_signed_key: Path

    def server_context(self) -> Any:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.server_cert, self.server_key)
        return context

    def client_context(self, cert: str = "", max_version: ssl.TLSVersion | None = None) -> Any:
        """A client context trusting the CA; ``cert`` is "", "signed" or "self-signed"."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if max_version is not None:
            context.maximum_version = max_version
        if cert == "signed":
            context.load_cert_chain(self.client_cert, self.client_key)
        elif cert == "self-signed":
            context.load_cert_chain(self.self_signed_cert, self.self_signed_key)
        else:
            assert cert == "", cert
        return context

    def server_flags(self) -> tuple[str, ...]:
        return (
            f"--tls-cert={self.server_cert}",
            f"--tls-key={self.server_key}",
            "--https-address=127.0.0.1:0",
        )


def make_certs(directory: Path) -> Certs:
    """EC P-256 keys: quick to generate, and every TLS version we test supports them."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    def new_key(name: str) -> None:
        openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", name)

    new_key("ca.key")
    openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=nsqpy test CA",
    )  # fmt: skip
    (directory / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (directory / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subject, ext in (("server", "/CN=localhost", "server.ext"),
                               ("client", "/CN=test.local", "client.ext")):  # fmt: skip
        new_key(f"{name}.key")
        openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", ext,
        )  # fmt: skip
    new_key("self.key")
    openssl(
        "req", "-x509", "-new", "-key", "self.key", "-out", "self.pem", "-days", "2",
        "-subj", "/CN=selfsigned",
    )  # fmt: skip
    d = directory
    return Certs(
        d, d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key",
        d / "self.pem", d / "self.key",
    )  # fmt: skip


# --------------------------------------------------------------------------- commands


def command(line: str, body: bytes | None = None) -> bytes:
    data = line.encode() + b"\n"
    if body is not None:
        data += BE32.pack(len(body)) + body
    return data


def identify_cmd(**settings: Any) -> bytes:
    return command("IDENTIFY", json.dumps(settings).encode())


def pub_cmd(topic: str, body: bytes) -> bytes:
    return command(f"PUB {topic}", body)


def mpub_cmd(topic: str, bodies: list[bytes]) -> bytes:
    inner = BE32.pack(len(bodies)) + b"".join(BE32.pack(len(b)) + b for b in bodies)
    return command(f"MPUB {topic}", inner)


def auth_cmd(secret: bytes) -> bytes:
    return b"AUTH\n" + BE32.pack(len(secret)) + secret


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


class ConnectionClosed(AssertionError):
    pass


@dataclass
class Message:
    timestamp: int
    attempts: int
    id: bytes
    body: bytes


class LayeredConn:
    """A raw V2 connection with blocking, deadline-bounded reads and optional upgrades."""

    def __init__(self, address: tuple[str, int], magic: bool = True) -> None:
        self.sock: socket.socket = socket.create_connection(address, timeout=5.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self._eof = False
        self.encode: Callable[[bytes], bytes] | None = None
        self.decode: Callable[[bytes], bytes] | None = None
        self.snappy_decoder: SnappyStreamDecoder | None = None
        if magic:
            self.send(MAGIC)

    # ------------------------------------------------------------------ raw I/O

    def send(self, data: bytes) -> None:
        if self.encode is not None:
            data = self.encode(data)
        self.sock.sendall(data)

    def send_raw(self, data: bytes) -> None:
        """Bytes below every layer but TLS (for broken-stream tests)."""
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> None:
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

    def read_exact(self, n: int, timeout: float = 5.0) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self._buf) < n:
            self._fill(deadline)
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def read_frame(self, timeout: float = 5.0) -> tuple[int, bytes]:
        """The next frame that is not a heartbeat (heartbeats are answered with NOP)."""
        deadline = time.monotonic() + timeout
        while True:
            size = BE32.unpack(self.read_exact(4, deadline - time.monotonic()))[0]
            assert 4 <= size <= 64 << 20, f"bad frame size {size}"
            raw = self.read_exact(size, max(deadline - time.monotonic(), 0.001))
            frame_type, data = BE32.unpack_from(raw)[0], raw[4:]
            if frame_type == 0 and data == HEARTBEAT:
                self.send(b"NOP\n")
                continue
            return frame_type, data

    # ------------------------------------------------------------------ expectations

    def expect_response(self, timeout: float = 5.0) -> bytes:
        frame_type, data = self.read_frame(timeout)
        assert frame_type == 0, (frame_type, data)
        return data

    def expect_ok(self, timeout: float = 5.0) -> None:
        assert self.read_frame(timeout) == (0, b"OK")

    def expect_error(self, text: str, fatal: bool = True, timeout: float = 5.0) -> None:
        assert self.read_frame(timeout) == (1, text.encode())
        if fatal:
            self.expect_closed()

    def expect_message(self, timeout: float = 5.0) -> Message:
        frame_type, data = self.read_frame(timeout)
        assert frame_type == 2, (frame_type, data[:200])
        ts, attempts = struct.unpack(">qH", data[:10])
        return Message(ts, attempts, data[10:26], data[26:])

    def expect_closed(self, timeout: float = 3.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._fill(deadline)
            except ConnectionClosed:
                break
            except ssl.SSLError:  # the peer's alert, or a torn TLS stream
                break
            while self._buf.startswith(b"\x00\x00\x00\x0f\x00\x00\x00\x00" + HEARTBEAT):
                del self._buf[:19]
        assert bytes(self._buf) == b"", f"unexpected bytes before close: {bytes(self._buf)!r}"

    # ------------------------------------------------------------------ negotiation

    def identify(self, **settings: Any) -> dict[str, Any]:
        """IDENTIFY with feature negotiation; returns the JSON (no upgrade performed yet)."""
        self.send(identify_cmd(feature_negotiation=True, **settings))
        response = json.loads(self.expect_response())
        assert isinstance(response, dict)
        return response

    def upgrade(
        self,
        response: dict[str, Any],
        tls_context: Any = None,
    ) -> None:
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
        response = self.identify(**settings)
        self.upgrade(response, tls_context)
        return response

    # ------------------------------------------------------------------ commands

    def pub(self, topic: str, body: bytes) -> None:
        self.send(pub_cmd(topic, body))
        self.expect_ok()

    def sub(self, topic: str, channel: str) -> None:
        self.send(command(f"SUB {topic} {channel}"))
        self.expect_ok()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> LayeredConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tls_rejected(address: tuple[str, int], context: Any) -> bool:
    """IDENTIFY tls_v1, handshake, and report whether nsqd refused the connection.

    With TLS 1.3 the client's handshake completes before the server checks the client's
    certificate, so a refusal may only show on the first read: an alert, or the socket closing.
    A connection that delivers the upgrade ``OK`` was accepted.
    """
    conn = LayeredConn(address)
    try:
        response = conn.identify(tls_v1=True)
        assert response["tls_v1"] is True
        try:
            conn.sock = context.wrap_socket(conn.sock, server_hostname="127.0.0.1")
            frame = conn.read_frame()
        except (ssl.SSLError, ConnectionClosed, ConnectionResetError, BrokenPipeError):
            return True
        assert frame == (0, b"OK"), frame
        conn.send(command("NOP"))
        return False
    finally:
        conn.close()


# --------------------------------------------------------------------------- HTTP(S)


@dataclass
class HttpResponse:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http_request(
    address: tuple[str, int],
    method: str,
    path: str,
    body: bytes | None = None,
    tls_context: Any = None,
) -> HttpResponse:
    host, port = address
    conn: http.client.HTTPConnection
    if tls_context is not None:
        conn = http.client.HTTPSConnection(host, port, timeout=5.0, context=tls_context)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=5.0)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return HttpResponse(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def https_rejected(address: tuple[str, int], context: Any) -> bool:
    try:
        resp = http_request(address, "GET", "/ping", tls_context=context)
    except (ssl.SSLError, ConnectionError, http.client.HTTPException):
        return True
    assert (resp.status, resp.body) == (200, b"OK"), resp
    return False


def stats(daemon: DaemonProcess) -> dict[str, Any]:
    resp = http_request(daemon.http_address, "GET", "/stats?format=json")
    assert resp.status == 200, resp
    result = resp.json()
    assert isinstance(result, dict)
    return result


def client_stats(daemon: DaemonProcess, topic: str, channel: str) -> list[dict[str, Any]]:
    for t in stats(daemon)["topics"] or []:
        if t["topic_name"] == topic:
            for c in t["channels"] or []:
                if c["channel_name"] == channel:
                    return list(c["clients"] or [])
    return []


def producer_stats(daemon: DaemonProcess) -> list[dict[str, Any]]:
    return list(stats(daemon)["producers"] or [])


def wait_until(probe: Callable[[], Any], timeout: float = 3.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or 'condition'}")
        time.sleep(0.01)


# --------------------------------------------------------------------------- process memory


def proc_status_kib(pid: int, key: str) -> int:
    """``VmRSS``/``VmHWM`` of a process in KiB, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{key} not in /proc/{pid}/status")


def alive(daemon: DaemonProcess) -> bool:
    if daemon.proc is None or daemon.proc.poll() is not None:
        return False
    resp = http_request(daemon.http_address, "GET", "/ping")
    return resp.status in (200, 403)  # 403: TLS required on plain HTTP


# --------------------------------------------------------------------------- auth server


@dataclass
class AuthQuery:
    method: str
    path_qs: str
    body: bytes
    headers: dict[str, str]


Answer = tuple[int, Any]  # (status, JSON-able body or raw bytes)


@dataclass
class AuthServer:
    """aiohttp on 127.0.0.1:<free port>, in its own thread; ``answer`` decides each reply."""

    answer: Callable[[AuthQuery], Answer] = field(default=lambda q: (404, {}))
    delay: float = 0.0
    queries: list[AuthQuery] = field(default_factory=list)
    ssl_context: Any = None  # an ssl.SSLContext to serve HTTPS
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None
    _thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def grant(self, authorizations: list[dict[str, Any]], ttl: int = 3600, **extra: Any) -> None:
        body = {"ttl": ttl, "authorizations": authorizations, **extra}
        self.answer = lambda q: (200, body)

    def start(self) -> AuthServer:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        assert ready.wait(10), "auth server did not start"
        return self

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        ready.set()
        loop.run_forever()
        loop.run_until_complete(self._runner.cleanup())
        loop.close()

    async def _handle(self, request: web.Request) -> web.Response:
        query = AuthQuery(
            request.method, request.path_qs, await request.read(), dict(request.headers)
        )
        self.queries.append(query)
        if self.delay:
            await asyncio.sleep(self.delay)
        status, body = self.answer(query)
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return web.Response(status=status, body=raw, content_type="application/json")

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


# --------------------------------------------------------------------------- nsqpy.client


async def client_round_trip(
    daemon: DaemonProcess, topic: str, **options: Any
) -> list[dict[str, Any]]:
    """nsqpy.client's Producer and Consumer with ``options`` (tls=, snappy=, deflate=,
    auth_secret=...) through ``daemon``: every message arrives once; returns the consumer's
    client stats taken while it was connected."""
    host, port = daemon.tcp_address
    address = f"{host}:{port}"
    bodies = [b"e2e-%03d " % i + b"payload " * i for i in range(60)]
    async with Producer(address, **options) as producer:
        for body in bodies[:10]:
            await producer.publish(topic, body)
        await producer.multi_publish(topic, bodies[10:])

    received: list[bytes] = []
    done = asyncio.Event()

    def handle(message: ClientMessage) -> None:
        received.append(message.body)
        if len(received) == len(bodies):
            done.set()

    consumer = Consumer(
        topic, "ch", handle, nsqd_tcp_addresses=[address], max_in_flight=20, **options
    )
    async with consumer:
        await asyncio.wait_for(done.wait(), 10)
        clients = await asyncio.to_thread(client_stats, daemon, topic, "ch")
    assert sorted(received) == sorted(bodies)
    return clients
