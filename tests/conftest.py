"""Fixtures shared across the test packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nsqpy.testing import DaemonProcess


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    """Every daemon a test starts goes in this list and is stopped (or killed) afterwards."""
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        daemon.stop()
