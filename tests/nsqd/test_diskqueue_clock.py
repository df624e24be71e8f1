"""The disk queue's timers read the clock it was given: ``--sync-timeout`` fires when that
clock has moved on, not when the machine's has, and nsqd gives its queues its own clock.

The timeout here is a minute, so only the test's clock can make a sync due while it runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nsqpy.nsqd.diskqueue import DiskQueue
from nsqpy.nsqd.nsqd import NSQD

from .in_process_support import FakeClock, in_process_nsqd

SYNC_TIMEOUT = 60.0
#: How long a test waits (real seconds) for nsqd's sync loop, which looks every 0.1 s.
SYNC_LOOP_BOUND = 5.0


def quiet(level: str, line: str) -> None:
    pass


def test_a_queue_is_due_a_sync_once_its_clock_passes_the_timeout(tmp_path: Path) -> None:
    clock = FakeClock()
    queue = DiskQueue("q", str(tmp_path), 1 << 20, 0, 1024, 2500, SYNC_TIMEOUT, quiet, clock.now)
    assert not queue.sync_due()
    queue.put(b"record")
    assert not queue.sync_due()
    clock.advance(SYNC_TIMEOUT - 1)
    assert not queue.sync_due()
    clock.advance(1)
    assert queue.sync_due()
    queue.close()


@pytest.fixture
async def nsqd(tmp_path: Path) -> AsyncIterator[tuple[NSQD, FakeClock]]:
    clock = FakeClock()
    async with in_process_nsqd(
        tmp_path, clock, mem_queue_size=0, sync_timeout=SYNC_TIMEOUT
    ) as daemon:
        yield daemon, clock


def recorded_depth(queue: DiskQueue) -> int | None:
    """The depth the queue's metadata file records (None before it has one)."""
    try:
        return int(Path(queue.meta_file_name()).read_text().split("\n", 1)[0])
    except FileNotFoundError:
        return None


async def test_nsqds_sync_loop_syncs_a_queue_when_nsqds_clock_passes_the_timeout(
    nsqd: tuple[NSQD, FakeClock],
) -> None:
    daemon, clock = nsqd
    topic = daemon.get_topic("synced")
    topic.put_message(topic.new_message(b"on disk"))
    queue = topic.backend.disk_queue()
    assert queue is not None and queue.depth() == 1
    before = recorded_depth(queue)
    syncs = asyncio.create_task(daemon.writes.sync_loop())
    try:
        await asyncio.sleep(0.3)  # three of the loop's looks: nothing is due yet
        assert recorded_depth(queue) == before != 1
        clock.advance(SYNC_TIMEOUT)
        deadline = time.monotonic() + SYNC_LOOP_BOUND
        while recorded_depth(queue) != 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert recorded_depth(queue) == 1, "no sync once nsqd's clock passed --sync-timeout"
    finally:
        syncs.cancel()
