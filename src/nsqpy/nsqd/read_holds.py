"""Records a disk queue has handed out but whose messages are not finished yet (issue 22).

With ``--mem-queue-size=0 --sync-every=1`` a channel's disk queue keeps two read positions: the
cursor, which runs ahead in memory as records are read (or handed straight to a consumer), and
the committed position, which the metadata file records. A record between the two is *held*:
its message is in flight or deferred. The committed position is the start of the oldest held
record (the cursor when nothing is held), so it only ever passes records whose messages are
finished, requeued as a newer record, or dead-lettered; after a SIGKILL everything held is read
again. This module is the bookkeeping only; the queue does the I/O.
"""

from __future__ import annotations

from collections import deque

__all__ = ["Hold", "ReadHolds"]


class Hold:
    """One held record: where it starts, and whether its message is done with it."""

    __slots__ = ("done", "file_num", "pos")

    def __init__(self, file_num: int, pos: int) -> None:
        self.file_num = file_num
        self.pos = pos
        self.done = False


class ReadHolds:
    """Held records in disk order; releasing the oldest moves the committed position."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: deque[Hold] = deque()

    def add(self, file_num: int, pos: int) -> Hold:
        """Hold the record starting at ``file_num``/``pos`` (it follows every held one)."""
        hold = Hold(file_num, pos)
        self._entries.append(hold)
        return hold

    def release(self, hold: Hold) -> bool:
        """Mark ``hold`` done; True when that moved the committed position.

        Done records after a held one stay counted until the older one is released: they sit
        between the committed position and the cursor, so the metadata's depth includes them.
        """
        if hold.done:
            return False
        hold.done = True
        entries = self._entries
        if not entries or entries[0] is not hold:
            return False
        popleft = entries.popleft
        while entries and entries[0].done:
            popleft()
        return True

    def oldest(self) -> Hold | None:
        return self._entries[0] if self._entries else None

    def newest(self) -> Hold | None:
        return self._entries[-1] if self._entries else None

    def clear(self) -> None:
        """Forget every hold (the queue was emptied); releasing one later does nothing."""
        for hold in self._entries:
            hold.done = True
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
