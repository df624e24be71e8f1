"""Records a disk queue has handed out but whose messages are not finished yet.

With ``--mem-queue-size=0 --sync-every=1`` a channel's disk queue keeps two read positions: the
cursor, which runs ahead in memory as records are read (or handed straight to a consumer), and
the committed position, which the metadata file records. A record between the two is *held*:
its message is in flight or deferred. The committed position is the start of the oldest held
record (the cursor when nothing is held), so it only ever passes records whose messages are
finished, requeued as a newer record, or dead-lettered; after a SIGKILL everything held is read
again. This module is the bookkeeping only; the queue does the I/O.

A SIGKILL would then redeliver every record after the oldest held one, finished or not (a
message deferred for a minute holds back a minute of traffic). To avoid most of that, syncs
also write ``<queue>.diskqueue.held.dat`` (nsqpy's; Go ignores it), at most every
``SIDE_FILE_INTERVAL`` seconds: the cursor, the unfinished records before it, and the start and
first bytes of the last record read (its *boundary*). At start-up, records before that cursor
and not in its list are skipped: they were finished when the file was written, and a finished
message stays finished, whatever the metadata written since. This needs the file to describe
the same records as the queue on disk now: the boundary record must still be there, byte for
byte (a message's first bytes hold its timestamp and unique ID), or the file is ignored and
everything is read again, which is merely slower.
"""

from __future__ import annotations

import itertools
import struct
from collections import deque
from typing import NamedTuple

__all__ = [
    "BOUNDARY_BYTES",
    "HEAD_MOVED",
    "HELD_FILE_SUFFIX",
    "NO_HOLD",
    "SIDE_FILE_INTERVAL",
    "Hold",
    "ReadHolds",
    "SkipPlan",
    "decode_held",
    "encode_held",
]

#: ``<queue name>`` + this: the side file described in the module docstring
HELD_FILE_SUFFIX = ".diskqueue.held.dat"
#: at most one side file per this many seconds (it lists every unfinished record)
SIDE_FILE_INTERVAL = 0.1
#: how many leading bytes of the boundary record identify it
BOUNDARY_BYTES = 64
_MAGIC = b"nsqpyHR1"
_SIDE_HEADER = struct.Struct("<8sqqqqHq")
Position = tuple[int, int]  # (file number, offset)


#: a hold is a number: the records held so far, in disk order, count from 0
Hold = int
#: a hold that holds nothing (releasing it does nothing)
NO_HOLD: Hold = -1

RELEASED, HEAD_MOVED = 1, 2


class ReadHolds:
    """Held records in disk order; releasing the oldest moves the committed position.

    Hold ``n`` is the n-th record held; ``_starts[n - _base]`` is where it starts. Records after
    the oldest unfinished one stay in ``_starts`` once finished: they sit between the committed
    position and the cursor, so the metadata's depth counts them.
    """

    __slots__ = ("_base", "_starts", "_unfinished")

    def __init__(self) -> None:
        self._base = 0  # the hold number of _starts[0]
        self._starts: deque[Position] = deque()
        self._unfinished: set[Hold] = set()

    def add(self, start: Position) -> Hold:
        """Hold the record at ``start`` (it follows every held one)."""
        hold = self._base + len(self._starts)
        self._starts.append(start)
        self._unfinished.add(hold)
        return hold

    def add_run(self, starts: list[Position]) -> Hold:
        """:meth:`add` for records read in one go: theirs are the returned hold onward."""
        first = self._base + len(self._starts)
        self._starts.extend(starts)
        self._unfinished.update(range(first, first + len(starts)))
        return first

    def release(self, hold: Hold) -> int:
        """0 if ``hold`` is not held (released already, or cleared), else RELEASED, or
        HEAD_MOVED when it was the oldest, which moves the committed position."""
        unfinished = self._unfinished
        if hold not in unfinished:
            return 0
        unfinished.discard(hold)
        base = self._base
        if hold != base:
            return RELEASED
        starts = self._starts
        popleft = starts.popleft
        popleft()
        base += 1
        while starts and base not in unfinished:
            popleft()
            base += 1
        self._base = base
        return HEAD_MOVED

    def start(self, hold: Hold) -> Position | None:
        """Where a held record starts (None once it is no longer counted)."""
        index = hold - self._base
        return self._starts[index] if 0 <= index < len(self._starts) else None

    def oldest(self) -> Position | None:
        return self._starts[0] if self._starts else None

    def oldest_hold(self) -> Hold:
        return self._base if self._starts else NO_HOLD

    def unfinished(self) -> list[Position]:
        base, starts = self._base, self._starts
        return [starts[hold - base] for hold in sorted(self._unfinished)]

    def clear(self) -> None:
        """Forget every hold (the queue was emptied); releasing one later does nothing."""
        self._base += len(self._starts)
        self._starts.clear()
        self._unfinished.clear()

    def __len__(self) -> int:
        return len(self._starts)


class SkipPlan(NamedTuple):
    """From a side file: records before ``cursor`` are skipped unless they start at one of
    ``unfinished``; valid only if the record at ``boundary`` starts with ``boundary_bytes``."""

    cursor: Position
    unfinished: frozenset[Position]
    boundary: Position
    boundary_bytes: bytes


def encode_held(
    cursor: Position, unfinished: list[Position], boundary: Position, boundary_bytes: bytes
) -> bytes:
    head = _SIDE_HEADER.pack(_MAGIC, *cursor, *boundary, len(boundary_bytes), len(unfinished))
    flat = struct.pack(f"<{2 * len(unfinished)}q", *itertools.chain.from_iterable(unfinished))
    return head + boundary_bytes + flat


def decode_held(data: bytes) -> SkipPlan | None:
    """The plan in a side file, or None if it is not one (torn, another version)."""
    if len(data) < _SIDE_HEADER.size:
        return None
    magic, cur_file, cur_pos, bnd_file, bnd_pos, prefix, count = _SIDE_HEADER.unpack_from(data)
    body = _SIDE_HEADER.size + prefix
    if magic != _MAGIC or len(data) != body + 16 * count:
        return None
    flat = struct.unpack_from(f"<{2 * count}q", data, body)
    unfinished = frozenset(zip(flat[::2], flat[1::2], strict=True))
    return SkipPlan(
        (cur_file, cur_pos), unfinished, (bnd_file, bnd_pos), data[_SIDE_HEADER.size : body]
    )
