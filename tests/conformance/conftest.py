"""Conformance fixtures and helpers: nsqd daemons per module, IDENTIFY expectations, HTTP
shortcuts. The raw V2 and HTTP clients they use live in ``tests/raw_v2.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import MAGIC, NsqConn, channel_stats, http_ok, q, wait_for

#: the IDENTIFY response of a default nsqd 1.3.0 (master appends two topology keys).
DEFAULT_IDENTIFY_JSON = (
    b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
    b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
    b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,'
    b'"output_buffer_timeout":250}'
)
MASTER_TOPOLOGY_SUFFIX = b',"topology_region":"","topology_zone":""}'
IDENTIFY_KEYS = [
    "max_rdy_count",
    "version",
    "max_msg_timeout",
    "msg_timeout",
    "tls_v1",
    "deflate",
    "deflate_level",
    "max_deflate_level",
    "snappy",
    "sample_rate",
    "auth_required",
    "output_buffer_size",
    "output_buffer_timeout",
]


# --------------------------------------------------------------------------- HTTP


def create_topic(daemon: DaemonProcess, topic: str) -> None:
    http_ok(daemon, "POST", f"/topic/create?{q(topic=topic)}")


def create_channel(daemon: DaemonProcess, topic: str, channel: str) -> None:
    http_ok(daemon, "POST", f"/topic/create?{q(topic=topic)}")
    http_ok(daemon, "POST", f"/channel/create?{q(topic=topic, channel=channel)}")


def http_pub(daemon: DaemonProcess, topic: str, body: bytes) -> None:
    assert http_ok(daemon, "POST", f"/pub?{q(topic=topic)}", body) == b"OK"


def wait_channel(
    daemon: DaemonProcess, topic: str, channel: str, timeout: float = 3.0, **expected: Any
) -> dict[str, Any]:
    """Wait until the channel's stats have all the ``expected`` values."""

    def matches(c: dict[str, Any] | None) -> bool:
        return c is not None and all(c.get(k) == v for k, v in expected.items())

    result = wait_for(
        lambda: channel_stats(daemon, topic, channel),
        matches,
        timeout,
        f"{topic}/{channel} {expected}",
    )
    assert result is not None
    return result


# --------------------------------------------------------------------------- daemons


class DaemonPool:
    """nsqd processes keyed by their extra flags; tests with the same flags share one."""

    def __init__(self, tmp_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_factory
        self._daemons: dict[tuple[str, ...], DaemonProcess] = {}
        self.crashes: list[str] = []

    def get(self, *flags: str) -> DaemonProcess:
        daemon = self._daemons.get(flags)
        if daemon is not None and daemon.proc is not None and daemon.proc.poll() is not None:
            self.crashes.append(f"nsqd {flags} exited with {daemon.proc.returncode}:\n{daemon.log}")
            daemon = None
        if daemon is None:
            daemon = start_nsqd(self._tmp.mktemp("nsqd"), *flags)
            self._daemons[flags] = daemon
        return daemon

    def stop_all(self) -> None:
        for flags, daemon in self._daemons.items():
            if daemon.proc is not None and daemon.proc.poll() is not None:
                self.crashes.append(f"nsqd {flags} exited with {daemon.proc.returncode}")
            daemon.stop()
        self._daemons.clear()


@pytest.fixture(scope="module")
def nsqd_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonPool]:
    pool = DaemonPool(tmp_path_factory)
    yield pool
    pool.stop_all()
    assert not pool.crashes, "nsqd died during the module:\n" + "\n".join(pool.crashes)


@pytest.fixture(scope="module")
def nsqd(nsqd_pool: DaemonPool) -> DaemonProcess:
    """A default nsqd shared by the module."""
    return nsqd_pool.get()


@pytest.fixture
def fresh_nsqd(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A default nsqd of its own for a test that needs an empty daemon."""
    daemon = start_nsqd(tmp_path)
    yield daemon
    daemon.stop()


def connect(daemon: DaemonProcess, magic: bytes | None = MAGIC) -> NsqConn:
    """A connection that shows every frame, heartbeats included, and answers none of them."""
    return NsqConn(daemon.tcp_address, magic, answer_heartbeats=False)
