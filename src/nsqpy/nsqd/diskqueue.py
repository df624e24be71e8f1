"""A disk-backed FIFO byte queue, file for file compatible with go-diskqueue v1.1.0.

Go nsqd 1.3 keeps every topic's and channel's overflow in one of these queues; a data directory
written by Go nsqd can be read by this module and the other way round
(reference: ``go-nsq-behaviour.md`` §6.1).

On disk, for a queue called ``name`` in ``data_path``::

    <name>.diskqueue.000000.dat   records: BE32(len) + len bytes, back to back (mode 0600)
    <name>.diskqueue.000001.dat   ...a file is finished once the next record would not fit
    <name>.diskqueue.meta.dat     "<depth>\\n<readFileNum>,<readPos>\\n<writeFileNum>,<writePos>\\n"

Using it from an asyncio program (every method must be called from the event-loop thread)::

    queue = DiskQueue(name, data_path, max_bytes_per_file, min_msg_size, max_msg_size,
                      sync_every, sync_timeout, log)
    syncer = asyncio.create_task(queue.run_syncer())   # fsyncs in a worker thread when due
    queue.put(record)                  # or queue.put_many(records): one write(2) per batch
    record = queue.get()               # None when empty; consumes the record
    ...
    syncer.cancel()
    queue.close()                      # final fsync + metadata; blocks, meant for shutdown

``put`` returns once the record is in the kernel (``os.write``), so a killed process loses
nothing; fsync, which protects against power loss, is left to ``sync``. An owner that wants
Go's ``--sync-every=1`` behaviour awaits ``queue.sync()`` right after each put or batch.
Instead of ``run_syncer`` an owner may poll ``sync_due()`` from its own periodic task.

Durability points, as in Go: a sync is due after ``sync_every`` reads+writes, after
``sync_timeout`` seconds with any activity, and at once when the writer rolls to a new file,
the reader moves to a new file, or corruption was handled. For those last three this module
starts the sync itself when an event loop is running.

Where this module deliberately differs from go-diskqueue (none of it changes the files):

* fsync never runs on the caller's thread except in ``close()``. A sync takes a snapshot of the
  positions on the loop thread and does the fsync, the metadata write and the rename in a worker
  thread; snapshots carry a sequence number so an older snapshot never overwrites a newer one.
* A file the reader has finished is deleted once metadata that no longer names it has been
  persisted (Go deletes it first and syncs after), so normally the metadata never points at a
  missing file. When the metadata cannot be written (a disk full to the last block cannot hold
  its temporary file) the finished files are deleted anyway, which frees the space the metadata
  needs; a crash before the metadata catches up leaves a read position in a deleted file, and
  start-up then continues at the next file that exists and recounts the depth. Only files the
  reader has finished are ever deleted this way, so that skip never passes an unread record.
* A failing sync is retried with a bounded exponential backoff (0.1 s doubling to 5 s), not at
  once, and its error is logged once, then summarised (``lg.RepeatSummary``); a failed write is
  cut back to the last good position so a torn record never sits in the file.
* Start-up salvage goes further than Go's: besides "write file longer than writePos" it also
  notices data files *after* writeFileNum (possible because a rotation's sync is asynchronous
  here), moves the writer past all of them, and adds the records found beyond the recorded
  writePos to the depth, so depth stays exact after a crash.
* The tail checks (depth reset, read position past write position) also run at start-up.
* A reader that has caught up with the writer when the writer rolls to a new file moves on
  instead of flagging the finished file as corrupt (go-diskqueue issue #42 renames it to .bad).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..internal.lg import RepeatSummary

__all__ = ["DiskQueue", "DiskQueueError", "DiskQueuePositions", "LogFunc", "queue_names"]

LogFunc = Callable[[str, str], None]

# go-diskqueue reads the length as a signed int32; negative lengths fail the minimum check.
_LENGTH = struct.Struct(">i")
_READ_CHUNK = 32 * 1024  # small: nsqd may have thousands of queues with a backlog
_COUNT_BUFFER = 1 << 20
# a failed sync is retried after this delay, doubled per failure up to the maximum
_RETRY_FIRST = 0.1
_RETRY_MAX = 5.0
_OPEN_FLAGS_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Go parses the metadata with fmt.Fscanf("%d\n%d,%d\n%d,%d\n"): numbers may carry a sign and
# leading blanks; we also accept a missing final newline.
_NUMBER = rb"[ \t]*([+-]?\d+)"
_META_PATTERN = re.compile(
    _NUMBER + rb"\n" + _NUMBER + rb"," + _NUMBER + rb"\n" + _NUMBER + rb"," + _NUMBER + rb"(?:\n|$)"
)


class DiskQueueError(Exception):
    """A put, empty or close failed. ``stored`` counts the records of a batch that were stored."""

    def __init__(self, message: str, stored: int = 0) -> None:
        super().__init__(message)
        self.stored = stored


class DiskQueuePositions(NamedTuple):
    depth: int
    read_file_num: int
    read_pos: int
    write_file_num: int
    write_pos: int


class _ReadError(Exception):
    """The record at the read position cannot be read: the file is treated as corrupt."""


class _SyncJob:
    """Everything a worker thread needs for one sync, so it shares nothing with the loop.

    Data files are fsynced through a descriptor of their own, opened by path: fsync flushes the
    file, not the descriptor, and the loop may close or roll its write descriptor meanwhile.
    """

    __slots__ = ("doomed_paths", "fsync_paths", "meta_text", "seq")

    def __init__(
        self, seq: int, meta_text: bytes, fsync_paths: list[str], doomed_paths: list[str]
    ) -> None:
        self.seq = seq
        self.meta_text = meta_text
        self.fsync_paths = fsync_paths  # finished write files not yet fsynced + the current one
        self.doomed_paths = doomed_paths  # consumed files to delete once metadata moved on


class _SyncResult:
    __slots__ = ("errors", "job", "ok")

    def __init__(self, job: _SyncJob, ok: bool, errors: list[tuple[str, str]]) -> None:
        self.job = job
        self.ok = ok
        self.errors = errors  # (level, message) pairs, logged on the loop thread


#: the name of a queue's metadata or data file (``.bad`` files, renamed after corruption, are not)
_QUEUE_FILE = re.compile(r"(?P<name>.+)\.diskqueue\.(?:meta|\d{6})\.dat")


def queue_names(data_path: str) -> set[str]:
    """The names of every disk queue with a metadata or data file in ``data_path``."""
    return {m["name"] for m in map(_QUEUE_FILE.fullmatch, os.listdir(data_path)) if m}


class DiskQueue:
    """A filesystem-backed FIFO queue of byte records (see the module docstring)."""

    __slots__ = (
        "_closed",
        "_count",
        "_data_path",
        "_depth",
        "_dirty_since",
        "_doomed_paths",
        "_failures",
        "_kicked_sync",
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

        self._retrieve_metadata()
        self._skip_missing_read_files()
        self._salvage_unrecorded_writes()
        self._check_tail_corruption(self._depth)

    # ----------------------------------------------------------------------------- public API

    @property
    def name(self) -> str:
        return self._name

    def depth(self) -> int:
        return self._depth

    def positions(self) -> DiskQueuePositions:
        """The in-memory state that the metadata file records (for stats and tests)."""
        return DiskQueuePositions(
            self._depth,
            self._read_file_num,
            self._read_pos,
            self._write_file_num,
            self._write_pos,
        )

    def file_name(self, file_num: int) -> str:
        return os.path.join(self._data_path, f"{self._name}.diskqueue.{file_num:06d}.dat")

    def meta_file_name(self) -> str:
        return self._meta_path

    def put(self, data: bytes) -> None:
        """Append one record; raises DiskQueueError on a bad size or an I/O error."""
        if self._closed:
            raise DiskQueueError("exiting")
        size = len(data)
        self._check_write_size(size)
        total = 4 + size
        if self._write_pos > 0 and self._write_pos + total > self._max_bytes_per_file:
            self._rotate()
        self._write_segment([_LENGTH.pack(size), data], total, 1, 0)

    def put_many(self, records: Sequence[bytes]) -> None:
        """Append records in order with one write per data file touched.

        Every size is checked before anything is written. On an I/O error the exception's
        ``stored`` attribute says how many leading records were stored.
        """
        if self._closed:
            raise DiskQueueError("exiting")
        for record in records:
            self._check_write_size(len(record))
        pack = _LENGTH.pack
        limit = self._max_bytes_per_file
        pieces: list[bytes] = []
        pos = self._write_pos
        segment_bytes = 0
        segment_records = 0
        stored = 0
        for record in records:
            total = 4 + len(record)
            if pos > 0 and pos + total > limit:
                if segment_records:
                    self._write_segment(pieces, segment_bytes, segment_records, stored)
                    stored += segment_records
                    pieces = []
                    segment_bytes = segment_records = 0
                self._rotate()
                pos = 0
            pieces.append(pack(len(record)))
            pieces.append(record)
            pos += total
            segment_bytes += total
            segment_records += 1
        if segment_records:
            self._write_segment(pieces, segment_bytes, segment_records, stored)

    def put_framed(self, framed: bytes, count: int) -> bool:
        """Append ``count`` records already framed (``BE32 size, payload`` each, sizes valid)
        as one write, if they fit in the current file; False (nothing written) if not, for
        :meth:`put_many` to split them. nsqd's fan-out writes one batch to many queues."""
        if self._closed:
            raise DiskQueueError("exiting")
        if self._write_pos + len(framed) > self._max_bytes_per_file:
            return False
        self._write_segment([framed], len(framed), count, 0)
        return True

    def get(self) -> bytes | None:
        """Remove and return the oldest record, or None when the queue is empty."""
        while not self._closed:
            if self._read_file_num >= self._write_file_num and self._read_pos >= self._write_pos:
                return None
            try:
                record = self._read_one()
            except (_ReadError, OSError) as exc:
                self._log(
                    "ERROR",
                    f"DISKQUEUE({self._name}) reading at {self._read_pos} of "
                    f"{self.file_name(self._read_file_num)} - {_describe(exc)}",
                )
                self._handle_read_error()
                continue
            if record is None:
                self._finish_read_file()
                continue
            return record
        return None

    def empty(self) -> None:
        """Delete every data file and the metadata; continue at writeFileNum + 1 (Go's Empty)."""
        if self._closed:
            raise DiskQueueError("exiting")
        self._log("INFO", f"DISKQUEUE({self._name}): emptying")
        failure = self._skip_to_next_rw_file()
        for path in self._doomed_paths:
            _remove_quietly(path)
        self._doomed_paths = []
        self._retired_paths = []
        self._count = 0
        with self._meta_lock:
            # Invalidate every snapshot taken so far: a worker still holding one must not
            # bring the metadata file back.
            self._sync_seq += 1
            self._persisted_seq = self._sync_seq
            try:
                os.remove(self._meta_path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self._log(
                    "ERROR",
                    f"DISKQUEUE({self._name}) failed to remove metadata file - {_describe(exc)}",
                )
                failure = exc
        if failure is not None:
            raise DiskQueueError(_describe(failure)) from failure

    def delete(self) -> None:
        """Empty the queue and close it without a sync (topic/channel deletion)."""
        if self._closed:
            return
        try:
            self.empty()
        finally:
            self._log("INFO", f"DISKQUEUE({self._name}): deleting")
            self._closed = True
            self._close_files()

    def close(self) -> None:
        """Close the files after an fsync and a metadata write; blocks (meant for shutdown)."""
        if self._closed:
            return
        self._log("INFO", f"DISKQUEUE({self._name}): closing")
        job = self._take_sync_job()
        self._closed = True
        self._close_files()
        result = self._run_sync_job(job)
        self._absorb_sync_result(result)
        if not result.ok:
            raise DiskQueueError("; ".join(message for _, message in result.errors))

    def sync_due(self) -> bool:
        """True when ``sync_every`` reads+writes happened since the last sync, or the oldest
        unsynced one is ``sync_timeout`` old, or a roll/file change/repair asks for one."""
        if self._closed:
            return False
        if self._retry_at and time.monotonic() < self._retry_at:
            return False
        if self._need_sync:
            return True
        if self._count == 0:
            return False
        if self._count >= self._sync_every:
            return True
        return time.monotonic() - self._dirty_since >= self._sync_timeout

    async def sync(self) -> None:
        """fsync the data and persist the metadata, the blocking part in a worker thread.

        Puts, gets and rotations may carry on meanwhile; the sync covers the state at the moment
        it starts. Concurrent calls run one after the other. Errors are logged and the sync is
        retried at the next ``sync_due()``.
        """
        loop = asyncio.get_running_loop()
        if self._sync_lock is None or self._sync_loop is not loop:
            self._sync_lock = asyncio.Lock()  # an asyncio.Lock belongs to one loop
            self._sync_loop = loop
        async with self._sync_lock:
            if self._closed or not self._has_unsynced_changes():
                return
            job = self._take_sync_job()
            worker = loop.run_in_executor(None, self._run_sync_job, job)
            # absorbed even if this coroutine is cancelled: a failed job hands back the files
            # it still has to fsync or delete
            worker.add_done_callback(self._sync_job_done)
            await asyncio.shield(worker)

    async def run_syncer(self, interval: float | None = None) -> None:
        """Sync whenever one is due, checking every ``interval`` seconds (default
        ``min(sync_timeout, 0.1)``), until the queue is closed or the task is cancelled."""
        period = interval if interval is not None else max(0.001, min(self._sync_timeout, 0.1))
        while not self._closed:
            await asyncio.sleep(period)
            if self.sync_due():
                try:
                    await self.sync()
                except Exception as exc:  # the syncer must outlive any one failure
                    self._sync_failed(f"DISKQUEUE({self._name}) failed to sync - {exc}")

    # ---------------------------------------------------------------------------- write side

    def _check_write_size(self, size: int) -> None:
        if size < self._min_msg_size or size > self._max_msg_size:
            raise DiskQueueError(
                f"invalid message write size ({size}) minMsgSize={self._min_msg_size} "
                f"maxMsgSize={self._max_msg_size}"
            )

    def _write_segment(self, pieces: list[bytes], nbytes: int, nrecords: int, stored: int) -> None:
        """Write framed records to the current file in one go and account for them."""
        fd = self._write_fd if self._write_fd is not None else self._open_write_file(stored)
        buffer = b"".join(pieces)
        try:
            written = os.write(fd, buffer)
            if written < len(buffer):
                view = memoryview(buffer)
                while written < len(buffer):
                    written += os.write(fd, view[written:])
        except OSError as exc:
            # Cut off what part of the batch did reach the file: a torn record past writePos
            # would be read as data once the file is finished, and its blocks are wanted back.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._write_pos)
            # Like Go: drop the file handle; the next put reopens and seeks back to writePos.
            self._write_fd = None
            self._write_failing = True
            _close_quietly(fd)
            raise DiskQueueError(_describe(exc), stored) from exc
        self._write_failing = False
        self._write_pos += nbytes
        self._depth += nrecords
        if not self._count:
            self._dirty_since = time.monotonic()
        self._count += nrecords

    def _open_write_file(self, stored: int) -> int:
        path = self.file_name(self._write_file_num)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | _OPEN_FLAGS_CLOEXEC, 0o600)
        except OSError as exc:
            raise DiskQueueError(_describe(exc), stored) from exc
        if not self._write_failing:  # not once per refused PUB during a full disk
            self._log("INFO", f"DISKQUEUE({self._name}): writeOne() opened {path}")
        if self._write_pos > 0:
            try:
                os.lseek(fd, self._write_pos, os.SEEK_SET)
            except OSError as exc:
                _close_quietly(fd)
                raise DiskQueueError(_describe(exc), stored) from exc
        self._write_fd = fd
        return fd

    def _rotate(self) -> None:
        """Finish the current write file before a record that would overflow it."""
        if self._read_file_num == self._write_file_num:
            # the reader is in this file: it ends here, whatever a later stat would say
            self._read_end = self._write_pos
        if self._write_fd is not None:
            self._retired_paths.append(self.file_name(self._write_file_num))
            _close_quietly(self._write_fd)
            self._write_fd = None
        self._write_file_num += 1
        self._write_pos = 0
        self._request_sync()  # Go syncs at every roll

    # ----------------------------------------------------------------------------- read side

    def _read_one(self) -> bytes | None:
        """Read the record at the read position and advance past it.

        Returns None when a finished file is exhausted exactly at a record boundary.
        """
        if self._read_fd is None:
            self._open_read_file()
        pos = self._read_pos
        complete = self._read_file_num < self._write_file_num
        if complete:
            end = self._read_end if self._read_end is not None else self._max_bytes_per_file
            if pos == end:
                return None
        buf = self._read_buf
        offset = pos - self._read_buf_start
        if offset < 0 or offset + 4 > len(buf):
            buf = self._fill(pos, 4)
            offset = 0
        (size,) = _LENGTH.unpack_from(buf, offset)
        if size < self._min_msg_size or size > self._max_msg_size:
            # no way of knowing where the next record starts: the file is corrupt
            raise _ReadError(f"invalid message read size ({size})")
        start = offset + 4
        if start + size > len(buf):
            buf = self._fill(pos, 4 + size)
            start = 4
        record = buf[start : start + size]

        next_pos = pos + 4 + size
        if complete and next_pos >= (
            self._read_end if self._read_end is not None else self._max_bytes_per_file
        ):
            self._consume(self._read_file_num + 1, 0)
        else:
            self._consume(self._read_file_num, next_pos)
        return record

    def _open_read_file(self) -> None:
        path = self.file_name(self._read_file_num)
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS_CLOEXEC)
        self._log("INFO", f"DISKQUEUE({self._name}): readOne() opened {path}")
        self._read_fd = fd
        self._read_buf = b""
        self._read_buf_start = 0
        self._read_end = None
        if self._read_file_num < self._write_file_num:
            try:
                self._read_end = os.fstat(fd).st_size
            except OSError:
                self._read_end = self._max_bytes_per_file

    def _fill(self, pos: int, need: int) -> bytes:
        """Buffer at least ``need`` bytes of the read file from ``pos`` (or fail: EOF)."""
        fd = self._read_fd
        assert fd is not None
        want = max(need, _READ_CHUNK)
        if self._read_file_num == self._write_file_num:
            # never buffer past writePos: those bytes may not be ours yet
            want = max(need, min(_READ_CHUNK, self._write_pos - pos))
        chunks = [os.pread(fd, want, pos)]
        got = len(chunks[0])
        while got < need:
            more = os.pread(fd, want - got, pos + got)
            if not more:
                break
            chunks.append(more)
            got += len(more)
        buf = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._read_buf = buf
        self._read_buf_start = pos
        if got < need:
            self._close_read_file()
            raise _ReadError("EOF" if got == 0 else "unexpected EOF")
        return buf

    def _consume(self, next_file_num: int, next_pos: int) -> None:
        """Go's moveForward: the record is taken, positions and depth advance."""
        old_file_num = self._read_file_num
        self._read_file_num = next_file_num
        self._read_pos = next_pos
        self._depth -= 1
        if not self._count:
            self._dirty_since = time.monotonic()
        self._count += 1
        if old_file_num != next_file_num:
            self._leave_read_file(old_file_num)
        self._check_tail_corruption(self._depth)

    def _finish_read_file(self) -> None:
        """A finished file ended exactly at the read position: move on without a record."""
        old_file_num = self._read_file_num
        self._read_file_num += 1
        self._read_pos = 0
        self._leave_read_file(old_file_num)
        self._check_tail_corruption(self._depth)

    def _leave_read_file(self, old_file_num: int) -> None:
        self._close_read_file()
        # deleted by the sync that persists metadata past it
        self._doomed_paths.append(self.file_name(old_file_num))
        self._request_sync()

    def _close_read_file(self) -> None:
        if self._read_fd is not None:
            _close_quietly(self._read_fd)
            self._read_fd = None
        self._read_buf = b""
        self._read_buf_start = 0
        self._read_end = None

    def _handle_read_error(self) -> None:
        """Rename the unreadable file to .bad and carry on with the next file number."""
        if self._read_file_num == self._write_file_num:
            # the write file itself is broken: never append to it again
            if self._write_fd is not None:
                _close_quietly(self._write_fd)
                self._write_fd = None
            self._write_file_num += 1
            self._write_pos = 0
        self._close_read_file()
        bad_path = self.file_name(self._read_file_num)
        bad_rename = bad_path + ".bad"
        self._log(
            "WARN",
            f"DISKQUEUE({self._name}) jump to next file and saving bad file as {bad_rename}",
        )
        try:
            os.rename(bad_path, bad_rename)
        except OSError:
            self._log(
                "ERROR",
                f"DISKQUEUE({self._name}) failed to rename bad diskqueue file "
                f"{bad_path} to {bad_rename}",
            )
        self._read_file_num += 1
        self._read_pos = 0
        self._request_sync()
        self._check_tail_corruption(self._depth)

    # ---------------------------------------------------------------- consistency and repair

    def _check_tail_corruption(self, depth: int) -> None:
        """When the reader has caught up, depth must be 0 and positions must be equal."""
        if self._read_file_num < self._write_file_num or self._read_pos < self._write_pos:
            return
        if depth != 0:
            if depth < 0:
                self._log(
                    "ERROR",
                    f"DISKQUEUE({self._name}) negative depth at tail ({depth}), "
                    "metadata corruption, resetting 0...",
                )
            else:
                self._log(
                    "ERROR",
                    f"DISKQUEUE({self._name}) positive depth at tail ({depth}), "
                    "data loss, resetting 0...",
                )
            self._depth = 0
            self._request_sync()
        if self._read_file_num != self._write_file_num or self._read_pos != self._write_pos:
            if self._read_file_num > self._write_file_num:
                self._log(
                    "ERROR",
                    f"DISKQUEUE({self._name}) readFileNum > writeFileNum "
                    f"({self._read_file_num} > {self._write_file_num}), corruption, "
                    "skipping to next writeFileNum and resetting 0...",
                )
            if self._read_pos > self._write_pos:
                self._log(
                    "ERROR",
                    f"DISKQUEUE({self._name}) readPos > writePos "
                    f"({self._read_pos} > {self._write_pos}), corruption, "
                    "skipping to next writeFileNum and resetting 0...",
                )
            self._skip_to_next_rw_file()
            self._request_sync()

    def _skip_to_next_rw_file(self) -> OSError | None:
        """Delete readFileNum..writeFileNum and start both sides on a fresh file."""
        self._close_files()
        failure: OSError | None = None
        for file_num in range(self._read_file_num, self._write_file_num + 1):
            path = self.file_name(file_num)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self._log(
                    "ERROR",
                    f"DISKQUEUE({self._name}) failed to remove data file - {_describe(exc)}",
                )
                failure = exc
        self._write_file_num += 1
        self._write_pos = 0
        self._read_file_num = self._write_file_num
        self._read_pos = 0
        self._depth = 0
        return failure

    def _retrieve_metadata(self) -> None:
        try:
            with open(self._meta_path, "rb") as meta:
                text = meta.read()
        except FileNotFoundError:
            return  # a new queue
        except OSError as exc:
            self._log(
                "ERROR",
                f"DISKQUEUE({self._name}) failed to retrieveMetaData - {_describe(exc)}",
            )
            return
        match = _META_PATTERN.match(text)
        if match is None:
            self._log(
                "ERROR",
                f"DISKQUEUE({self._name}) failed to retrieveMetaData - "
                f"unparsable metadata {text[:100]!r}",
            )
            return
        depth, read_num, read_pos, write_num, write_pos = (int(g) for g in match.groups())
        self._depth = depth
        self._read_file_num = read_num
        self._read_pos = read_pos
        self._write_file_num = write_num
        self._write_pos = write_pos

    def _skip_missing_read_files(self) -> None:
        """A read position in a file that is gone: continue at the next file that exists.

        This queue deletes a finished file before its metadata is written when the metadata
        cannot be written (a full disk); a crash then leaves the recorded read position in that
        deleted file. Go's own queue deletes first and syncs after, so its data directories can
        show the same. The depth is recounted from the files, as the recorded one still counts
        the records of the deleted file.
        """
        if self._read_file_num >= self._write_file_num:
            return  # the write file itself: get() handles a missing one as corruption
        if os.path.exists(self.file_name(self._read_file_num)):
            return
        missing = self._read_file_num
        resume = missing + 1
        while resume < self._write_file_num and not os.path.exists(self.file_name(resume)):
            resume += 1
        depth = 0
        for file_num in range(resume, self._write_file_num + 1):
            end = self._write_pos if file_num == self._write_file_num else None
            depth += self._count_records(self.file_name(file_num), 0, end)
        self._log(
            "WARN",
            f"DISKQUEUE({self._name}) read file {self.file_name(missing)} is gone (finished "
            f"before the metadata could record it), continuing at file {resume}, "
            f"depth {self._depth} -> {depth}",
        )
        self._read_file_num = resume
        self._read_pos = 0
        self._depth = depth
        self._request_sync()

    def _salvage_unrecorded_writes(self) -> None:
        """Handle data written after the last metadata sync (a crash, or a kill).

        Go's rule: a write file longer than writePos makes writing skip to the next file, and the
        reader salvages the old file up to its real size. Here the writer also skips any data
        files after writeFileNum, and the records found beyond writePos are added to the depth.
        """
        write_path = self.file_name(self._write_file_num)
        try:
            size: int | None = os.stat(write_path).st_size
        except OSError:
            size = None
        grown = size is not None and size > self._write_pos
        if grown:
            self._log(
                "WARN",
                f"DISKQUEUE({self._name}) {write_path} metadata writePos {self._write_pos} "
                f"< file size of {size}, skipping to new file",
            )
        first_free = self._write_file_num + 1
        while os.path.exists(self.file_name(first_free)):
            first_free += 1
        extra_files = range(self._write_file_num + 1, first_free)
        if extra_files:
            self._log(
                "WARN",
                f"DISKQUEUE({self._name}) data files {self.file_name(extra_files[0])} to "
                f"{self.file_name(extra_files[-1])} are newer than the metadata, "
                f"skipping to file {first_free}",
            )
        if not grown and not extra_files:
            return
        found = self._count_records(write_path, self._write_pos) if grown else 0
        for file_num in extra_files:
            found += self._count_records(self.file_name(file_num), 0)
        if found:
            self._log(
                "WARN",
                f"DISKQUEUE({self._name}) found {found} records written after the last "
                f"metadata sync, depth {self._depth} -> {self._depth + found}",
            )
            self._depth += found
        self._write_file_num = first_free
        self._write_pos = 0
        self._request_sync()

    def _count_records(self, path: str, start: int, end: int | None = None) -> int:
        """Count the well-formed records in a file from ``start`` up to the first bad one
        (or up to ``end``)."""
        count = 0
        try:
            data_file = open(path, "rb", buffering=_COUNT_BUFFER)  # noqa: SIM115
        except OSError:
            return 0
        with data_file:
            size = os.fstat(data_file.fileno()).st_size
            if end is not None:
                size = min(size, end)
            pos = start
            data_file.seek(pos)
            while pos + 4 <= size:
                header = data_file.read(4)
                if len(header) < 4:
                    break
                (length,) = _LENGTH.unpack(header)
                if length < self._min_msg_size or length > self._max_msg_size:
                    break
                if pos + 4 + length > size:
                    break
                data_file.seek(length, os.SEEK_CUR)
                pos += 4 + length
                count += 1
        return count

    # ------------------------------------------------------------------------------ syncing

    def _has_unsynced_changes(self) -> bool:
        return self._need_sync or self._count > 0

    def _request_sync(self) -> None:
        """Mark a sync as needed now; start one if an event loop is running here."""
        self._need_sync = True
        if self._closed or self._backing_off():
            return  # sync_due() says when the backoff is over; the owner's poll starts it
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: the owner's next sync() or close() covers it
        pending = self._kicked_sync
        if pending is not None and not pending.done() and pending.get_loop() is loop:
            return  # that sync has not taken its snapshot yet, or will be followed by ours
        task = loop.create_task(self.sync())
        self._kicked_sync = task
        task.add_done_callback(self._kicked_sync_done)

    def _kicked_sync_done(self, task: asyncio.Task[None]) -> None:
        self._kicked_sync = None
        if not task.cancelled() and task.exception() is not None:
            self._sync_failed(f"DISKQUEUE({self._name}) failed to sync - {task.exception()}")
        elif self._need_sync and not self._closed:
            # asked for after that sync had taken its snapshot (a request made while it ran
            # was folded into it): nothing else would start the sync that covers it
            self._request_sync()

    def _take_sync_job(self) -> _SyncJob:
        """Snapshot the state to persist; runs on the loop thread."""
        self._sync_seq += 1
        meta_text = (
            f"{self._depth}\n{self._read_file_num},{self._read_pos}\n"
            f"{self._write_file_num},{self._write_pos}\n"
        ).encode()
        fsync_paths = self._retired_paths
        if self._write_fd is not None:
            fsync_paths.append(self.file_name(self._write_file_num))
        job = _SyncJob(self._sync_seq, meta_text, fsync_paths, self._doomed_paths)
        self._retired_paths = []
        self._doomed_paths = []
        self._count = 0
        self._need_sync = False
        return job

    def _run_sync_job(self, job: _SyncJob) -> _SyncResult:
        """fsync, write the metadata, delete consumed files; may run in a worker thread."""
        errors: list[tuple[str, str]] = []
        ok = True
        for path in job.fsync_paths:
            try:
                _fsync_path(path)
            except FileNotFoundError:
                pass  # already consumed, or renamed to .bad
            except OSError as exc:
                errors.append(("ERROR", f"DISKQUEUE({self._name}) failed to sync - {exc}"))
                ok = False
        persist_error: OSError | None = None
        if ok:
            try:
                self._persist_metadata(job.seq, job.meta_text)
            except OSError as exc:
                persist_error = exc
        if (not ok or persist_error is not None) and job.doomed_paths:
            # The metadata still names a finished file, but the reader is past all of it:
            # deleting it now loses nothing (start-up skips a missing read file) and gives back
            # the space a full disk needs to write the metadata at all.
            self._remove_doomed(job, errors)
            if persist_error is not None:
                try:
                    self._persist_metadata(job.seq, job.meta_text)
                    persist_error = None
                except OSError as exc:
                    persist_error = exc
        if persist_error is not None:
            errors.append(("ERROR", f"DISKQUEUE({self._name}) failed to sync - {persist_error}"))
            ok = False
        if ok:
            self._remove_doomed(job, errors)
            job.fsync_paths = []
        return _SyncResult(job, ok, errors)

    def _remove_doomed(self, job: _SyncJob, errors: list[tuple[str, str]]) -> None:
        kept = []
        for path in job.doomed_paths:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                message = f"DISKQUEUE({self._name}) failed to Remove({path}) - {exc}"
                errors.append(("ERROR", message))
                kept.append(path)  # e.g. a read-only data path: try again at the next sync
        job.doomed_paths = kept

    def _persist_metadata(self, seq: int, text: bytes) -> None:
        """Write the metadata to a temporary file, fsync it and rename it over the real one."""
        tmp_path = f"{self._meta_path}.{random.getrandbits(63)}.tmp"
        fd = os.open(tmp_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | _OPEN_FLAGS_CLOEXEC, 0o600)
        try:
            try:
                os.write(fd, text)
                os.fsync(fd)
            finally:
                os.close(fd)
            with self._meta_lock:
                if seq > self._persisted_seq:
                    os.rename(tmp_path, self._meta_path)
                    self._persisted_seq = seq
                    return
        except BaseException:
            _remove_quietly(tmp_path)
            raise
        _remove_quietly(tmp_path)  # a newer snapshot (or an Empty) got there first

    def _sync_job_done(self, worker: asyncio.Future[_SyncResult]) -> None:
        if worker.cancelled():
            return
        failure = worker.exception()
        if failure is not None:
            self._sync_failed(f"DISKQUEUE({self._name}) failed to sync - {failure}")
            self._need_sync = not self._closed
            return
        self._absorb_sync_result(worker.result())

    def _absorb_sync_result(self, result: _SyncResult) -> None:
        if result.ok:
            self._sync_succeeded()
        for _, message in result.errors:
            self._sync_failed(message)
        # try again at the next sync_due(); keep what still has to be synced or deleted
        # (a removal can fail even when the metadata was written: a read-only data path)
        self._doomed_paths[:0] = result.job.doomed_paths
        if not result.ok:
            current = self.file_name(self._write_file_num)
            self._retired_paths[:0] = [p for p in result.job.fsync_paths if p != current]
        if (result.job.doomed_paths or not result.ok) and not self._closed:
            self._need_sync = True

    def _backing_off(self) -> bool:
        return bool(self._retry_at) and time.monotonic() < self._retry_at

    def _sync_failed(self, message: str) -> None:
        """Log once, then summarise; wait longer before each retry (bounded)."""
        self._failures.failed("sync", message)
        self._retry_delay = min(_RETRY_MAX, max(_RETRY_FIRST, self._retry_delay * 2))
        self._retry_at = time.monotonic() + self._retry_delay

    def _sync_succeeded(self) -> None:
        self._retry_delay = 0.0
        self._retry_at = 0.0
        self._failures.recovered("sync", f"DISKQUEUE({self._name}) sync succeeded again")

    def _close_files(self) -> None:
        self._close_read_file()
        if self._write_fd is not None:
            _close_quietly(self._write_fd)
            self._write_fd = None


def _fsync_path(path: str) -> None:
    # fdatasync: the appended data and the file size reach the disk; only timestamps do not
    # (a third cheaper than fsync on this kind of disk, and as safe for an append-only file)
    fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS_CLOEXEC)
    try:
        _datasync(fd)
    finally:
        os.close(fd)


_datasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def _describe(exc: BaseException) -> str:
    """Error text in the spirit of Go's: ``open <path>: no such file or directory``."""
    if isinstance(exc, OSError) and exc.strerror:
        target = f"{exc.filename}: " if exc.filename else ""
        return f"{target}{exc.strerror.lower()}"
    return str(exc)
