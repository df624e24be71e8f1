"""Shared pieces of the fault tests: a small real filesystem, nsqd under limits, publishing
until refused, and the nsqd log of a fault."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import DaemonProcess

from ..raw_v2 import NsqConn, http_request, pub_cmd, stats

#: summaries of a repeating failure every half second instead of every 5 s: a short fault then
#: shows several summaries, so bounding the log lines means something
REPEAT_INTERVAL = 0.5


@contextlib.contextmanager
def mounted_tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. ``1m``) at ``mount_point``, unmounted afterwards (root only;
    CI runs as root)."""
    mount_point.mkdir(parents=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount_point)],
        check=True,
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill_disk(path: Path) -> int:
    """Write ``path`` until the filesystem refuses a byte more: full to the last block."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 16, 4096, 512, 1):
            block = bytes(chunk)
            while True:
                try:
                    written += os.write(fd, block)
                except OSError as exc:
                    assert exc.errno in (errno.ENOSPC, errno.EFBIG), exc
                    break
    finally:
        os.close(fd)
    return written


class LimitedNsqd(DaemonProcess):
    """nsqd started under an RLIMIT_NOFILE (soft, hard) of the test's choosing."""

    def __init__(self, nofile: tuple[int, int], module: str, args: list[str]) -> None:
        super().__init__(module, args, ["TCP", "HTTP"])
        self.nofile = nofile

    def _limit_child(self) -> None:  # in the child, between fork and exec
        resource.setrlimit(resource.RLIMIT_NOFILE, self.nofile)

    def popen_options(self) -> dict[str, Any]:
        return {"preexec_fn": self._limit_child}


@contextlib.contextmanager
def limited_nsqd(
    monkeypatch: pytest.MonkeyPatch, data_path: Path, *extra: str
) -> Iterator[DaemonProcess]:
    """nsqd on ``data_path`` with 4096 descriptors and failure summaries every
    :data:`REPEAT_INTERVAL`, stopped when the block ends."""
    monkeypatch.setenv("NSQPY_LOG_REPEAT_INTERVAL", str(REPEAT_INTERVAL))
    daemon = LimitedNsqd((4096, 4096), "nsqpy.nsqd", nsqd_args(data_path, *extra)).start(15.0)
    try:
        yield daemon
    finally:
        daemon.stop()


def nsqd_args(data_path: Path, *extra: str) -> list[str]:
    return [
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        f"--data-path={data_path}",
        "--broadcast-address=127.0.0.1",
        *extra,
    ]


def try_pub(nsqd: DaemonProcess, topic: str, body: bytes) -> bytes | None:
    """One PUB on a fresh connection: None when acknowledged, else the error frame."""
    conn = NsqConn(nsqd.tcp_address)
    try:
        conn.send(pub_cmd(topic, body))
        frame_type, data = conn.read_frame()
        if frame_type == 0:
            assert data == b"OK"
            return None
        assert frame_type == 1, (frame_type, data)
        return data
    finally:
        conn.close()


def publish_until_refused(
    nsqd: DaemonProcess, topic: str, prefix: bytes, body_size: int, limit: int = 20_000
) -> tuple[list[bytes], bytes]:
    """PUB on one connection until nsqd refuses; (acknowledged bodies, the error frame)."""
    acknowledged: list[bytes] = []
    conn = NsqConn(nsqd.tcp_address)
    try:
        for i in range(limit):
            body = prefix + b"%06d:" % i
            body += bytes(body_size - len(body))
            conn.send(pub_cmd(topic, body))
            frame_type, data = conn.read_frame()
            if frame_type == 1:
                return acknowledged, data
            assert data == b"OK"
            acknowledged.append(body)
    finally:
        conn.close()
    raise AssertionError(f"nsqd took {limit} messages and never refused")


def publish_all(nsqd: DaemonProcess, topic: str, bodies: list[bytes], timeout: float) -> None:
    """PUB every body, retrying a refused one (a fault clearing) until ``timeout``."""
    deadline = time.monotonic() + timeout
    for body in bodies:
        while (error := try_pub(nsqd, topic, body)) is not None:
            assert time.monotonic() < deadline, f"still refused: {error!r}"
            time.sleep(0.05)


def ping(nsqd: DaemonProcess) -> tuple[int, str]:
    resp = http_request(nsqd, "GET", "/ping")
    return resp.status, resp.body.decode()


def health(nsqd: DaemonProcess) -> str:
    return str(stats(nsqd)["health"])


def log_lines_since(nsqd: DaemonProcess, first: int) -> list[str]:
    with nsqd._lock:
        return list(nsqd.log_lines[first:])


def log_mark(nsqd: DaemonProcess) -> int:
    with nsqd._lock:
        return len(nsqd.log_lines)
