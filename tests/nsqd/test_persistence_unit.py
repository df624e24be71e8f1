"""nsqd.dat's writes in process: a write scheduled just before nsqd stops is left to the
shutdown's own last write, and nothing fails after the metadata writer has stopped."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nsqpy.nsqd import metadata

from .in_process_support import FakeClock, in_process_nsqd, loop_turns


async def test_a_write_scheduled_as_nsqd_stops_is_left_to_the_last_write(tmp_path: Path) -> None:
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
    async with in_process_nsqd(tmp_path, FakeClock()) as nsqd:
        nsqd.get_topic("kept")
        nsqd.persistence.persist_metadata()  # runs on a later turn: after the stop below
    await loop_turns()
    assert errors == []
    entries = metadata.load(str(tmp_path / metadata.METADATA_FILE))
    assert [entry.name for entry in entries] == ["kept"]
