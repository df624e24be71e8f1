"""Records a disk queue has handed out but whose messages are not finished yet (issue 22).

With ``--mem-queue-size=0 --sync-every=1`` a channel's disk queue keeps two read positions: the
cursor, which runs ahead in memory as records are read (or handed straight to a consumer), and
the committed position, which the metadata file records. A record between the two is *held*:
its message is in flight or deferred. The committed position is the start of the oldest held
record (the cursor when nothing is held), so it only ever passes records whose messages are
finished, requeued as a newer record, or dead-lettered; after a SIGKILL everything held is read
again. This module is the bookkeeping only; the queue does the I/O.

A SIGKILL would then redeliver every record after the oldest held one, finished or not (a
message deferred for a minute holds back a minute of traffic). To avoid that, each sync also
writes ``<queue>.diskqueue.held.dat`` (nsqpy's; Go ignores it): the metadata text it belongs
with, the cursor, and the unfinished records between the two positions. At start-up, if the
metadata file is exactly the one it names, records before that cursor and not in its list are
skipped: they were finished when it was written, and a finished message stays finished. Any
mismatch (a crash between the two writes, Go having run on the directory) ignores the file and
everything is read again, which is merely slower.
"""

from __future__ import annotations

import json
from collections import deque
from typing import NamedTuple

__all__ = ["HELD_FILE_SUFFIX", "Hold", "ReadHolds", "SkipPlan", "decode_held", "encode_held"]

#: ``<queue name>`` + this: the side file described in the module docstring
HELD_FILE_SUFFIX = ".diskqueue.held.dat"
_VERSION = 1
Position = tuple[int, int]  # (file number, offset)


class Hold:
    """One held record: where it starts, and whether its message is done with it."""

    __slots__ = ("done", "file_num", "pos")

    def __init__(self, file_num: int, pos: int) -> None:
        self.file_num = file_num
        self.pos = pos
        self.done = False


class ReadHolds:
    """Held records in disk order; releasing the oldest moves the committed position."""

    __slots__ = ("_entries", "_unfinished")

    def __init__(self) -> None:
        self._entries: deque[Hold] = deque()
        self._unfinished: dict[Hold, None] = {}  # in disk order, for the side file

    def add(self, file_num: int, pos: int) -> Hold:
        """Hold the record starting at ``file_num``/``pos`` (it follows every held one)."""
        hold = Hold(file_num, pos)
        self._entries.append(hold)
        self._unfinished[hold] = None
        return hold

    def unfinished(self) -> list[Position]:
        return [(hold.file_num, hold.pos) for hold in self._unfinished]

    def release(self, hold: Hold) -> bool:
        """Mark ``hold`` done; True when that moved the committed position.

        Done records after a held one stay counted until the older one is released: they sit
        between the committed position and the cursor, so the metadata's depth includes them.
        """
        if hold.done:
            return False
        hold.done = True
        self._unfinished.pop(hold, None)
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
        self._unfinished.clear()

    def __len__(self) -> int:
        return len(self._entries)


class SkipPlan(NamedTuple):
    """From a side file that matches the metadata: records before ``cursor`` are skipped
    unless they start at one of ``unfinished``."""

    cursor: Position
    unfinished: frozenset[Position]


def encode_held(meta_text: bytes, cursor: Position, unfinished: list[Position]) -> bytes:
    body = {
        "version": _VERSION,
        "metadata": meta_text.decode(),
        "cursor": list(cursor),
        "unfinished": unfinished,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode_held(data: bytes, meta_text: bytes) -> SkipPlan | None:
    """The plan if ``data`` is a side file written with exactly ``meta_text``, else None."""
    try:
        body = json.loads(data)
        if body["version"] != _VERSION or body["metadata"].encode() != meta_text:
            return None
        file_num, pos = body["cursor"]
        unfinished = frozenset((int(f), int(p)) for f, p in body["unfinished"])
        return SkipPlan((int(file_num), int(pos)), unfinished)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
