"""Message IDs built like Go's snowflake-style guid (nsqd/guid.go)."""

from __future__ import annotations

import time

NODE_ID_BITS = 10
SEQUENCE_BITS = 12
NODE_ID_SHIFT = SEQUENCE_BITS
TIMESTAMP_SHIFT = SEQUENCE_BITS + NODE_ID_BITS
SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1
TWEPOCH = 1288834974288  # Go's epoch offset, in units of 2**20 ns

#: The sequence is the ID's last 12 bits, exactly its last three hex digits: an ID is the hex of
#: its tick and node (13 digits) followed by one of these, so a run of IDs is one concatenation
#: each instead of one 64-bit formatting each.
_SEQUENCE_HEX = [b"%03x" % seq for seq in range(SEQUENCE_MASK + 1)]


class GUIDFactory:
    """Per-topic ID generator: ``(ts << 22) | (node_id << 12) | sequence``, as 16 hex chars."""

    __slots__ = ("_last_id", "_last_ts", "_node_bits", "_sequence")

    def __init__(self, node_id: int) -> None:
        self._node_bits = node_id << NODE_ID_SHIFT
        self._sequence = 0
        self._last_ts = -1
        self._last_id = -1

    def new_id(self) -> bytes:
        return self.new_ids(1)[0]

    def new_ids(self, count: int) -> list[bytes]:
        """``count`` consecutive IDs: a run of sequence numbers within each time tick."""
        ids: list[bytes] = []
        while count > 0:
            ts = time.time_ns() >> 20
            if ts < self._last_ts:  # the clock went backwards: wait, as Go does
                time.sleep(0.001)
                continue
            first = self._sequence + 1 if ts == self._last_ts else 0
            if first > SEQUENCE_MASK:  # sequence exhausted within this tick
                time.sleep(0.0001)
                continue
            last = min(first + count, SEQUENCE_MASK + 1) - 1
            base = ((ts - TWEPOCH) << TIMESTAMP_SHIFT) | self._node_bits
            if base | first <= self._last_id:
                time.sleep(0.001)
                continue
            prefix = b"%013x" % (base >> SEQUENCE_BITS)
            ids.extend(map(prefix.__add__, _SEQUENCE_HEX[first : last + 1]))
            count -= last - first + 1
            self._sequence = last
            self._last_ts = ts
            self._last_id = base | last
        return ids
