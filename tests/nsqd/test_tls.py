"""nsqd TLS: the IDENTIFY ``tls_v1`` upgrade, the HTTPS listener, client-certificate policies
and the TLS-required policy (as Go, any command but IDENTIFY on a plain connection fails with
the fatal ``E_INVALID cannot <CMD> in current state (TLS required)``), plus garbage on TLS
connections. Certificates are made at test time with ``openssl``.
"""

from __future__ import annotations

import os
import random
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import NsqConn, command, http_request, pub_cmd, unique, wait_until
from .nsqd_transport_support import (
    Certs,
    alive,
    client_round_trip,
    client_stats,
    https_rejected,
    make_certs,
    proc_status_kib,
    producer_stats,
    tls_rejected,
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


class Daemons:
    """One nsqd per flag set, started on first use and stopped at the end of the module."""

    def __init__(self, certs: Certs, base: Path) -> None:
        self.certs = certs
        self.base = base
        self.started: dict[tuple[str, ...], DaemonProcess] = {}

    def get(self, *flags: str) -> DaemonProcess:
        if flags not in self.started:
            data = self.base / f"nsqd{len(self.started)}"
            data.mkdir()
            self.started[flags] = start_nsqd(data, *self.certs.server_flags(), *flags, https=True)
        return self.started[flags]

    def stop_all(self) -> None:
        crashed = [d for d in self.started.values() if d.proc and d.proc.poll() is not None]
        for daemon in self.started.values():
            daemon.stop()
        assert not crashed, "nsqd died:\n" + "\n\n".join(d.log for d in crashed)


@pytest.fixture(scope="module")
def daemons(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemons]:
    pool = Daemons(certs, tmp_path_factory.mktemp("data"))
    yield pool
    pool.stop_all()


REQUIRE = ("--tls-client-auth-policy=require",)
TLS_REQUIRED = ("--tls-required=true",)
TCP_HTTPS = ("--tls-required=tcp-https",)
MIN_TLS13 = ("--tls-min-version=tls1.3",)


@pytest.fixture(scope="module")
def require_verify(certs: Certs) -> tuple[str, ...]:
    return ("--tls-client-auth-policy=require-verify", f"--tls-root-ca-file={certs.ca}")


def https_address(daemon: DaemonProcess) -> tuple[str, int]:
    return daemon.addresses["HTTPS"]


def tls_conn(daemon: DaemonProcess, certs: Certs, cert: str = "", **settings: object) -> NsqConn:
    conn = NsqConn(daemon.tcp_address)
    response = conn.negotiate(certs.client_context(cert), tls_v1=True, **settings)
    assert response["tls_v1"] is True
    return conn


# --------------------------------------------------------------------------- the upgrade


def test_tls_upgrade_then_publish_and_consume(daemons: Daemons, certs: Certs) -> None:
    """Go's TestTLS: JSON ``tls_v1:true`` in plain text, the handshake, then ``OK`` over TLS."""
    nsqd = daemons.get()
    topic, channel = unique("tls"), "ch"
    with tls_conn(nsqd, certs) as consumer, tls_conn(nsqd, certs) as producer:
        consumer.sub(topic, channel)
        consumer.send(command("RDY 10"))
        body = os.urandom(128_000)
        producer.pub(topic, body)
        producer.pub(topic, b"second")
        first, second = consumer.expect_message(), consumer.expect_message()
        assert (first.body, second.body, first.attempts) == (body, b"second", 1)
        consumer.send(command("FIN " + first.id.decode()) + command("FIN " + second.id.decode()))

        [client] = client_stats(nsqd, topic, channel)
        assert client["tls"] is True
        assert client["tls_version"] == "TLS1.3"
        assert client["tls_cipher_suite"].startswith("TLS_"), client
        assert (client["snappy"], client["deflate"]) == (False, False)
        assert (client["tls_negotiated_protocol"], client["tls_negotiated_protocol_is_mutual"]) == (
            "",
            False,
        )
        publishers = [p for p in producer_stats(nsqd) if p.get("pub_counts")]
        assert any(p["tls"] is True and p["tls_version"] == "TLS1.3" for p in publishers)


def test_tls12_client_reports_go_names_in_stats(daemons: Daemons, certs: Certs) -> None:
    """A TLS 1.2 connection: Go reports ``TLS1.2`` and the IANA cipher-suite name."""
    nsqd = daemons.get()
    topic = unique("tls12")
    conn = NsqConn(nsqd.tcp_address)
    with conn:
        context = certs.client_context(max_version=ssl.TLSVersion.TLSv1_2)
        conn.negotiate(context, tls_v1=True)
        conn.sub(topic, "ch")
        [client] = client_stats(nsqd, topic, "ch")
        assert client["tls_version"] == "TLS1.2"
        # Go: tls.CipherSuiteName, e.g. TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        assert client["tls_cipher_suite"].startswith("TLS_ECDHE_ECDSA_WITH_"), client


def test_tls_min_version_refuses_older_clients(daemons: Daemons, certs: Certs) -> None:
    nsqd = daemons.get(*MIN_TLS13)
    old = certs.client_context(max_version=ssl.TLSVersion.TLSv1_2)
    assert tls_rejected(nsqd.tcp_address, old)
    assert https_rejected(https_address(nsqd), old)
    assert not tls_rejected(nsqd.tcp_address, certs.client_context())


def test_https_listener_serves_the_api(daemons: Daemons, certs: Certs) -> None:
    """Without tls-required, HTTPS and plain HTTP both serve the API."""
    nsqd = daemons.get()
    topic = unique("https")
    context = certs.client_context()
    resp = http_request(
        https_address(nsqd), "POST", f"/pub?topic={topic}", b"x", tls_context=context
    )
    assert (resp.status, resp.body) == (200, b"OK")
    resp = http_request(https_address(nsqd), "GET", "/ping", tls_context=context)
    assert (resp.status, resp.body) == (200, b"OK")
    resp = http_request(nsqd.http_address, "POST", f"/pub?topic={topic}", b"y")
    assert (resp.status, resp.body) == (200, b"OK")
    resp = http_request(
        https_address(nsqd), "GET", f"/stats?format=json&topic={topic}", tls_context=context
    )
    assert resp.json()["topics"][0]["depth"] == 2


@pytest.mark.parametrize("request_line", [b"GET /ping", b"POST /pub?topic=t", b"OPTIONS *"])
def test_plain_http_on_the_https_port(daemons: Daemons, request_line: bytes) -> None:
    """Go's http.Server answers a plain request on its TLS port with a fixed 400."""
    nsqd = daemons.get()
    with socket.create_connection(https_address(nsqd), timeout=5) as sock:
        sock.sendall(request_line + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert (
        answer
        == b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
    )


# --------------------------------------------------------------------------- start-up errors


def start_up_error(tmp_path: Path, *flags: str) -> str:
    """Run nsqd with ``flags``; it must exit 1 with one FATAL line, returned without prefix."""
    proc = subprocess.run(
        [sys.executable, "-m", "nsqpy.nsqd", f"--data-path={tmp_path}",
         "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
         "--https-address=127.0.0.1:0", *flags],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    [fatal] = [line for line in proc.stderr.splitlines() if "FATAL: " in line]
    return fatal.split("FATAL: ", 1)[1]


PREFIX = "failed to instantiate nsqd - "


@pytest.mark.parametrize(
    "flags, error",
    [
        (["--tls-required=true"], "cannot require TLS client connections without TLS key and cert"),
        (["--tls-client-auth-policy=require"], "cannot require TLS client connections without "
         "TLS key and cert"),
        (["cert"], "failed to build TLS config - open : no such file or directory"),
        (["cert", "--tls-key={d}/missing.key"],
         "failed to build TLS config - open {d}/missing.key: no such file or directory"),
        (["--tls-cert={d}/server.pem", "--tls-key={d}/client.key"],
         "failed to build TLS config - tls: private key does not match public key"),
        (["--tls-cert={d}/server.key", "--tls-key={d}/server.key"],
         "failed to build TLS config - tls: failed to find certificate PEM data in certificate "
         "input, but did find a private key; PEM inputs may have been switched"),
        (["--tls-cert={d}/server.pem", "--tls-key={d}/server.pem"],
         "failed to build TLS config - tls: found a certificate rather than a key in the PEM "
         "for the private key"),
        (["--tls-cert={d}/server.ext", "--tls-key={d}/server.key"],
         "failed to build TLS config - tls: failed to find any PEM data in certificate input"),
        (["pair", "--tls-root-ca-file={d}/missing.pem"],
         "failed to build TLS config - open {d}/missing.pem: no such file or directory"),
        (["pair", "--tls-client-auth-policy=require-verify", "--tls-root-ca-file={d}/server.key"],
         "failed to build TLS config - failed to append certificate to pool"),
    ],
    ids=["required", "policy", "no-key", "missing-key", "mismatch", "switched", "cert-as-key",
         "no-pem", "missing-ca", "ca-without-cert"],
)  # fmt: skip
def test_tls_start_up_errors(tmp_path: Path, certs: Certs, flags: list[str], error: str) -> None:
    """Go's buildTLSConfig and New() errors, word for word."""
    d = str(certs.directory)
    pair = [f"--tls-cert={d}/server.pem", f"--tls-key={d}/server.key"]
    expanded: list[str] = []
    for flag in flags:
        if flag == "pair":
            expanded += pair
        elif flag == "cert":
            expanded.append(pair[0])
        else:
            expanded.append(flag.format(d=d))
    assert start_up_error(tmp_path, *expanded) == PREFIX + error.format(d=d)


def test_unknown_client_auth_policy_asks_for_no_certificate(daemons: Daemons, certs: Certs) -> None:
    """Go's switch has no error branch: an unknown policy means no client certificate, and
    (like any policy) it turns tls-required on."""
    nsqd = daemons.get("--tls-client-auth-policy=whatever")
    assert not tls_rejected(nsqd.tcp_address, certs.client_context())
    with NsqConn(nsqd.tcp_address) as conn:
        conn.send(command("SUB t ch"))
        conn.expect_error("E_INVALID cannot SUB in current state (TLS required)")


# --------------------------------------------------------------------------- client certificates


def test_require_policy_over_tcp(daemons: Daemons, certs: Certs) -> None:
    """Go's TestTLSAuthRequire: ``require`` refuses a client without a certificate, accepts any
    certificate."""
    nsqd = daemons.get(*REQUIRE)
    assert tls_rejected(nsqd.tcp_address, certs.client_context())
    assert not tls_rejected(nsqd.tcp_address, certs.client_context("self-signed"))
    assert not tls_rejected(nsqd.tcp_address, certs.client_context("signed"))
    with tls_conn(nsqd, certs, "self-signed") as conn:
        conn.pub(unique("require"), b"accepted")
    assert alive(nsqd)


def test_require_policy_over_https(daemons: Daemons, certs: Certs) -> None:
    """Go's TestHTTPSRequire: plain HTTP is refused (the policy forces tls-required); HTTPS needs
    a cert."""
    nsqd = daemons.get(*REQUIRE)
    assert https_rejected(https_address(nsqd), certs.client_context())
    assert not https_rejected(https_address(nsqd), certs.client_context("self-signed"))
    topic = unique("require_https")
    resp = http_request(
        https_address(nsqd),
        "POST",
        f"/pub?topic={topic}",
        b"m",
        tls_context=certs.client_context("signed"),
    )
    assert (resp.status, resp.body) == (200, b"OK")
    assert_tls_required_403(nsqd, "POST", f"/pub?topic={topic}")


def test_require_verify_policy_over_tcp(
    daemons: Daemons, certs: Certs, require_verify: tuple[str, ...]
) -> None:
    """Go's TestTLSAuthRequireVerify: no certificate and a self-signed one are refused; a
    CA-signed one is accepted."""
    nsqd = daemons.get(*require_verify)
    assert tls_rejected(nsqd.tcp_address, certs.client_context())
    assert tls_rejected(nsqd.tcp_address, certs.client_context("self-signed"))
    assert not tls_rejected(nsqd.tcp_address, certs.client_context("signed"))
    with tls_conn(nsqd, certs, "signed") as conn:
        conn.pub(unique("verify"), b"accepted")


def test_require_verify_policy_over_https(
    daemons: Daemons, certs: Certs, require_verify: tuple[str, ...]
) -> None:
    """Go's TestHTTPSRequireVerify: HTTPS with an unsigned certificate fails, a signed one works."""
    nsqd = daemons.get(*require_verify)
    assert https_rejected(https_address(nsqd), certs.client_context())
    assert https_rejected(https_address(nsqd), certs.client_context("self-signed"))
    assert not https_rejected(https_address(nsqd), certs.client_context("signed"))
    assert_tls_required_403(nsqd, "GET", "/ping")


def https_failure(daemon: DaemonProcess, context: ssl.SSLContext) -> str:
    try:
        http_request(https_address(daemon), "GET", "/ping", tls_context=context)
    except ssl.SSLError as exc:
        return str(exc)
    raise AssertionError("the HTTPS request went through")


def tcp_failure(daemon: DaemonProcess, context: ssl.SSLContext) -> str:
    with NsqConn(daemon.tcp_address) as conn:
        conn.identify_json(tls_v1=True)
        try:
            conn.sock = context.wrap_socket(conn.sock, server_hostname="127.0.0.1")
            conn.read_frame()
        except ssl.SSLError as exc:
            return str(exc)
    raise AssertionError("the TLS upgrade went through")


def test_https_refusals_say_why_with_a_tls_alert(
    daemons: Daemons, certs: Certs, require_verify: tuple[str, ...]
) -> None:
    """As Go's crypto/tls, the refusal is an alert, not a bare close."""
    nsqd = daemons.get(*require_verify)
    assert "certificate required" in https_failure(nsqd, certs.client_context())
    assert "unknown ca" in https_failure(nsqd, certs.client_context("self-signed"))


def test_tcp_refusals_say_why_with_a_tls_alert(
    daemons: Daemons, certs: Certs, require_verify: tuple[str, ...]
) -> None:
    nsqd = daemons.get(*require_verify)
    assert "certificate required" in tcp_failure(nsqd, certs.client_context())
    assert "unknown ca" in tcp_failure(nsqd, certs.client_context("self-signed"))


def test_require_verify_with_tcp_https_lets_plain_http_through(
    daemons: Daemons, certs: Certs, require_verify: tuple[str, ...]
) -> None:
    """Go's TestTLSRequireVerifyExceptHTTP: plain ``/pub`` works, TCP still needs TLS."""
    nsqd = daemons.get(*require_verify, *TCP_HTTPS)
    resp = http_request(nsqd.http_address, "POST", f"/pub?topic={unique('except')}", b"m")
    assert (resp.status, resp.body) == (200, b"OK")
    assert https_rejected(https_address(nsqd), certs.client_context("self-signed"))
    with NsqConn(nsqd.tcp_address) as conn:
        conn.send(pub_cmd("t", b"m"))
        conn.expect_error("E_INVALID cannot PUB in current state (TLS required)")


# --------------------------------------------------------------------------- TLS required


def assert_tls_required_403(nsqd: DaemonProcess, method: str, path: str) -> None:
    resp = http_request(nsqd.http_address, method, path, b"m" if method == "POST" else None)
    https_port = https_address(nsqd)[1]
    assert resp.status == 403
    assert resp.body == f'{{"message": "TLS_REQUIRED", "https_port": {https_port}}}'.encode()
    assert resp.headers["X-NSQ-Content-Type"] == "nsq; version=1.0"


@pytest.mark.parametrize(
    "cmd, name",
    [
        (command("SUB t ch"), "SUB"),
        (pub_cmd("t", b"m"), "PUB"),
        (command("MPUB t", b"\x00\x00\x00\x01\x00\x00\x00\x01m"), "MPUB"),
        (command("DPUB t 10", b"m"), "DPUB"),
        (command("RDY 1"), "RDY"),
        (command("NOP"), "NOP"),
        (command("AUTH", b"secret"), "AUTH"),
        (command("FOO bar"), "FOO"),  # checked before dispatch: even unknown commands
    ],
)
@pytest.mark.parametrize("policy", [TLS_REQUIRED, TCP_HTTPS], ids=["true", "tcp-https"])
def test_tls_required_refuses_plain_commands(
    daemons: Daemons, policy: tuple[str, ...], cmd: bytes, name: str
) -> None:
    """Go's TestTLSRequired: every command but IDENTIFY needs TLS first (fatal)."""
    nsqd = daemons.get(*policy)
    with NsqConn(nsqd.tcp_address) as conn:
        conn.send(cmd)
        conn.expect_error(f"E_INVALID cannot {name} in current state (TLS required)")


def test_tls_required_allows_identify_then_needs_the_upgrade(
    daemons: Daemons, certs: Certs
) -> None:
    nsqd = daemons.get(*TLS_REQUIRED)
    with NsqConn(nsqd.tcp_address) as conn:
        response = conn.negotiate()  # IDENTIFY is allowed; without tls_v1 nothing changes
        assert response["tls_v1"] is False
        conn.send(command("SUB t ch"))
        conn.expect_error("E_INVALID cannot SUB in current state (TLS required)")
    topic = unique("required")
    with tls_conn(nsqd, certs) as conn:
        conn.sub(topic, "ch")
        conn.send(command("RDY 1"))
        resp = http_request(
            https_address(nsqd),
            "POST",
            f"/pub?topic={topic}",
            b"over https",
            tls_context=certs.client_context(),
        )
        assert resp.status == 200
        assert conn.expect_message().body == b"over https"


@pytest.mark.parametrize(
    "method, path",
    [("GET", "/ping"), ("GET", "/stats"), ("POST", "/pub?topic=t"), ("GET", "/nope")],
)
def test_tls_required_refuses_plain_http(
    daemons: Daemons, certs: Certs, method: str, path: str
) -> None:
    """With TLS required, as Go, every plain HTTP request gets the hand-written 403; HTTPS works."""
    nsqd = daemons.get(*TLS_REQUIRED)
    assert_tls_required_403(nsqd, method, path)
    resp = http_request(https_address(nsqd), "GET", "/ping", tls_context=certs.client_context())
    assert (resp.status, resp.body) == (200, b"OK")


def test_tcp_https_lets_plain_http_through(daemons: Daemons, certs: Certs) -> None:
    nsqd = daemons.get(*TCP_HTTPS)
    topic = unique("tcp_https")
    resp = http_request(nsqd.http_address, "POST", f"/pub?topic={topic}", b"plain http")
    assert (resp.status, resp.body) == (200, b"OK")
    with tls_conn(nsqd, certs) as conn:
        conn.sub(topic, "ch")
        conn.send(command("RDY 1"))
        assert conn.expect_message().body == b"plain http"


# --------------------------------------------------------------------------- nsqpy.client


async def test_nsqpy_client_over_tls_with_a_client_certificate(
    daemons: Daemons, certs: Certs, require_verify: tuple[str, ...]
) -> None:
    """Our Producer and Consumer through require-verify TLS (CA-checked both ways); plain
    HTTP stays open (tcp-https) for the stats."""
    nsqd = daemons.get(*require_verify, *TCP_HTTPS)
    [client] = await client_round_trip(
        nsqd, unique("client_tls"), tls=certs.client_context("signed")
    )
    assert (client["tls"], client["tls_version"], client["snappy"]) == (True, "TLS1.3", False)


# --------------------------------------------------------------------------- garbage and fuzz


def test_garbage_instead_of_a_client_hello(daemons: Daemons) -> None:
    nsqd = daemons.get()
    with NsqConn(nsqd.tcp_address) as conn:
        assert conn.identify_json(tls_v1=True)["tls_v1"] is True
        conn.send_raw(b"GET / HTTP/1.1\r\n\r\n" + os.urandom(512))
        conn.expect_closed()
    assert alive(nsqd)


def test_garbage_after_the_handshake(daemons: Daemons, certs: Certs) -> None:
    """Plain bytes where TLS records belong: the connection is dropped, nsqd carries on."""
    nsqd = daemons.get()
    conn = tls_conn(nsqd, certs)
    with conn:
        assert isinstance(conn.sock, ssl.SSLSocket)
        raw = socket.socket(fileno=os.dup(conn.sock.fileno()))
        try:
            raw.sendall(b"SUB t ch\n" + os.urandom(4096))
            raw.settimeout(3.0)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:  # what comes back is at most a TLS alert
                try:
                    if not raw.recv(65536):
                        break
                except ConnectionResetError:
                    break
            else:
                raise AssertionError("nsqd kept the connection open")
        finally:
            raw.close()
    assert alive(nsqd)


def test_tls_handshake_deadline(daemons: Daemons) -> None:
    """As Go (a 5 s deadline on the IDENTIFY upgrade's handshake): a client that asks for TLS and
    never shakes hands is dropped after 5 s."""
    nsqd = daemons.get()
    with NsqConn(nsqd.tcp_address) as conn:
        assert conn.identify_json(tls_v1=True)["tls_v1"] is True
        started = time.monotonic()
        conn.expect_closed(timeout=8.0)
        assert 4.0 <= time.monotonic() - started <= 7.0


def open_sockets(pid: int) -> int:
    """How many sockets the process holds open (listeners included)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:  # closed while we looked
            pass
    return count


def test_random_bytes_on_many_tls_connections(daemons: Daemons, certs: Certs) -> None:
    """Truncated handshakes, random records, resets: nsqd survives with bounded memory."""
    nsqd = daemons.get()
    rng = random.Random(5)
    before = proc_status_kib(nsqd.pid, "VmRSS")
    sockets_before = open_sockets(nsqd.pid)
    hello = _client_hello(certs)
    for i in range(60):
        conn = NsqConn(nsqd.tcp_address)
        try:
            conn.identify_json(tls_v1=True)
            kind = i % 4
            if kind == 0:  # a truncated ClientHello, then close
                conn.send_raw(hello[: rng.randrange(1, len(hello))])
            elif kind == 1:  # a real ClientHello with flipped bytes
                mutated = bytearray(hello)
                for _ in range(8):
                    mutated[rng.randrange(5, len(mutated))] ^= 1 << rng.randrange(8)
                conn.send_raw(bytes(mutated))
            elif kind == 2:  # a plausible record header announcing a huge record
                conn.send_raw(b"\x16\x03\x01\xff\xff" + os.urandom(rng.randrange(0, 20000)))
            else:
                conn.send_raw(os.urandom(rng.randrange(1, 70000)))
            conn.sock.settimeout(0.2)
            try:
                conn.sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass
        finally:
            conn.close()
    assert alive(nsqd)
    wait_until(
        lambda: open_sockets(nsqd.pid) <= sockets_before,
        timeout=10.0,
        what="nsqd to close the fuzzed connections",
    )
    after = proc_status_kib(nsqd.pid, "VmRSS")
    assert after - before < 50_000, (before, after)
    with tls_conn(nsqd, certs) as conn:
        conn.pub(unique("after_fuzz"), b"still serving")


def _client_hello(certs: Certs) -> bytes:
    """The first flight of a real TLS client, captured from a memory BIO."""
    context = certs.client_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()
