"""Reading a disk queue: records in order (buffered, across files, past corruption) and a
read-only peek."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Protocol

from .files import (
    LENGTH,
    OPEN_FLAGS_CLOEXEC,
    READ_CHUNK,
    QueueFiles,
    ReadError,
    close_quietly,
    describe,
)
from .holds import Hold, Position
from .state import QueueState
from .syncing import Syncer


class ReadFailures(Protocol):
    """What the reader asks of recovery (:class:`~.recovery.Recovery`), which in turn closes
    this reader's file: named here so the two modules do not import each other."""

    def check_tail_corruption(self, depth: int) -> None: ...

    def handle_read_error(self) -> None: ...


class Reader:
    """The read side: the read file's descriptor and buffer, records taken in order."""

    __slots__ = (
        "_files",
        "_read_buf",
        "_read_buf_start",
        "_read_end",
        "_read_fd",
        "_state",
        "_syncer",
        "recovery",
    )

    def __init__(self, state: QueueState, files: QueueFiles, syncer: Syncer) -> None:
        self._state = state
        self._files = files
        self._syncer = syncer
        self._read_fd: int | None = None
        self._read_buf = b""
        self._read_buf_start = 0
        # End of the file being read once it is complete; None while it is the write file.
        self._read_end: int | None = None
        self.recovery: ReadFailures  # wired by DiskQueue

    def close_file(self) -> None:
        if self._read_fd is not None:
            close_quietly(self._read_fd)
            self._read_fd = None
        self._read_buf = b""
        self._read_buf_start = 0
        self._read_end = None

    def end_file_at(self, write_pos: int) -> None:
        """The writer rolled on: if the reader is in that file, the file ends there, whatever
        a later stat would say."""
        if self._state.read_file_num == self._state.write_file_num:
            self._read_end = write_pos

    def get_many(self, limit: int, holds: list[Hold] | None = None) -> list[bytes]:
        """Up to ``limit`` records, oldest first: :meth:`get_record` repeated, with the same
        positions, depth, sync counting and error handling, but the records already in the
        read buffer are taken in one loop. With held reads (held.py) each record's hold is
        appended to ``holds``."""
        st = self._state
        assert (st.holds is None) == (holds is None), "held reads come with their holds"
        records: list[bytes] = []
        while len(records) < limit:
            if self._read_buffered(records, limit - len(records), holds):
                continue
            record = self.get_record()  # opens, refills, crosses files, handles a bad record
            if record is None:
                break
            records.append(record)
            if holds is not None:
                holds.append(st.last_held)
        return records

    def _read_buffered(self, out: list[bytes], limit: int, holds: list[Hold] | None) -> int:
        """Append up to ``limit`` whole records that the read buffer holds from the read
        position on, and account for them at once (held, with their holds appended to
        ``holds``, as :meth:`_consume` holds one); 0 when the next record needs
        :meth:`_read_one` (no buffer, a refill, a bad size, or the last record of a finished
        file, which moves the reader to the next file)."""
        st = self._state
        buf = self._read_buf
        buf_start = self._read_buf_start
        offset = st.read_pos - buf_start
        if self._read_fd is None or st.closed or offset < 0:
            return 0
        stop = len(buf)
        if st.read_file_num > st.write_file_num:
            return 0  # corrupt positions: get_record() repairs them
        if st.read_file_num < st.write_file_num:
            end = self._read_end if self._read_end is not None else st.max_bytes_per_file
            # strictly before the file's end: the record reaching it is _read_one's
            stop = min(stop, end - buf_start - 1)
        first = offset
        count = 0
        low, high = st.min_msg_size, st.max_msg_size
        unpack = LENGTH.unpack_from
        append = out.append
        while count < limit and offset + 4 <= stop:
            (size,) = unpack(buf, offset)
            following = offset + 4 + size
            if size < low or size > high or following > stop:
                break
            append(buf[offset + 4 : following])
            offset = following
            count += 1
        if count:
            if holds is None or st.holds is None:
                if not st.count:
                    st.dirty_since = st.clock()
                st.count += count
            else:  # nothing the metadata records moves until the holds are released
                self._hold_run(out[-count:], buf_start + first, holds)
            st.read_pos += offset - first
            st.depth -= count
            self.recovery.check_tail_corruption(st.depth)
        return count

    def _hold_run(self, records: list[bytes], start: int, holds: list[Hold]) -> None:
        """Hold records just read in one go from offset ``start`` of the read file, each
        following the last (as :meth:`_consume` holds one); their holds go to ``holds``."""
        st = self._state
        assert st.holds is not None
        file_num = st.read_file_num
        starts: list[Position] = []
        for record in records:
            starts.append((file_num, start))
            start += 4 + len(record)
        first_hold = st.holds.add_run(starts)
        holds.extend(range(first_hold, first_hold + len(records)))
        st.last_held, st.last_start = holds[-1], starts[-1]

    def get_record(self) -> bytes | None:
        """Take the oldest record (held, with held reads), or None when the queue is empty."""
        st = self._state
        while not st.closed:
            if st.read_file_num >= st.write_file_num and st.read_pos >= st.write_pos:
                return None
            try:
                record = self._read_one()
            except (ReadError, OSError) as exc:
                st.log(
                    "ERROR",
                    f"DISKQUEUE({st.name}) reading at {st.read_pos} of "
                    f"{self._files.segment(st.read_file_num)} - {describe(exc)}",
                )
                self.recovery.handle_read_error()
                continue
            if record is None:
                self._finish_read_file()
                continue
            return record
        return None

    def _read_one(self) -> bytes | None:
        """Read the record at the read position and advance past it.

        Returns None when a finished file is exhausted exactly at a record boundary.
        """
        st = self._state
        if self._read_fd is None:
            self._open_read_file()
        pos = st.read_pos
        complete = st.read_file_num < st.write_file_num
        if complete:
            end = self._read_end if self._read_end is not None else st.max_bytes_per_file
            if pos == end:
                return None
        buf = self._read_buf
        offset = pos - self._read_buf_start
        if offset < 0 or offset + 4 > len(buf):
            buf = self._fill(pos, 4)
            offset = 0
        (size,) = LENGTH.unpack_from(buf, offset)
        if size < st.min_msg_size or size > st.max_msg_size:
            # no way of knowing where the next record starts: the file is corrupt
            raise ReadError(f"invalid message read size ({size})")
        start = offset + 4
        if start + size > len(buf):
            buf = self._fill(pos, 4 + size)
            start = 4
        record = buf[start : start + size]

        next_pos = pos + 4 + size
        if complete and next_pos >= (
            self._read_end if self._read_end is not None else st.max_bytes_per_file
        ):
            self._consume(st.read_file_num + 1, 0)
        else:
            self._consume(st.read_file_num, next_pos)
        return record

    def _open_read_file(self) -> None:
        st = self._state
        path = self._files.segment(st.read_file_num)
        fd = os.open(path, os.O_RDONLY | OPEN_FLAGS_CLOEXEC)
        st.log("INFO", f"DISKQUEUE({st.name}): readOne() opened {path}")
        self._read_fd = fd
        self._read_buf = b""
        self._read_buf_start = 0
        self._read_end = None
        if st.read_file_num < st.write_file_num:
            try:
                self._read_end = os.fstat(fd).st_size
            except OSError:
                self._read_end = st.max_bytes_per_file

    def _fill(self, pos: int, need: int) -> bytes:
        """Buffer at least ``need`` bytes of the read file from ``pos`` (or fail: EOF)."""
        st = self._state
        fd = self._read_fd
        assert fd is not None
        want = max(need, READ_CHUNK)
        if st.read_file_num == st.write_file_num:
            # never buffer past writePos: those bytes may not be ours yet
            want = max(need, min(READ_CHUNK, st.write_pos - pos))
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
            self.close_file()
            raise ReadError("EOF" if got == 0 else "unexpected EOF")
        return buf

    def _consume(self, next_file_num: int, next_pos: int) -> None:
        """Go's moveForward: the record is taken, positions and depth advance."""
        st = self._state
        old_file_num = st.read_file_num
        holds = st.holds
        if holds is not None:  # nothing the metadata records moves until it is released
            start = (old_file_num, st.read_pos)
            st.last_held = holds.add(start)
            st.last_start = start
        else:
            if not st.count:
                st.dirty_since = st.clock()
            st.count += 1
        st.read_file_num = next_file_num
        st.read_pos = next_pos
        st.depth -= 1
        if old_file_num != next_file_num:
            self.leave_file(old_file_num)
        self.recovery.check_tail_corruption(st.depth)

    def _finish_read_file(self) -> None:
        """A finished file ended exactly at the read position: move on without a record."""
        st = self._state
        old_file_num = st.read_file_num
        st.read_file_num += 1
        st.read_pos = 0
        self.leave_file(old_file_num)
        self.recovery.check_tail_corruption(st.depth)

    def leave_file(self, old_file_num: int) -> None:
        st = self._state
        self.close_file()
        if st.holds is not None:  # deleted once the committed position leaves it
            self._syncer.drop_finished_files()
            return
        # deleted by the sync that persists metadata past it
        self._syncer.doom(self._files.segment(old_file_num))
        self._syncer.request_sync()

    def peek(self, limit: int) -> Iterator[bytes]:
        """Up to ``limit`` records from the read cursor on, read from the files on their own:
        nothing of the queue moves (no position, buffer, depth or sync count). A record that
        is incomplete or has a bad size ends the peek (the reader will report it)."""
        st = self._state
        if limit <= 0 or st.depth <= 0:
            return
        file_num, offset = st.read_file_num, st.read_pos
        write_file_num, write_pos = st.write_file_num, st.write_pos
        produced = 0
        while produced < limit and file_num <= write_file_num:
            end = write_pos if file_num == write_file_num else None
            try:
                fd = os.open(self._files.segment(file_num), os.O_RDONLY | OPEN_FLAGS_CLOEXEC)
            except FileNotFoundError:
                fd = -1  # consumed and removed meanwhile: go on with the next file
            if fd >= 0:
                try:
                    for record in self._peek_file(fd, offset, end):
                        yield record
                        produced += 1
                        if produced >= limit:
                            return
                finally:
                    os.close(fd)
            file_num += 1
            offset = 0

    def _peek_file(self, fd: int, offset: int, end: int | None) -> Iterator[bytes]:
        st = self._state
        if end is None:
            end = os.fstat(fd).st_size
        while offset + 4 <= end:
            header = os.pread(fd, 4, offset)
            if len(header) < 4:
                return
            (size,) = LENGTH.unpack(header)
            if size < st.min_msg_size or size > st.max_msg_size or offset + 4 + size > end:
                return
            yield os.pread(fd, size, offset + 4)
            offset += 4 + size
