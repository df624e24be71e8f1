"""Fixtures of the in-process nsqd tests: a clock the test moves and an NSQD reading it.

A module that runs NSQD with other options overrides ``nsqd_options``; a module that runs
nsqd as a process defines its own ``nsqd`` fixture, which takes precedence over this one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nsqpy.nsqd.nsqd import NSQD

from .in_process_support import FakeClock, in_process_nsqd


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def nsqd_options() -> dict[str, Any]:
    """Options of the in-process NSQD beyond its data path."""
    return {}


@pytest.fixture
async def nsqd(
    tmp_path: Path, clock: FakeClock, nsqd_options: dict[str, Any]
) -> AsyncIterator[NSQD]:
    async with in_process_nsqd(tmp_path, clock, **nsqd_options) as daemon:
        yield daemon
