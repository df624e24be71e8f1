"""The state the parts of a disk queue share: its limits, the positions its metadata records,
the sync counter, and the held-reads bookkeeping (holds.py)."""

from __future__ import annotations

from collections.abc import Callable

from .files import LogFunc
from .holds import NO_HOLD, Hold, Position, ReadHolds, SkipPlan


class QueueState:
    """One queue's fields, shared by its files, reader, writer, syncer and recovery.

    A plain record (Go's ``diskQueue`` struct fields): each part changes the fields its job
    covers and calls the others' methods for the rest.
    """

    __slots__ = (
        "clock",
        "closed",
        "committed_file",
        "count",
        "depth",
        "dirty_since",
        "holds",
        "last_held",
        "last_record",
        "last_start",
        "log",
        "max_bytes_per_file",
        "max_msg_size",
        "min_msg_size",
        "name",
        "read_file_num",
        "read_pos",
        "side_stale",
        "side_written_at",
        "skip_plan",
        "sync_every",
        "sync_timeout",
        "write_file_num",
        "write_pos",
    )

    def __init__(
        self,
        name: str,
        max_bytes_per_file: int,
        min_msg_size: int,
        max_msg_size: int,
        sync_every: int,
        sync_timeout: float,
        log: LogFunc,
        clock: Callable[[], float],
    ) -> None:
        self.name = name
        self.max_bytes_per_file = max_bytes_per_file
        self.min_msg_size = min_msg_size
        self.max_msg_size = max_msg_size
        self.sync_every = sync_every
        self.sync_timeout = sync_timeout
        self.log = log
        self.clock = clock  # monotonic seconds: the sync timer, the side file's and retries'

        self.depth = 0
        self.read_file_num = 0
        self.read_pos = 0
        self.write_file_num = 0
        self.write_pos = 0
        self.closed = False

        self.count = 0  # reads + writes since the last sync snapshot
        self.dirty_since = 0.0  # when the first of those happened

        # hold_reads(): records read but not finished; None is Go's behaviour
        self.holds: ReadHolds | None = None
        self.committed_file = 0  # files before this one are wholly finished
        self.skip_plan: SkipPlan | None = None  # records finished before a restart
        # the last record handed out: its hold, start and bytes (the side file's boundary)
        self.last_held: Hold = NO_HOLD
        self.last_start: Position = (0, 0)
        self.last_record: bytes | None = None
        self.side_written_at = 0.0  # by clock
        self.side_stale = False  # a sync left the side file out (too soon after the last)

    def committed(self) -> tuple[int, int, int]:
        """(depth, read file, read position) as the metadata records them: with held reads
        the start of the oldest held record, and a depth that counts the held records."""
        holds = self.holds
        if holds is not None:
            oldest = holds.oldest()
            if oldest is not None:
                return self.depth + len(holds), oldest[0], oldest[1]
        return self.depth, self.read_file_num, self.read_pos

    def caught_up(self) -> bool:
        """The reader is at (or, after corruption, past) the writer."""
        return self.read_file_num >= self.write_file_num and self.read_pos >= self.write_pos
