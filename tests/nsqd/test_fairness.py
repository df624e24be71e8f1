"""One event loop serves every nsqd client: no single TCP connection may stall the others or
grow nsqd's memory without bound (Go's goroutine per connection is the bar).

Each test runs one misbehaving connection from a thread while an innocent client asks
``/ping`` over HTTP and publishes over TCP; the innocent one must be answered within a bound
(:data:`ANSWER_BOUND`) far above the few milliseconds it takes, and far below the seconds a
connection that is run to its end in one piece costs, *while the attack is still running*.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import (
    Attack,
    NsqConn,
    channel_stats,
    command,
    http_request,
    identify_cmd,
    pub_cmd,
    topic_stats,
    unique,
    wait_until,
)
from .nsqd_transport_support import proc_status_kib

#: The innocent client's worst round trip the tests accept (seconds). Served fairly it takes a
#: few milliseconds; each attack below held it for one to many seconds when a connection's
#: input ran to its end in one piece.
ANSWER_BOUND = 0.75
PROBES = 6
PROBE_GAP = 0.05


@pytest.fixture
def nsqd(tmp_path: Path) -> Iterator[DaemonProcess]:
    daemon = start_nsqd(tmp_path)
    yield daemon
    daemon.stop()


# --------------------------------------------------------------------------- the innocent client


def innocent_round_trips(nsqd: DaemonProcess, attack: Attack) -> list[float]:
    """The innocent client's `/ping` and PUB round trips, taken while ``attack`` runs; each is
    asserted to have ended before the attack did."""
    conn = NsqConn(nsqd.tcp_address)
    conn.identify()
    topic = unique("innocent")
    times: list[float] = []
    for _ in range(PROBES):
        time.sleep(PROBE_GAP)
        start = time.monotonic()
        resp = http_request(nsqd, "GET", "/ping", timeout=10)
        assert resp.status == 200
        times.append(time.monotonic() - start)
        start = time.monotonic()
        conn.pub(topic, b"innocent")
        times.append(time.monotonic() - start)
        assert attack.running, "the attack ended before the innocent client was answered"
    conn.close()
    return times


def assert_fair(nsqd: DaemonProcess, attack: Attack) -> None:
    times = innocent_round_trips(nsqd, attack)
    assert max(times) < ANSWER_BOUND, f"innocent round trips {[round(t, 3) for t in times]}"


def raw_connection(nsqd: DaemonProcess) -> socket.socket:
    sock = socket.create_connection(nsqd.tcp_address, timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def send_for(sock: socket.socket, chunk: bytes, attack: Attack, seconds: float, most: int) -> None:
    """Send ``chunk`` again and again for ``seconds`` or ``most`` bytes, whichever is first."""
    attack.started.set()
    deadline = time.monotonic() + seconds
    while attack.sent < most and time.monotonic() < deadline:
        sock.sendall(chunk)
        attack.sent += len(chunk)


# --------------------------------------------------------------------------- the attacks


def test_a_pipelined_nop_flood_without_identify_does_not_stall_others(
    nsqd: DaemonProcess,
) -> None:
    sock = raw_connection(nsqd)
    sock.sendall(b"  V2")

    def flood(attack: Attack) -> None:
        send_for(sock, b"NOP\n" * 16384, attack, seconds=4, most=1 << 30)

    with Attack(flood) as attack:
        assert_fair(nsqd, attack)
    assert attack.error is None
    sock.close()


def test_a_deflate_bomb_of_nops_does_not_stall_others(nsqd: DaemonProcess) -> None:
    conn = NsqConn(nsqd.tcp_address)
    conn.negotiate(deflate=True)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    nops = b"NOP\n" * (1 << 20)
    pieces = [compressor.compress(nops) for _ in range(3)]  # 12 MiB inflated
    pieces.append(compressor.flush(zlib.Z_SYNC_FLUSH))

    def bomb(attack: Attack) -> None:
        attack.started.set()
        for data in pieces:
            conn.send_raw(data)
            attack.sent += len(data)
        # running until nsqd has inflated and run all of it: a NOP answers nothing, so a
        # heartbeat-free round trip is the next command's answer
        conn.send(b"SUB\n")
        conn.read_frame(timeout=50)

    with Attack(bomb) as attack:
        assert_fair(nsqd, attack)
    assert attack.error is None, attack.error


def test_a_max_rate_publisher_gets_every_answer_in_order_and_does_not_stall_others(
    nsqd: DaemonProcess,
) -> None:
    sock = raw_connection(nsqd)
    sock.sendall(b"  V2" + identify_cmd({"heartbeat_interval": -1}))
    topic = unique("flood")
    batch = pub_cmd(topic, b"x" * 100) * 2000
    total_batches = 400
    ok_frame = struct.pack(">ii", 6, 0) + b"OK"
    answers: list[int] = []

    def read_answers() -> None:
        buf = bytearray()
        expected = len(ok_frame) * (2000 * total_batches + 1)  # the IDENTIFY's OK first
        while len(buf) < expected:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
        answers.append(len(buf))
        answers.append(int(bytes(buf) == ok_frame * (2000 * total_batches + 1)))

    def flood(attack: Attack) -> None:
        reader = threading.Thread(target=read_answers, daemon=True)
        reader.start()
        attack.started.set()
        for _ in range(total_batches):
            sock.sendall(batch)
            attack.sent += len(batch)
        reader.join(60)

    with Attack(flood) as attack:
        assert_fair(nsqd, attack)
    assert attack.error is None, attack.error
    assert answers[1] == 1, "the publisher's answers are not its OKs, in order"
    stats = topic_stats(nsqd, topic)
    assert stats is not None and stats["message_count"] == 2000 * total_batches
    sock.close()


def subscribed_connection(
    nsqd: DaemonProcess, topic: str = "", heartbeat_ms: int = 60000
) -> socket.socket:
    sock = raw_connection(nsqd)
    sock.sendall(b"  V2" + identify_cmd({"heartbeat_interval": heartbeat_ms}))
    sock.sendall(command(f"SUB {topic or unique('fin')} ch"))
    return sock


def bad_fins(megabytes: int) -> bytes:
    line = b"FIN 0123456789abcdef\n"
    return line * (megabytes * (1 << 20) // len(line))


def test_a_flood_of_failing_fins_does_not_stall_others(nsqd: DaemonProcess) -> None:
    sock = subscribed_connection(nsqd)
    chunk = bad_fins(1)
    received = [0]

    def drain_answers() -> None:
        while True:
            try:
                data = sock.recv(1 << 20)
            except OSError:  # closed by the test
                return
            if not data:
                return
            received[0] += len(data)

    def flood(attack: Attack) -> None:
        threading.Thread(target=drain_answers, daemon=True).start()
        send_for(sock, chunk, attack, seconds=4, most=40 << 20)

    with Attack(flood) as attack:
        assert_fair(nsqd, attack)
    assert attack.error is None, attack.error
    sock.close()
    assert received[0] > 0


def test_a_client_that_never_reads_has_its_reading_paused_and_memory_bounded(
    nsqd: DaemonProcess,
) -> None:
    """Each failing FIN answers about three times its size: a client that never reads must
    not make nsqd hold its answers without bound (Go stops reading it after a few MiB)."""
    sock = subscribed_connection(nsqd)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    chunk = bad_fins(1)
    total = 32 << 20
    rss_before = proc_status_kib(nsqd.pid, "VmRSS")

    def flood(attack: Attack) -> None:
        attack.started.set()
        sock.setblocking(False)
        deadline = time.monotonic() + 6
        view = memoryview(chunk)
        offset = 0
        while attack.sent < total and time.monotonic() < deadline:
            try:
                sent = sock.send(view[offset:])
            except BlockingIOError:
                time.sleep(0.01)
                continue
            attack.sent += sent
            offset = (offset + sent) % len(chunk)

    with Attack(flood) as attack:
        assert_fair(nsqd, attack)
    assert attack.error is None, attack.error
    grown_mib = (proc_status_kib(nsqd.pid, "VmRSS") - rss_before) / 1024
    assert attack.sent < total, "nsqd read everything a client that never reads sent"
    assert grown_mib < 24, f"nsqd grew {grown_mib:.0f} MiB for a client that never reads"
    sock.close()


def test_a_client_paused_for_not_reading_is_closed_after_two_heartbeats(
    nsqd: DaemonProcess,
) -> None:
    """Nothing is read from a paused client, so its read deadline passes, as a Go connection
    blocked on its write deadline is closed."""
    topic = unique("noread")
    sock = subscribed_connection(nsqd, topic, heartbeat_ms=1000)
    sock.setblocking(False)
    chunk = memoryview(bad_fins(1))
    deadline = time.monotonic() + 5
    sent = stalled_since = 0.0
    while time.monotonic() < deadline:  # until the sends stop being taken for 0.5 s
        try:
            sent += sock.send(chunk)
            stalled_since = 0.0
        except BlockingIOError:
            stalled_since = stalled_since or time.monotonic()
            if time.monotonic() - stalled_since > 0.5:
                break
            time.sleep(0.01)
    assert stalled_since, f"nsqd kept reading a client that never reads ({sent:.0f} bytes)"

    def clients() -> int:
        stats = channel_stats(nsqd, topic, "ch")
        return len(stats["clients"]) if stats else -1

    assert clients() == 1
    wait_until(lambda: clients() == 0, timeout=15, what="the paused client closed")
    sock.close()


MPUB_COUNT = 1_048_575  # one-byte messages: the most a default --max-body-size holds


def huge_mpub(topic: str) -> bytes:
    body = struct.pack(">i", MPUB_COUNT) + b"\x00\x00\x00\x01x" * MPUB_COUNT
    return f"MPUB {topic}\n".encode() + struct.pack(">i", len(body)) + body


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


def mpub_attack(nsqd: DaemonProcess, topic: str, piece: int, cpu: list[float]) -> Attack:
    data = huge_mpub(topic)

    def publish(attack: Attack) -> None:
        conn = NsqConn(nsqd.tcp_address)
        conn.identify(heartbeat_interval=-1)
        attack.started.set()
        before = cpu_seconds(nsqd.pid)
        for start in range(0, len(data), piece):
            conn.send(data[start : start + piece])
            attack.sent += piece
        conn.expect_ok(timeout=50)
        cpu.append(cpu_seconds(nsqd.pid) - before)
        conn.close()

    return Attack(publish)


def test_a_maximum_mpub_of_tiny_messages_does_not_stall_others_and_costs_linear_work(
    nsqd: DaemonProcess,
) -> None:
    """One valid MPUB of a million one-byte messages is published a slice at a time; sent in
    4 KiB pieces it costs about what it costs in one piece (each byte is parsed once)."""
    whole, pieces = unique("mpub"), unique("mpub_pieces")
    cpu: list[float] = []
    with mpub_attack(nsqd, whole, len(huge_mpub(whole)), cpu) as attack:
        assert_fair(nsqd, attack)
    assert attack.error is None, attack.error
    with mpub_attack(nsqd, pieces, 4096, cpu) as attack:
        pass
    assert attack.error is None, attack.error
    for topic in (whole, pieces):
        stats = topic_stats(nsqd, topic)
        assert stats is not None and stats["message_count"] == MPUB_COUNT
    assert cpu[1] < 2 * cpu[0] + 1, f"nsqd CPU seconds, whole and in pieces: {cpu}"
