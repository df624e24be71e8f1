"""One misbehaving connection cannot stall nsqlookupd for the others.

A connection pipelining REGISTER/UNREGISTER as fast as it can, whether or not it reads its
replies, and a client flooding the HTTP port with keep-alive requests: meanwhile an innocent
``/lookup``, ``/ping`` and TCP ``PING`` are each answered within a generous second, the flooding
connection gets its replies in order, and one that never reads is no longer read from once its
unsent replies pass the transport's bound. Every flood is bounded in time and in size.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from nsqpy.internal import lg
from nsqpy.nsqlookupd import NSQLookupd, Options
from nsqpy.nsqlookupd.registration_db import PeerInfo, Producer, RegistrationDB
from nsqpy.nsqlookupd.tcp import WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW
from nsqpy.testing import DaemonProcess, start_nsqlookupd

#: The bound an innocent request must be answered within while a flood runs (Go: ~10 ms).
INNOCENT_BOUND = 1.0
#: How long a flood lasts at most; the probes must be done well before.
FLOOD_SECONDS = 4.0
#: How many commands a flood sends at most.
FLOOD_MAX_COMMANDS = 2_000_000
#: Four commands per pair of lines, as the attack sends them.
REGISTER_PAIR = b"REGISTER flood c\nUNREGISTER flood c\n"
FLOOD_CHUNK = REGISTER_PAIR * 2048
OK_REPLY = struct.pack(">i", 2) + b"OK"


def identify_command(name: str) -> bytes:
    body = (
        b'{"broadcast_address":"%s","http_port":4151,"tcp_port":4150,"version":"1.3.0"}'
        % name.encode()
    )
    return b"IDENTIFY\n" + struct.pack(">i", len(body)) + body


def read_reply(sock: socket.socket) -> bytes:
    def exactly(size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            assert chunk, "connection closed"
            data += chunk
        return data

    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def identified_peer(address: tuple[str, int], name: str) -> socket.socket:
    sock = socket.create_connection(address, timeout=10)
    sock.sendall(b"  V1" + identify_command(name))
    assert read_reply(sock).startswith(b"{")
    return sock


@pytest.fixture
def lookupd() -> Iterator[DaemonProcess]:
    with start_nsqlookupd() as proc:
        yield proc


# --------------------------------------------------------------------------- floods


def send_whole(sock: socket.socket, data: bytes, going: Callable[[], bool]) -> bool:
    """Send all of ``data`` (never a part: the stream must stay whole commands) while
    ``going()``; False if stopped or the connection failed first."""
    view = memoryview(data)
    while view:
        if not going():
            return False
        try:
            view = view[sock.send(view) :]
        except TimeoutError:
            continue
        except OSError:
            return False
    return True


class RegisterFlood(threading.Thread):
    """One connection pipelining REGISTER/UNREGISTER for at most ``seconds`` and
    :data:`FLOOD_MAX_COMMANDS`, reading its replies or never reading a byte."""

    def __init__(self, address: tuple[str, int], *, read_replies: bool) -> None:
        super().__init__(daemon=True)
        self.sock = identified_peer(address, "flood")
        self.read_replies = read_replies
        self.commands_sent = 0
        self.replies = 0
        self.bad_reply: bytes | None = None
        self.deadline = time.monotonic() + FLOOD_SECONDS
        self._stop_flood = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)

    @property
    def running(self) -> bool:
        return self.is_alive() and time.monotonic() < self.deadline

    def run(self) -> None:
        if self.read_replies:
            self._reader.start()
        self.sock.settimeout(0.25)
        while self.commands_sent < FLOOD_MAX_COMMANDS and send_whole(
            self.sock, FLOOD_CHUNK, self._going
        ):
            self.commands_sent += 2 * 2048

    def _going(self) -> bool:
        return not self._stop_flood.is_set() and time.monotonic() < self.deadline

    def _read(self) -> None:
        pending = b""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                return
            pending += chunk
            whole = len(pending) // len(OK_REPLY)
            if pending[: whole * len(OK_REPLY)] != OK_REPLY * whole:
                self.bad_reply = pending[:64]
                return
            self.replies += whole
            pending = pending[whole * len(OK_REPLY) :]

    def wait_started(self) -> None:
        """Until lookupd is busy with the flood (it has answered some, if they are read)."""
        until = time.monotonic() + 2.0
        while time.monotonic() < until and self.commands_sent == 0:
            time.sleep(0.01)
        if self.read_replies:
            while time.monotonic() < until and self.replies == 0:
                time.sleep(0.01)
        time.sleep(0.2)

    def stop(self) -> None:
        self._stop_flood.set()
        self.join(FLOOD_SECONDS + 5)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        if self._reader.is_alive():
            self._reader.join(5)


class HTTPFlood(threading.Thread):
    """One keep-alive connection pipelining ``GET /lookup`` requests, reading the answers."""

    REQUESTS = b"GET /lookup?topic=innocent HTTP/1.1\r\nHost: lookupd\r\n\r\n" * 500

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(address, timeout=0.25)
        self.received = 0
        self.deadline = time.monotonic() + FLOOD_SECONDS
        self._stop_flood = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)

    @property
    def running(self) -> bool:
        return self.is_alive() and time.monotonic() < self.deadline

    def run(self) -> None:
        self._reader.start()
        for _ in range(400):  # at most 200,000 requests
            if not send_whole(self.sock, self.REQUESTS, self._going):
                break

    def _going(self) -> bool:
        return not self._stop_flood.is_set() and time.monotonic() < self.deadline

    def _read(self) -> None:
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                return
            self.received += len(chunk)

    def stop(self) -> None:
        self._stop_flood.set()
        self.join(FLOOD_SECONDS + 5)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._reader.join(5)


# --------------------------------------------------------------------------- innocent probes


class Innocent:
    """An nsqd registered for topic ``innocent`` and an HTTP client on a keep-alive connection."""

    def __init__(self, lookupd: DaemonProcess) -> None:
        self.tcp = identified_peer(lookupd.tcp_address, "innocent")
        self.tcp.sendall(b"REGISTER innocent\n")
        assert read_reply(self.tcp) == b"OK"
        self.http = http.client.HTTPConnection(*lookupd.http_address, timeout=30)
        self.worst: dict[str, float] = {}

    def _timed(self, what: str, started: float) -> None:
        self.worst[what] = max(self.worst.get(what, 0.0), time.monotonic() - started)

    def probe(self) -> None:
        started = time.monotonic()
        self.http.request("GET", "/lookup?topic=innocent")
        response = self.http.getresponse()
        assert response.status == 200
        assert b"innocent" in response.read()
        self._timed("/lookup", started)

        started = time.monotonic()
        self.http.request("GET", "/ping")
        response = self.http.getresponse()
        assert (response.status, response.read()) == (200, b"OK")
        self._timed("/ping", started)

        started = time.monotonic()
        self.tcp.sendall(b"PING\n")
        assert read_reply(self.tcp) == b"OK"
        self._timed("TCP PING", started)

    def close(self) -> None:
        self.http.close()
        self.tcp.close()


def probe_during(innocent: Innocent, flood: RegisterFlood | HTTPFlood, rounds: int = 5) -> None:
    for _ in range(rounds):
        innocent.probe()
        time.sleep(0.02)
    # The answers only count if they came while the flood was still going.
    assert flood.running, f"the flood ended before the probes did: {innocent.worst}"
    slow = {what: round(t, 3) for what, t in innocent.worst.items() if t > INNOCENT_BOUND}
    assert not slow, f"innocent requests waited beyond {INNOCENT_BOUND} s: {slow}"


# --------------------------------------------------------------------------- tests


def test_register_flood_reading_replies_does_not_stall_others(lookupd: DaemonProcess) -> None:
    innocent = Innocent(lookupd)
    flood = RegisterFlood(lookupd.tcp_address, read_replies=True)
    flood.start()
    try:
        flood.wait_started()
        probe_during(innocent, flood)
    finally:
        flood.stop()
        innocent.close()
    assert flood.bad_reply is None, f"a reply other than OK: {flood.bad_reply!r}"
    assert flood.replies > 0


def test_register_flood_never_reading_does_not_stall_others(lookupd: DaemonProcess) -> None:
    innocent = Innocent(lookupd)
    flood = RegisterFlood(lookupd.tcp_address, read_replies=False)
    flood.start()
    try:
        flood.wait_started()
        probe_during(innocent, flood)
    finally:
        flood.stop()
        innocent.close()


def test_http_keepalive_flood_does_not_stall_others(lookupd: DaemonProcess) -> None:
    innocent = Innocent(lookupd)
    flood = HTTPFlood(lookupd.http_address)
    flood.start()
    try:
        time.sleep(0.3)
        probe_during(innocent, flood)
    finally:
        flood.stop()
        innocent.close()
    assert flood.received > 0


def read_all(sock: socket.socket) -> bytes:
    data = bytearray()
    sock.settimeout(30)
    while chunk := sock.recv(1 << 16):
        data += chunk
    return bytes(data)


@pytest.mark.parametrize("ending", ["eof", "error"])
def test_pipelined_commands_are_answered_in_order(lookupd: DaemonProcess, ending: str) -> None:
    """Far more than one turn's work at once: every reply, in order, then the end."""
    commands = 30_000
    sock = identified_peer(lookupd.tcp_address, "pipeline")
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(read_all(sock)), daemon=True)
    reader.start()
    lines = [b"REGISTER t c%d\n" % (i % 100) if i % 3 else b"PING\n" for i in range(commands)]
    tail = b"REGISTER\nPING\n" if ending == "error" else b""
    sock.settimeout(60)
    sock.sendall(b"".join(lines) + tail)
    sock.shutdown(socket.SHUT_WR)
    reader.join(60)
    sock.close()
    assert received, "no EOF from lookupd"
    expected = OK_REPLY * commands
    if ending == "error":  # the error is the last reply: the PING after it is never run
        error = b"E_INVALID REGISTER insufficient number of params"
        expected += struct.pack(">i", len(error)) + error
    assert received[0] == expected


