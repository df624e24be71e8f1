"""The disk queue's fields, declared once for every part of the class (files, syncing,
recovery, reading and the queue itself build on it in that order)."""

from __future__ import annotations

import asyncio
import os
import threading

from ...internal.lg import RepeatSummary
from .files import (
    LogFunc,
    _close_quietly,
)
from .holds import (
    HELD_FILE_SUFFIX,
    NO_HOLD,
    Hold,
    Position,
    ReadHolds,
    SkipPlan,
)


class _QueueState:
    """Every field of a DiskQueue (``__slots__``) and the helpers all parts use."""

    __slots__ = (
        "_closed",
        "_committed_file",
        "_count",
        "_data_path",
        "_depth",
        "_dirty_since",
        "_doomed_paths",
        "_failures",
        "_holds",
        "_kicked_sync",
        "_last_held",
        "_last_record",
        "_last_start",
        "_log",
        "_max_bytes_per_file",
        "_max_msg_size",
        "_meta_lock",
        "_meta_path",
        "_min_msg_size",
        "_name",
        "_need_sync",
        "_persisted_seq",
        "_read_buf",
        "_read_buf_start",
        "_read_end",
        "_read_fd",
        "_read_file_num",
        "_read_pos",
        "_retired_paths",
        "_retry_at",
        "_retry_delay",
        "_side_stale",
        "_side_written_at",
        "_skip_plan",
        "_sync_every",
        "_sync_lock",
        "_sync_loop",
        "_sync_seq",
        "_sync_timeout",
        "_write_failing",
        "_write_fd",
        "_write_file_num",
        "_write_pos",
    )

    def __init__(
        self,
        name: str,
        data_path: str,
        max_bytes_per_file: int,
        min_msg_size: int,
        max_msg_size: int,
        sync_every: int,
        sync_timeout: float,
        log: LogFunc,
    ) -> None:
        self._name = name
        self._data_path = data_path
        self._max_bytes_per_file = max_bytes_per_file
        self._min_msg_size = min_msg_size
        self._max_msg_size = max_msg_size
        self._sync_every = sync_every
        self._sync_timeout = sync_timeout
        self._log = log
        self._meta_path = os.path.join(data_path, f"{name}.diskqueue.meta.dat")

        self._depth = 0
        self._read_file_num = 0
        self._read_pos = 0
        self._write_file_num = 0
        self._write_pos = 0

        self._read_fd: int | None = None
        self._read_buf = b""
        self._read_buf_start = 0
        # End of the file being read once it is complete; None while it is the write file.
        self._read_end: int | None = None
        self._write_fd: int | None = None

        self._count = 0  # reads + writes since the last sync snapshot
        self._dirty_since = 0.0  # when the first of those happened
        self._need_sync = False
        self._retired_paths: list[str] = []
        self._doomed_paths: list[str] = []
        self._closed = False
        self._failures = RepeatSummary(log)
        self._retry_at = 0.0  # no sync before this (monotonic) time: backing off after failures
        self._retry_delay = 0.0
        self._write_failing = False  # quiet the reopen line while every write fails
        self._kicked_sync: asyncio.Task[None] | None = None
        self._sync_lock: asyncio.Lock | None = None
        self._sync_loop: asyncio.AbstractEventLoop | None = None
        # Snapshot ordering between worker threads: a metadata rename happens only for a
        # snapshot newer than the last one persisted (or than the last Empty).
        self._meta_lock = threading.Lock()
        self._sync_seq = 0
        self._persisted_seq = 0
        # hold_reads(): records read but not finished; None is Go's behaviour
        self._holds: ReadHolds | None = None
        self._committed_file = 0  # files before this one are wholly finished
        self._skip_plan: SkipPlan | None = None  # records finished before a restart
        # the last record handed out: its hold, start and bytes (the side file's boundary)
        self._last_held: Hold = NO_HOLD
        self._last_start: Position = (0, 0)
        self._last_record: bytes | None = None
        self._side_written_at = 0.0  # monotonic
        self._side_stale = False  # a sync left the side file out (too soon after the last)

    @property
    def name(self) -> str:
        return self._name

    def depth(self) -> int:
        return self._depth

    def file_name(self, file_num: int) -> str:
        return os.path.join(self._data_path, f"{self._name}.diskqueue.{file_num:06d}.dat")

    def meta_file_name(self) -> str:
        return self._meta_path

    def held_file_name(self) -> str:
        return os.path.join(self._data_path, self._name + HELD_FILE_SUFFIX)

    def _close_read_file(self) -> None:
        if self._read_fd is not None:
            _close_quietly(self._read_fd)
            self._read_fd = None
        self._read_buf = b""
        self._read_buf_start = 0
        self._read_end = None

    def _close_files(self) -> None:
        self._close_read_file()
        if self._write_fd is not None:
            _close_quietly(self._write_fd)
            self._write_fd = None
