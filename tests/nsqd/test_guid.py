"""Message IDs: Go's layout (nsqd/guid.go), ``(tick << 22) | (node << 12) | sequence`` as 16
hex digits, where a tick is 2**20 ns since Go's epoch offset."""

from __future__ import annotations

import itertools
import time

import pytest

from nsqpy.nsqd.guid import TWEPOCH, GUIDFactory


@pytest.mark.parametrize("node_id", [0, 1, 517, 1023])
def test_ids_are_gos_layout_unique_and_increasing(node_id: int) -> None:
    factory = GUIDFactory(node_id)
    before = time.time_ns() >> 20
    ids = [factory.new_id() for _ in range(50)]
    for count in (1, 7, 200, 4096, 5000, 12_345):  # runs across sequence and tick limits
        ids.extend(factory.new_ids(count))
    after = time.time_ns() >> 20

    assert len(ids) == 50 + 1 + 7 + 200 + 4096 + 5000 + 12_345
    assert all(len(msg_id) == 16 for msg_id in ids)
    values = [int(msg_id, 16) for msg_id in ids]
    assert [b"%016x" % value for value in values] == ids  # lower-case hex, zero-padded
    assert all(a < b for a, b in itertools.pairwise(values))
    assert {(value >> 12) & 0x3FF for value in values} == {node_id}
    ticks = {(value >> 22) + TWEPOCH for value in values}
    assert before <= min(ticks) and max(ticks) <= after
    # within a tick the sequence counts up from 0 without gaps
    by_tick: dict[int, list[int]] = {}
    for value in values:
        by_tick.setdefault(value >> 22, []).append(value & 0xFFF)
    for sequence in by_tick.values():
        assert sequence == list(range(sequence[0], sequence[0] + len(sequence)))