async def test_peer_not_reading_replies_is_not_read_from() -> None:
    """Once unsent replies pass the bound, lookupd runs none of the peer's commands and reads
    nothing more until they drain: its send stops progressing, the buffer stays bounded."""
    options = Options(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0")
    quiet = lg.Logger("[test] ", lg.ERROR, stream=io.StringIO())
    async with NSQLookupd(options, logger=quiet) as lookupd:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # small socket buffers on both ends, so that unsent replies pile up in the transport
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await asyncio.to_thread(sock.connect, lookupd.real_tcp_address)
        sock.settimeout(10)
        await asyncio.to_thread(sock.sendall, b"  V1" + identify_command("silent"))
        assert (await asyncio.to_thread(read_reply, sock)).startswith(b"{")
        (client,) = lookupd.tcp_clients
        transport = client.transport
        assert transport is not None
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

        stalled = threading.Event()

        def flood() -> None:
            # Two seconds in which lookupd reads nothing at all: far beyond any loop turn.
            sock.settimeout(2.0)
            deadline = time.monotonic() + 20
            view = memoryview(FLOOD_CHUNK)
            while time.monotonic() < deadline:
                try:
                    view = view[sock.send(view) :] or memoryview(FLOOD_CHUNK)
                except TimeoutError:
                    stalled.set()
                    return

        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        while sender.is_alive() and not stalled.is_set():
            await asyncio.sleep(0.05)
        assert stalled.is_set(), "lookupd kept reading from a peer that reads no replies"
        unsent = transport.get_write_buffer_size()
        assert not transport.is_reading()
        # paused once past the high mark; the kernel may still take a little before the stall,
        # and writing resumes only at the low mark
        assert WRITE_BUFFER_LOW < unsent <= WRITE_BUFFER_HIGH + len(OK_REPLY)
        await asyncio.sleep(0.3)
        assert transport.get_write_buffer_size() == unsent
        assert not transport.is_reading()
        sock.close()


def test_topic_unregister_touches_only_the_peers_own_channels() -> None:
    db = RegistrationDB()
    a, b = Producer(PeerInfo("a")), Producer(PeerInfo("b"))
    for i in range(1000):
        db.add_producer(("channel", "t", f"c{i}"), b)
    db.add_producer(("channel", "t", "c1"), a)
    db.add_producer(("channel", "t", "own"), a)
    db.add_producer(("channel", "u", "c1"), a)
    assert sorted(db.peer_channels("a", "t")) == [("channel", "t", "c1"), ("channel", "t", "own")]
    db.remove_producer(("channel", "t", "own"), "a")
    assert db.peer_channels("a", "t") == [("channel", "t", "c1")]
    db.remove_registration(("channel", "t", "c1"))
    assert db.peer_channels("a", "t") == []
    assert db.peer_channels("a", "u") == [("channel", "u", "c1")]
    assert len(db.peer_channels("b", "t")) == 999
