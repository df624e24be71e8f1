"""nsqd and nsqlookupd at their descriptor limit: they raise the soft limit to the hard one at
start (as Go's runtime does); at the hard limit they refuse new TCP clients at once, keep the
HTTP API answering, say so once per interval, and take clients again when others leave."""

from __future__ import annotations

import resource
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from nsqpy.testing import DaemonProcess

from ..raw_v2 import ConnectionClosed, NsqConn, http_request, stats, wait_until
from .support import REPEAT_INTERVAL, LimitedNsqd, log_lines_since, log_mark, nsqd_args

ATTEMPTS = 400  # bound on the connections any one test opens
C = TypeVar("C")


@pytest.fixture(autouse=True)
def own_descriptors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This test process holds hundreds of sockets itself."""
    monkeypatch.setenv("NSQPY_LOG_REPEAT_INTERVAL", str(REPEAT_INTERVAL))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def start_nsqd(
    daemons: list[DaemonProcess], data: Path, soft: int, hard: int, module: str = "nsqpy.nsqd"
) -> DaemonProcess:
    daemon = LimitedNsqd((soft, hard), module, nsqd_args(data))
    daemons.append(daemon)
    return daemon.start(15.0)


def start_nsqlookupd(daemons: list[DaemonProcess], soft: int, hard: int) -> DaemonProcess:
    args = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]
    daemon = LimitedNsqd((soft, hard), "nsqpy.nsqlookupd", args)
    daemons.append(daemon)
    return daemon.start(15.0)


# ------------------------------------------------------------------ one client of each daemon


def nsqd_client(nsqd: DaemonProcess) -> NsqConn | None:
    """A connection nsqd serves (a PUB answered OK), or None when nsqd closed it."""
    conn = NsqConn(nsqd.tcp_address)
    try:
        conn.pub("fd", b"x")
    except (ConnectionClosed, ConnectionError):
        conn.close()
        return None
    return conn


class LookupPeer:
    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=5.0)

    def ping(self) -> bytes:
        self.sock.sendall(b"PING\n")
        header = self._read(4)
        return self._read(struct.unpack(">I", header)[0])

    def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionClosed("closed")
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def lookupd_client(lookupd: DaemonProcess) -> LookupPeer | None:
    peer = LookupPeer(lookupd.tcp_address)
    try:
        peer.sock.sendall(b"  V1")
        assert peer.ping() == b"OK"
    except (ConnectionClosed, ConnectionError):
        peer.close()
        return None
    return peer


def open_until_refused(connect: Callable[[], C | None]) -> tuple[list[C], int]:
    """Open served connections until one is refused; (the served ones, refused attempts)."""
    served: list[C] = []
    for _ in range(ATTEMPTS):
        client = connect()
        if client is None:
            return served, 1
        served.append(client)
    raise AssertionError(f"{ATTEMPTS} connections served: no limit reached")


# ------------------------------------------------------------------------------ the tests


def test_nsqd_raises_the_soft_limit_and_serves_more_clients_than_it(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    nsqd = start_nsqd(daemons, tmp_path, soft=128, hard=2048)
    assert any("NOFILE: descriptor limit 2048 (hard 2048)" in line for line in nsqd.log_lines)
    clients: list[NsqConn] = []
    try:
        for _ in range(300):  # over twice the soft limit it was started with
            client = nsqd_client(nsqd)
            assert client is not None, f"refused after {len(clients)} clients"
            clients.append(client)
        assert len(stats(nsqd)["producers"]) == 300
    finally:
        for client in clients:
            client.close()


def assert_refuses_then_recovers(
    daemon: DaemonProcess, connect: Callable[[], C | None], limit: int, close: Callable[[C], None]
) -> None:
    mark = log_mark(daemon)
    served, refused = open_until_refused(connect)
    try:
        assert limit // 2 < len(served) < limit, len(served)
        for _ in range(30):  # more attempts while full: refused at once, said once
            assert connect() is None
            refused += 1
        for _ in range(5):  # the operator still sees the daemon
            assert http_request(daemon, "GET", "/ping").status == 200
            path = "/stats" if "nsqd" in daemon.module else "/info"
            assert http_request(daemon, "GET", path).status == 200
        for client in served[:10]:
            close(client)
        del served[:10]
        again = wait_until(connect, 10.0, "a connection served again")
        assert again is not None
        served.append(again)
    finally:
        for client in served:
            close(client)
    # the daemon's log is read from its stderr by a thread: wait for the last line
    wait_until(
        lambda: any("accepting new connections again" in line for line in daemon.log_lines),
        10.0,
        "the end of the refusals logged",
    )
    lines = log_lines_since(daemon, mark)
    refusals = [line for line in lines if "refusing new connections" in line]
    assert 1 <= len(refusals) <= 3, refusals  # 31 refused connections, a line or two


# uvloop (the default) and asyncio's selector loop both: at EMFILE the first accepts and closes
# every pending connection (libuv's reserved-descriptor trick), the second logs a traceback and
# stops accepting for a second; the reserve means neither is reached
@pytest.mark.parametrize("module", ["nsqpy.nsqd", "tests.faults.stdlib_loop_nsqd"])
def test_nsqd_at_its_hard_limit_refuses_clients_but_answers_http(
    tmp_path: Path, daemons: list[DaemonProcess], module: str
) -> None:
    nsqd = start_nsqd(daemons, tmp_path, soft=128, hard=128, module=module)
    assert any("NOFILE: descriptor limit 128 (hard 128)" in line for line in nsqd.log_lines)
    assert_refuses_then_recovers(nsqd, lambda: nsqd_client(nsqd), 128, NsqConn.close)
    assert stats(nsqd)["health"] == "OK"


def test_nsqlookupd_at_its_hard_limit_refuses_peers_but_answers_http(
    daemons: list[DaemonProcess],
) -> None:
    lookupd = start_nsqlookupd(daemons, soft=96, hard=96)
    assert any("NOFILE: descriptor limit 96 (hard 96)" in line for line in lookupd.log_lines)
    assert_refuses_then_recovers(lookupd, lambda: lookupd_client(lookupd), 96, LookupPeer.close)
