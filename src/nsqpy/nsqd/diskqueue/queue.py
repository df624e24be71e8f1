"""The DiskQueue class: its writes and its public API (see the package docstring)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence

from .files import (
    _LENGTH,
    _OPEN_FLAGS_CLOEXEC,
    DiskQueueError,
    DiskQueuePositions,
    LogFunc,
    _close_quietly,
    _describe,
    _remove_quietly,
)
from .holds import (
    Hold,
)
from .reading import _Reading


class DiskQueue(_Reading):
    """A filesystem-backed FIFO queue of byte records (see the package docstring)."""

    __slots__ = ()

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
        super().__init__(
            name,
            data_path,
            max_bytes_per_file,
            min_msg_size,
            max_msg_size,
            sync_every,
            sync_timeout,
            log,
        )
        self._retrieve_metadata()
        self._skip_missing_read_files()
        self._salvage_unrecorded_writes()
        self._check_tail_corruption(self._depth)

    def positions(self) -> DiskQueuePositions:
        """Where the reader and the writer are, and the records between (for stats, tests and
        the queue-bytes bookkeeping). Without ``hold_reads`` the metadata file records this."""
        return DiskQueuePositions(
            self._depth,
            self._read_file_num,
            self._read_pos,
            self._write_file_num,
            self._write_pos,
        )

    def committed_positions(self) -> DiskQueuePositions:
        """What the metadata file records: with ``hold_reads`` the committed read position,
        and a depth that counts the held records."""
        depth, read_file_num, read_pos = self._committed()
        return DiskQueuePositions(
            depth, read_file_num, read_pos, self._write_file_num, self._write_pos
        )

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

    def put_held(self, data: bytes) -> Hold | None:
        """Append a record that is handed out at once, when nothing waits before it (the
        cursor is at the write position); None, writing nothing, when records wait."""
        holds = self._holds
        if holds is None or (self._read_file_num, self._read_pos) != (
            self._write_file_num,
            self._write_pos,
        ):
            return None
        self.put(data)
        start = (self._write_file_num, self._write_pos - 4 - len(data))
        hold = holds.add(start)
        self._last_held, self._last_start, self._last_record = hold, start, data
        old_file_num = self._read_file_num
        self._read_file_num = self._write_file_num
        self._read_pos = self._write_pos
        self._depth -= 1
        if old_file_num != self._read_file_num:  # the put rolled to a new file
            self._leave_read_file(old_file_num)
        return hold

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
        job = self._take_sync_job(final=True)
        self._closed = True
        self._close_files()
        result = self._run_sync_job(job)
        self._absorb_sync_result(result)
        if not result.ok:
            raise DiskQueueError("; ".join(message for _, message in result.errors))

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
