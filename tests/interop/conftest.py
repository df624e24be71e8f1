"""Fixtures for the interop tests: each test runs third-party clients against its own nsqd.

Every daemon is nsqpy's real ``nsqd`` (``python -m nsqpy.nsqd``) on free loopback ports,
started with :func:`nsqpy.testing.start_nsqd`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd

from .certs import SelfSigned, make_self_signed
from .pynsq_harness import PynsqClients

#: Timeouts and deferrals are noticed within one scan, so keep the scan short.
FAST_SCAN = "--queue-scan-interval=20ms"

NsqdFactory = Callable[..., DaemonProcess]


@pytest.fixture
def nsqd_factory(tmp_path: Path) -> Iterator[NsqdFactory]:
    """Start nsqd daemons with extra Go-style flags; stop them all after the test.

    A daemon that died during the test fails it, with the daemon's log.
    """
    started: list[DaemonProcess] = []

    def start(*flags: str, https: bool = False) -> DaemonProcess:
        data_path = tmp_path / f"nsqd{len(started)}"
        data_path.mkdir()
        daemon = start_nsqd(data_path, FAST_SCAN, *flags, https=https)
        started.append(daemon)
        return daemon

    yield start
    crashed = [d for d in started if d.proc is not None and d.proc.poll() is not None]
    for daemon in started:
        daemon.stop()
    assert not crashed, "nsqd died during the test:\n" + "\n\n".join(d.log for d in crashed)


@pytest.fixture
def nsqd(nsqd_factory: NsqdFactory) -> DaemonProcess:
    """A default nsqd of the test's own."""
    return nsqd_factory()


@pytest.fixture
async def pynsq() -> AsyncIterator[PynsqClients]:
    """pynsq Readers and Writers on the test's loop, closed after the test."""
    clients = PynsqClients()
    yield clients
    clients.close()
    await asyncio.sleep(0)  # let Tornado run the close callbacks


@pytest.fixture(scope="session")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> SelfSigned:
    return make_self_signed(tmp_path_factory.mktemp("certs"))
