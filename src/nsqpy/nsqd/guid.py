"""Message IDs built like Go's snowflake-style guid (nsqd/guid.go)."""

from __future__ import annotations

import time

NODE_ID_BITS = 10
SEQUENCE_BITS = 12
NODE_ID_SHIFT = SEQUENCE_BITS
TIMESTAMP_SHIFT = SEQUENCE_BITS + NODE_ID_BITS
SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1
TWEPOCH = 1288834974288  # Go's epoch offset, in units of 2**20 ns


class GUIDFactory:
    """Per-topic ID generator: ``(ts << 22) | (node_id << 12) | sequence``, as 16 hex chars."""

    __slots__ = ("_last_id", "_last_ts", "_node_bits", "_sequence")

    def __init__(self, node_id: int) -> None:
        self._node_bits = node_id << NODE_ID_SHIFT
        self._sequence = 0
        self._last_ts = -1
        self._last_id = -1

    def new_id(self) -> bytes:
        while True:
            ts = time.time_ns() >> 20
            if ts < self._last_ts:  # the clock went backwards: wait, as Go does
                time.sleep(0.001)
                continue
            if ts == self._last_ts:
                self._sequence = (self._sequence + 1) & SEQUENCE_MASK
                if self._sequence == 0:  # sequence exhausted within one tick
                    time.sleep(0.0001)
                    continue
            else:
                self._sequence = 0
            self._last_ts = ts
            guid = ((ts - TWEPOCH) << TIMESTAMP_SHIFT) | self._node_bits | self._sequence
            if guid <= self._last_id:
                time.sleep(0.001)
                continue
            self._last_id = guid
            return b"%016x" % guid
