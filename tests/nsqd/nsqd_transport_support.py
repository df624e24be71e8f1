"""Helpers for the nsqd TLS, compression and AUTH tests.

* :func:`make_certs` builds a throwaway PKI with the ``openssl`` command: a CA, a server
  certificate for 127.0.0.1/localhost, a CA-signed client certificate (CN ``test.local``) and a
  self-signed one (CN ``selfsigned``).
* :func:`tls_rejected` and :func:`https_rejected` probe whether nsqd accepts a TLS client, with
  the suite's raw V2 and HTTP clients (``tests/raw_v2.py``), which can switch on TLS, snappy and
  deflate at the points IDENTIFY says.
* :class:`AuthServer` is a real aiohttp auth server on 127.0.0.1 in a background thread that
  records every query and answers what the test tells it to.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from nsqpy.client import Consumer, Producer
from nsqpy.client import Message as ClientMessage
from nsqpy.testing import DaemonProcess

from ..raw_v2 import ConnectionClosed, NsqConn, channel_stats, command, http_request, stats

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


# --------------------------------------------------------------------------- TLS probes


def tls_rejected(address: tuple[str, int], context: Any) -> bool:
    """IDENTIFY tls_v1, handshake, and report whether nsqd refused the connection.

    With TLS 1.3 the client's handshake completes before the server checks the client's
    certificate, so a refusal may only show on the first read: an alert, or the socket closing.
    A connection that delivers the upgrade ``OK`` was accepted.
    """
    conn = NsqConn(address)
    try:
        response = conn.identify_json(tls_v1=True)
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


def https_rejected(address: tuple[str, int], context: Any) -> bool:
    try:
        resp = http_request(address, "GET", "/ping", tls_context=context)
    except (ssl.SSLError, ConnectionError, http.client.HTTPException):
        return True
    assert (resp.status, resp.body) == (200, b"OK"), resp
    return False


def client_stats(daemon: DaemonProcess, topic: str, channel: str) -> list[dict[str, Any]]:
    return list((channel_stats(daemon, topic, channel) or {}).get("clients") or [])


def producer_stats(daemon: DaemonProcess) -> list[dict[str, Any]]:
    return list(stats(daemon)["producers"] or [])


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
