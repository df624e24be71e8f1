"""Shared by the nsqd storage tests (durability, corruption, storage format).

Three parts, none of which uses nsqpy's own codec or disk queue, so a bug there cannot hide:

* the on-disk format written from its description (go-nsq-behaviour.md §6): data files, the
  per-queue metadata file and ``nsqd.dat``, to build data directories byte by byte and to parse
  what nsqd wrote;
* a raw TCP V2 client speaking bytes to a real nsqd process;
* HTTP helpers for ``/stats``, ``/ping`` and the admin endpoints.
"""

from __future__ import annotations

import http.client
import json
import re
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsqpy.testing import DaemonProcess

# ------------------------------------------------------------------------------ disk format

#: nsqd's minMsgSize: BE64 timestamp + BE16 attempts + 16-byte ID.
MESSAGE_HEADER = 26
_MSG_HEADER = struct.Struct(">QH")
_LENGTH = struct.Struct(">I")
_META = re.compile(rb"(-?\d+)\n(\d+),(\d+)\n(\d+),(\d+)\n")


@dataclass(frozen=True)
class Msg:
    timestamp: int
    attempts: int
    id: bytes
    body: bytes


def encode_message(msg: Msg) -> bytes:
    """The record payload: ``BE64(timestamp_ns) BE16(attempts) 16-byte ID body``."""
    assert len(msg.id) == 16
    return _MSG_HEADER.pack(msg.timestamp, msg.attempts) + msg.id + msg.body


def decode_message(data: bytes) -> Msg:
    assert len(data) >= MESSAGE_HEADER, data
    timestamp, attempts = _MSG_HEADER.unpack_from(data)
    return Msg(timestamp, attempts, data[10:26], data[26:])


def frame_record(payload: bytes) -> bytes:
    """A diskqueue record: ``BE32(len)`` then the payload."""
    return _LENGTH.pack(len(payload)) + payload


def parse_records(data: bytes) -> list[bytes]:
    """Split a data file into record payloads; it must end exactly on a record boundary."""
    records = []
    pos = 0
    while pos < len(data):
        assert pos + 4 <= len(data), f"truncated length at {pos}"
        (length,) = _LENGTH.unpack_from(data, pos)
        assert length >= MESSAGE_HEADER, f"record at {pos} shorter than a message: {length}"
        assert pos + 4 + length <= len(data), f"truncated record at {pos}"
        records.append(data[pos + 4 : pos + 4 + length])
        pos += 4 + length
    return records


def data_file(directory: Path, queue: str, num: int) -> Path:
    return directory / f"{queue}.diskqueue.{num:06d}.dat"


def meta_file(directory: Path, queue: str) -> Path:
    return directory / f"{queue}.diskqueue.meta.dat"


def meta_bytes(depth: int, read_num: int, read_pos: int, write_num: int, write_pos: int) -> bytes:
    return f"{depth}\n{read_num},{read_pos}\n{write_num},{write_pos}\n".encode()


@dataclass(frozen=True)
class Meta:
    depth: int
    read_num: int
    read_pos: int
    write_num: int
    write_pos: int


def read_meta(directory: Path, queue: str) -> Meta:
    text = meta_file(directory, queue).read_bytes()
    match = _META.fullmatch(text)
    assert match is not None, f"metadata of {queue} does not follow the format: {text!r}"
    return Meta(*(int(group) for group in match.groups()))


def queue_payloads(directory: Path, queue: str) -> list[bytes]:
    """The unread record payloads of a queue, following its metadata as a reader would."""
    meta = read_meta(directory, queue)
    payloads: list[bytes] = []
    for num in range(meta.read_num, meta.write_num + 1):
        path = data_file(directory, queue, num)
        if num == meta.write_num and meta.write_pos == 0 and not path.exists():
            break
        data = path.read_bytes()
        if num == meta.write_num:
            data = data[: meta.write_pos]
        start = meta.read_pos if num == meta.read_num else 0
        payloads.extend(parse_records(data[start:]))
    return payloads


