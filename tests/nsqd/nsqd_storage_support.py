"""Shared by the nsqd storage tests (durability, corruption, storage format).

Three parts, none of which uses nsqpy's own codec or disk queue, so a bug there cannot hide:

* Go's on-disk format, written out here: data files of ``BE32(len)`` + message records (a
  message is ``BE64(timestamp_ns) BE16(attempts) 16-byte ID body``), the per-queue text metadata
  file and the JSON ``nsqd.dat``, to build data directories byte by byte and to parse what nsqd
  wrote;
* helpers that publish and consume through the suite's raw V2 client (``tests/raw_v2.py``),
  which does not use nsqpy's codec either;
* helpers to run nsqd processes that are expected to fail, or whose files cannot grow.
"""

from __future__ import annotations

import contextlib
import json
import re
import resource
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import Message, NsqConn, channel_stats, decode_message, topic_stats

# ------------------------------------------------------------------------------ disk format

#: nsqd's minMsgSize: BE64 timestamp + BE16 attempts + 16-byte ID.
MESSAGE_HEADER = 26
_MSG_HEADER = struct.Struct(">QH")
_LENGTH = struct.Struct(">I")
_META = re.compile(rb"(-?\d+)\n(\d+),(\d+)\n(\d+),(\d+)\n")


def encode_message(msg: Message) -> bytes:
    """The record payload: ``BE64(timestamp_ns) BE16(attempts) 16-byte ID body``."""
    assert len(msg.id) == 16
    return _MSG_HEADER.pack(msg.timestamp, msg.attempts) + msg.id + msg.body


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


# ------------------------------------------------------------------------------ TCP


def consume(conn: NsqConn, count: int, timeout: float = 10.0) -> list[Message]:
    """Receive exactly ``count`` messages on a subscribed connection and FIN them.

    Works in rounds of at most 2500 (max RDY): RDY n, read n, RDY 0, FIN n; with RDY 0 before
    the FINs nothing beyond ``count`` is delivered.
    """
    deadline = time.monotonic() + timeout
    received: list[Message] = []
    while len(received) < count:
        batch = min(count - len(received), 2500)
        conn.rdy(batch)
        got = [conn.expect_message(max(deadline - time.monotonic(), 0.01)) for _ in range(batch)]
        conn.rdy(0)
        for msg in got:
            conn.fin(msg.id)
        received.extend(got)
    return received


def gather(
    conns: Sequence[NsqConn], count: int, timeout: float
) -> list[tuple[int, Message, float]]:
    """Read ``count`` messages from several connections as they arrive (FINed at once).

    Returns (connection index, message, monotonic arrival time) in arrival order.
    """
    deadline = time.monotonic() + timeout
    arrived: list[tuple[int, Message, float]] = []
    while len(arrived) < count:
        for index, conn in enumerate(conns):
            for msg in fin_buffered(conn):
                arrived.append((index, msg, time.monotonic()))
        if len(arrived) >= count:
            break
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"only {len(arrived)} of {count} messages arrived in {timeout}s"
        readable, _, _ = select.select(list(conns), [], [], remaining)
        for conn in readable:
            conn.receive_some()
    return arrived


def fin_buffered(conn: NsqConn) -> list[Message]:
    """Every message whose frame is complete in ``conn``'s buffer, each FINed (no blocking)."""
    msgs = []
    while (found := conn.poll_frame()) is not None:
        frame_type, data = found
        assert frame_type == 2, found
        msg = decode_message(data)
        conn.fin(msg.id)
        msgs.append(msg)
    return msgs


def subscriber(nsqd: DaemonProcess, topic: str, channel: str) -> NsqConn:
    conn = NsqConn(nsqd.tcp_address)
    conn.sub(topic, channel)
    return conn


def consume_from(
    nsqd: DaemonProcess, topic: str, channel: str, count: int, timeout: float = 10.0
) -> list[Message]:
    """Subscribe, take exactly ``count`` messages (FINed), disconnect."""
    conn = subscriber(nsqd, topic, channel)
    try:
        return consume(conn, count, timeout)
    finally:
        conn.close()


def consume_all(
    nsqd: DaemonProcess, topic: str, channel: str, timeout: float = 30.0
) -> list[Message]:
    """Subscribe and FIN every message until the topic and the channel are empty with nothing
    in flight: for a restarted nsqd whose topic may copy again what it copied before the
    crash (at least once), where a count read from the channel's depth could include a copy
    that the channel drops as a twin of one in flight."""
    deadline = time.monotonic() + timeout
    conn = subscriber(nsqd, topic, channel)
    received: list[Message] = []
    try:
        conn.rdy(2500)
        while True:
            got = fin_buffered(conn)
            if not got:
                with contextlib.suppress(TimeoutError):
                    conn.receive_some(timeout=0.2)
                got = fin_buffered(conn)
            if got:
                received.extend(got)
                continue
            chan = channel_stats(nsqd, topic, channel) or {}
            topic_depth = (topic_stats(nsqd, topic) or {}).get("depth", 0)
            if topic_depth == 0 and chan.get("depth") == 0 and chan.get("in_flight_count") == 0:
                return received
            assert time.monotonic() < deadline, f"{len(received)} received; {chan}"
    finally:
        conn.close()


def publish_many(nsqd: DaemonProcess, topic: str, bodies: Iterable[bytes]) -> None:
    conn = NsqConn(nsqd.tcp_address)
    try:
        for body in bodies:
            conn.pub(topic, body)
    finally:
        conn.close()


# ------------------------------------------------------------------------------ processes


def launch(daemons: list[DaemonProcess], data_path: Path, *args: str) -> DaemonProcess:
    """Start nsqd on ``data_path`` and hand it to the ``daemons`` fixture (tests/conftest.py)
    to stop."""
    nsqd = start_nsqd(data_path, *args)
    daemons.append(nsqd)
    return nsqd


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
