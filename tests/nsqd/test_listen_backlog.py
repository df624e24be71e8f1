"""A burst of connects while the daemon is busy: the TCP listeners keep Go's backlog (the
system's somaxconn), not the event loop's default of 100, so the kernel completes every
handshake of the burst and the daemon serves them all once it gets to them."""

from __future__ import annotations

import os
import signal
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nsqpy.protocol import FRAME_TYPE_ERROR
from nsqpy.testing import DaemonProcess, start_nsqd, start_nsqlookupd

BURST = 300  # above the loop's default backlog of 100, well below somaxconn (4096)


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        daemon.stop()


def connect_burst_while_stopped(daemon: DaemonProcess) -> list[socket.socket]:
    """Connect BURST sockets while the daemon cannot accept (SIGSTOP): only the backlog holds
    them. A SYN beyond the backlog is dropped, and its connect times out."""
    socks: list[socket.socket] = []
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        for _ in range(BURST):
            socks.append(socket.create_connection(daemon.tcp_address, timeout=0.5))
    except OSError:
        for sock in socks:
            sock.close()
        raise
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    return socks


def recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    size, frame_type = struct.unpack(">lL", recv_exact(sock, 8))
    return frame_type, recv_exact(sock, size - 4)


def nsqd_answer(sock: socket.socket) -> None:
    sock.sendall(b"  V2BOGUS\n")
    frame_type, body = read_frame(sock)
    assert frame_type == FRAME_TYPE_ERROR and body.startswith(b"E_INVALID"), body


def lookupd_answer(sock: socket.socket) -> None:
    sock.sendall(b"  V1PING\n")
    (size,) = struct.unpack(">l", recv_exact(sock, 4))
    assert recv_exact(sock, size) == b"OK"


@pytest.mark.parametrize("kind", ["nsqd", "nsqlookupd"])
def test_connect_burst_beyond_the_loops_default_backlog(
    kind: str, daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    daemon = start_nsqd(tmp_path) if kind == "nsqd" else start_nsqlookupd()
    daemons.append(daemon)
    answer: Callable[[socket.socket], None] = nsqd_answer if kind == "nsqd" else lookupd_answer
    socks = connect_burst_while_stopped(daemon)
    try:
        for sock in socks:
            sock.settimeout(10)
            answer(sock)
    finally:
        for sock in socks:
            sock.close()