def write_queue(
    directory: Path,
    queue: str,
    files: Sequence[Sequence[bytes]],
    first_num: int = 0,
    read_pos: int = 0,
) -> list[Path]:
    """Write data files ``first_num``.. holding the given record payloads and the metadata a
    queue in that state has: reading at ``read_pos`` of the first file, writing at the end of
    the last one, depth = the records from the read position on. Returns the data file paths.
    """
    paths = []
    for offset, records in enumerate(files):
        path = data_file(directory, queue, first_num + offset)
        path.write_bytes(b"".join(frame_record(p) for p in records))
        path.chmod(0o600)
        paths.append(path)
    skipped = len(parse_records(paths[0].read_bytes()[:read_pos])) if read_pos else 0
    depth = sum(len(records) for records in files) - skipped
    write_num = first_num + len(files) - 1
    meta = meta_file(directory, queue)
    meta.write_bytes(meta_bytes(depth, first_num, read_pos, write_num, paths[-1].stat().st_size))
    meta.chmod(0o600)
    return paths


def nsqd_dat(topics: Sequence[tuple[str, bool, Sequence[tuple[str, bool]]]]) -> bytes:
    """``nsqd.dat`` as Go marshals it: compact, struct field order, null for empty lists."""
    entries = []
    for name, paused, channels in topics:
        chans = [{"name": c, "paused": p} for c, p in channels] or None
        entries.append({"name": name, "paused": paused, "channels": chans})
    body = {"topics": entries or None, "version": "1.3.0"}
    return json.dumps(body, separators=(",", ":")).encode()


def make_id(number: int) -> bytes:
    """A message ID as nsqd makes them: 16 lowercase hex ASCII characters."""
    return b"%016x" % number


# ------------------------------------------------------------------------------ TCP client

MAGIC = b"  V2"
OK_FRAME = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
HEARTBEAT = b"_heartbeat_"
_FRAME_HEADER = struct.Struct(">ii")


class ConnectionClosed(AssertionError):
    pass


def pub_cmd(topic: str, body: bytes) -> bytes:
    return f"PUB {topic}\n".encode() + _LENGTH.pack(len(body)) + body


def dpub_cmd(topic: str, defer_ms: int, body: bytes) -> bytes:
    return f"DPUB {topic} {defer_ms}\n".encode() + _LENGTH.pack(len(body)) + body


def mpub_cmd(topic: str, bodies: Sequence[bytes]) -> bytes:
    inner = _LENGTH.pack(len(bodies)) + b"".join(_LENGTH.pack(len(b)) + b for b in bodies)
    return f"MPUB {topic}\n".encode() + _LENGTH.pack(len(inner)) + inner


