"""Writing a disk queue: records appended with one write(2) per batch and data file,
rolling to a new file before a record that would overflow the current one."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from .files import (
    LENGTH,
    OPEN_FLAGS_CLOEXEC,
    DiskQueueError,
    QueueFiles,
    close_quietly,
    describe,
)
from .reading import Reader
from .state import QueueState
from .syncing import Syncer


class Writer:
    """The write side: the write file's descriptor, records appended and accounted for."""

    __slots__ = ("_files", "_reader", "_state", "_syncer", "_write_failing", "_write_fd")

    def __init__(
        self, state: QueueState, files: QueueFiles, syncer: Syncer, reader: Reader
    ) -> None:
        self._state = state
        self._files = files
        self._syncer = syncer
        self._reader = reader
        self._write_fd: int | None = None
        self._write_failing = False  # quiet the reopen line while every write fails

    def file_open(self) -> bool:
        return self._write_fd is not None

    @property
    def write_fd(self) -> int | None:
        """The descriptor of the write file (None until a put opens it)."""
        return self._write_fd

    def close_file(self) -> None:
        if self._write_fd is not None:
            close_quietly(self._write_fd)
            self._write_fd = None

    def put(self, data: bytes) -> None:
        """Append one record; raises DiskQueueError on a bad size or an I/O error."""
        st = self._state
        if st.closed:
            raise DiskQueueError("exiting")
        size = len(data)
        self._check_write_size(size)
        total = 4 + size
        if st.write_pos > 0 and st.write_pos + total > st.max_bytes_per_file:
            self._rotate()
        self._write_segment([LENGTH.pack(size), data], total, 1, 0)

    def put_many(self, records: Sequence[bytes]) -> None:
        """Append records in order with one write per data file touched.

        Every size is checked before anything is written. On an I/O error the exception's
        ``stored`` attribute says how many leading records were stored.
        """
        st = self._state
        if st.closed:
            raise DiskQueueError("exiting")
        for record in records:
            self._check_write_size(len(record))
        pack = LENGTH.pack
        limit = st.max_bytes_per_file
        pieces: list[bytes] = []
        pos = st.write_pos
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

    def put_framed(self, framed: bytes, count: int, largest: int) -> bool:
        """Append ``count`` records already framed (``BE32 size, payload`` each, the largest
        payload ``largest`` bytes) as one write, if they fit in the current file and every
        size is one :meth:`put_many` takes; False (nothing written) if not, for
        :meth:`put_many` to split them or refuse the bad one. nsqd's fan-out writes one batch
        to many queues."""
        st = self._state
        if st.closed:
            raise DiskQueueError("exiting")
        if st.write_pos + len(framed) > st.max_bytes_per_file or largest > st.max_msg_size:
            return False
        self._write_segment([framed], len(framed), count, 0)
        return True

    def _check_write_size(self, size: int) -> None:
        st = self._state
        if size < st.min_msg_size or size > st.max_msg_size:
            raise DiskQueueError(
                f"invalid message write size ({size}) minMsgSize={st.min_msg_size} "
                f"maxMsgSize={st.max_msg_size}"
            )

    def _write_segment(self, pieces: list[bytes], nbytes: int, nrecords: int, stored: int) -> None:
        """Write framed records to the current file in one go and account for them."""
        st = self._state
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
                os.ftruncate(fd, st.write_pos)
            # Like Go: drop the file handle; the next put reopens and seeks back to writePos.
            self._write_fd = None
            self._write_failing = True
            close_quietly(fd)
            raise DiskQueueError(describe(exc), stored) from exc
        self._write_failing = False
        st.write_pos += nbytes
        st.depth += nrecords
        if not st.count:
            st.dirty_since = st.clock()
        st.count += nrecords

    def _open_write_file(self, stored: int) -> int:
        st = self._state
        path = self._files.segment(st.write_file_num)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | OPEN_FLAGS_CLOEXEC, 0o600)
        except OSError as exc:
            raise DiskQueueError(describe(exc), stored) from exc
        if not self._write_failing:  # not once per refused PUB during a full disk
            st.log("INFO", f"DISKQUEUE({st.name}): writeOne() opened {path}")
        if st.write_pos > 0:
            try:
                os.lseek(fd, st.write_pos, os.SEEK_SET)
            except OSError as exc:
                close_quietly(fd)
                raise DiskQueueError(describe(exc), stored) from exc
        self._write_fd = fd
        return fd

    def _rotate(self) -> None:
        """Finish the current write file before a record that would overflow it."""
        st = self._state
        self._reader.end_file_at(st.write_pos)
        if self._write_fd is not None:
            self._syncer.retire(self._files.segment(st.write_file_num))
            close_quietly(self._write_fd)
            self._write_fd = None
        st.write_file_num += 1
        st.write_pos = 0
        self._syncer.request_sync()  # Go syncs at every roll