class NsqConn:
    """A raw protocol V2 connection; reads are bounded by timeouts, heartbeats are answered."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=5.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self.sock.sendall(MAGIC)

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _frame_in_buffer(self) -> tuple[int, bytes] | None:
        while len(self._buf) >= 8:
            size, frame_type = _FRAME_HEADER.unpack_from(self._buf)
            if len(self._buf) < 4 + size:
                return None
            data = bytes(self._buf[8 : 4 + size])
            del self._buf[: 4 + size]
            if frame_type == 0 and data == HEARTBEAT:
                self.send(b"NOP\n")
                continue
            return frame_type, data
        return None

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive_some(self) -> None:
        """One recv into the buffer (the socket is known to be readable)."""
        self.sock.settimeout(5.0)
        try:
            chunk = self.sock.recv(1 << 20)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            raise ConnectionClosed(f"connection closed; unread {bytes(self._buf)[:200]!r}")
        self._buf += chunk

    def read_frame(self, timeout: float = 5.0) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout
        while True:
            found = self._frame_in_buffer()
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no frame in {timeout}s; unread {bytes(self._buf)[:200]!r}")
            readable, _, _ = select.select([self.sock], [], [], remaining)
            if readable:
                self.receive_some()

    def poll_frame(self) -> tuple[int, bytes] | None:
        """A frame if one is complete in the buffer, else None (no blocking)."""
        return self._frame_in_buffer()

    def expect_ok(self) -> None:
        assert self.read_frame() == (0, b"OK")

    def expect_error(self, text: str) -> None:
        """A fatal error frame, then the server closes the connection."""
        assert self.read_frame() == (1, text.encode())
        self.expect_closed()

    def expect_closed(self, timeout: float = 3.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            found = self._frame_in_buffer()
            assert found is None, f"unexpected frame before close: {found!r}"
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the server did not close the connection"
            readable, _, _ = select.select([self.sock], [], [], remaining)
            if readable:
                try:
                    self.receive_some()
                except ConnectionClosed:
                    return

    def read_message(self, timeout: float = 5.0) -> Msg:
        frame_type, data = self.read_frame(timeout)
        assert frame_type == 2, (frame_type, data)
        return decode_message(data)

    def expect_no_message(self, duration: float) -> None:
        try:
            frame = self.read_frame(duration)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected frame: {frame!r}")

    # commands

    def publish(self, topic: str, body: bytes) -> None:
        self.send(pub_cmd(topic, body))
        self.expect_ok()

    def mpublish(self, topic: str, bodies: Sequence[bytes]) -> None:
        self.send(mpub_cmd(topic, bodies))
        self.expect_ok()

    def dpublish(self, topic: str, defer_ms: int, body: bytes) -> None:
        self.send(dpub_cmd(topic, defer_ms, body))
        self.expect_ok()

    def subscribe(self, topic: str, channel: str) -> None:
        self.send(f"SUB {topic} {channel}\n".encode())
        self.expect_ok()

    def rdy(self, count: int) -> None:
        self.send(f"RDY {count}\n".encode())

    def fin(self, msg_id: bytes) -> None:
        self.send(b"FIN " + msg_id + b"\n")

    def req(self, msg_id: bytes, delay_ms: int) -> None:
        self.send(b"REQ " + msg_id + b" %d\n" % delay_ms)


def consume(conn: NsqConn, count: int, timeout: float = 10.0) -> list[Msg]:
    """Receive exactly ``count`` messages on a subscribed connection and FIN them.

    Works in rounds of at most 2500 (max RDY): RDY n, read n, RDY 0, FIN n; with RDY 0 before
    the FINs nothing beyond ``count`` is delivered.
    """
    deadline = time.monotonic() + timeout
    received: list[Msg] = []
    while len(received) < count:
        batch = min(count - len(received), 2500)
        conn.rdy(batch)
        got = [conn.read_message(max(deadline - time.monotonic(), 0.01)) for _ in range(batch)]
        conn.rdy(0)
        for msg in got:
            conn.fin(msg.id)
        received.extend(got)
    return received


def gather(conns: Sequence[NsqConn], count: int, timeout: float) -> list[tuple[int, Msg, float]]:
    """Read ``count`` messages from several connections as they arrive (FINed at once).

    Returns (connection index, message, monotonic arrival time) in arrival order.
    """
    deadline = time.monotonic() + timeout
    arrived: list[tuple[int, Msg, float]] = []
    while len(arrived) < count:
        for index, conn in enumerate(conns):
            found = conn.poll_frame()
            while found is not None:
                frame_type, data = found
                assert frame_type == 2, found
                msg = decode_message(data)
                conn.fin(msg.id)
                arrived.append((index, msg, time.monotonic()))
                found = conn.poll_frame()
        if len(arrived) >= count:
            break
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"only {len(arrived)} of {count} messages arrived in {timeout}s"
        readable, _, _ = select.select(list(conns), [], [], remaining)
        for conn in readable:
            conn.receive_some()
    return arrived


def subscriber(nsqd: DaemonProcess, topic: str, channel: str) -> NsqConn:
    conn = NsqConn(nsqd.tcp_address)
    conn.subscribe(topic, channel)
    return conn


def consume_from(
    nsqd: DaemonProcess, topic: str, channel: str, count: int, timeout: float = 10.0
) -> list[Msg]:
    """Subscribe, take exactly ``count`` messages (FINed), disconnect."""
    conn = subscriber(nsqd, topic, channel)
    try:
        return consume(conn, count, timeout)
    finally:
        conn.close()


def publish_many(nsqd: DaemonProcess, topic: str, bodies: Iterable[bytes]) -> None:
    conn = NsqConn(nsqd.tcp_address)
    try:
        for body in bodies:
            conn.publish(topic, body)
    finally:
        conn.close()


# ------------------------------------------------------------------------------ HTTP


def http_request(
    nsqd: DaemonProcess, method: str, path: str, body: bytes | None = None
) -> tuple[int, bytes]:
    host, port = nsqd.http_address
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def http_post(nsqd: DaemonProcess, path: str, body: bytes | None = None) -> None:
    status, data = http_request(nsqd, "POST", path, body)
    assert status == 200, (path, status, data)


def stats(nsqd: DaemonProcess) -> dict[str, Any]:
    status, data = http_request(nsqd, "GET", "/stats?format=json")
    assert status == 200, data
    result: dict[str, Any] = json.loads(data)
    return result


def topic_stats(nsqd: DaemonProcess, topic: str) -> dict[str, Any] | None:
    for entry in stats(nsqd)["topics"] or []:
        if entry["topic_name"] == topic:
            return dict(entry)
    return None


def channel_stats(nsqd: DaemonProcess, topic: str, channel: str) -> dict[str, Any] | None:
    entry = topic_stats(nsqd, topic)
    for chan in (entry or {}).get("channels") or []:
        if chan["channel_name"] == channel:
            return dict(chan)
    return None


def wait_until(condition: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.02)


# ------------------------------------------------------------------------------ processes


def log_since(nsqd: DaemonProcess, first_line: int) -> str:
    """The log lines a daemon wrote after ``first_line`` (e.g. since its last restart)."""
    with nsqd._lock:
        return "\n".join(nsqd.log_lines[first_line:])


def log_lines_now(nsqd: DaemonProcess) -> int:
    with nsqd._lock:
        return len(nsqd.log_lines)


def start_again(nsqd: DaemonProcess, timeout: float = 15.0) -> DaemonProcess:
    """Restart a stopped or killed daemon on the same arguments and data directory."""
    return nsqd.start(timeout)


def run_nsqd_to_exit(data_path: Path, *args: str, timeout: float = 20.0) -> tuple[int, str]:
    """Run an nsqd that is expected to refuse to start; (exit code, stderr)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nsqpy.nsqd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={data_path}",
            *args,
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result.returncode, result.stderr


class FileSizeLimitedNsqd(DaemonProcess):
    """nsqd whose files cannot grow past ``limit`` bytes: a full disk without mounting one.

    The child gets a soft RLIMIT_FSIZE (the hard limit stays unlimited, so the test can raise it
    later with ``resource.prlimit`` to "free space") and ignores SIGXFSZ, so a write past the
    limit fails with EFBIG instead of killing the process. Pipes and sockets are not affected.
    """

    def __init__(self, limit: int, data_path: Path, *args: str) -> None:
        base = [
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={data_path}",
            "--broadcast-address=127.0.0.1",
        ]
        super().__init__("nsqpy.nsqd", [*base, *args], ["TCP", "HTTP"])
        self.limit = limit

    def _limit_child(self) -> None:  # runs in the child between fork and exec
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, resource.RLIM_INFINITY))

    def popen_options(self) -> dict[str, Any]:
        return {"preexec_fn": self._limit_child}

    def set_limit(self, limit: int) -> None:
        """Change the running child's file size limit ("free" or "fill" the disk)."""
        resource.prlimit(self.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
