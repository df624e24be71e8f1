"""Reading a disk queue: records in order, held reads (holds.py) and a
read-only peek."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence

from .files import (
    _LENGTH,
    _OPEN_FLAGS_CLOEXEC,
    _READ_CHUNK,
    _describe,
    _ReadError,
)
from .holds import (
    BOUNDARY_BYTES,
    HEAD_MOVED,
    NO_HOLD,
    Hold,
    ReadHolds,
    SkipPlan,
    decode_held,
)
from .recovery import _Recovery


class _Reading(_Recovery):
    __slots__ = ()

    def get(self) -> bytes | None:
        """Remove and return the oldest record, or None when the queue is empty. With
        ``hold_reads`` the record is taken for good (not held): e.g. dropped by a policy."""
        record = self._get()
        if record is not None and self._holds is not None:
            self.release(self._last_held)
        return record

    def get_many(self, limit: int) -> list[bytes]:
        """Up to ``limit`` records, oldest first: :meth:`get` repeated, with the same
        positions, depth, sync counting and error handling, but the records already in the
        read buffer are taken in one loop. Not for ``hold_reads`` (use :meth:`get_held`)."""
        assert self._holds is None, "get_many() reads without holds"
        records: list[bytes] = []
        while len(records) < limit:
            if self._read_buffered(records, limit - len(records)):
                continue
            record = self._get()  # opens, refills, crosses files, handles a bad record
            if record is None:
                break
            records.append(record)
        return records

    def _read_buffered(self, out: list[bytes], limit: int) -> int:
        """Append up to ``limit`` whole records that the read buffer holds from the read
        position on, and account for them at once; 0 when the next record needs
        :meth:`_read_one` (no buffer, a refill, a bad size, or the last record of a finished
        file, which moves the reader to the next file)."""
        buf = self._read_buf
        buf_start = self._read_buf_start
        offset = self._read_pos - buf_start
        if self._read_fd is None or self._closed or offset < 0:
            return 0
        stop = len(buf)
        if self._read_file_num > self._write_file_num:
            return 0  # corrupt positions: _get() repairs them
        if self._read_file_num < self._write_file_num:
            end = self._read_end if self._read_end is not None else self._max_bytes_per_file
            # strictly before the file's end: the record reaching it is _read_one's
            stop = min(stop, end - buf_start - 1)
        first = offset
        count = 0
        low, high = self._min_msg_size, self._max_msg_size
        unpack = _LENGTH.unpack_from
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
            if not self._count:
                self._dirty_since = time.monotonic()
            self._count += count
            self._read_pos += offset - first
            self._depth -= count
            self._check_tail_corruption(self._depth)
        return count

    def _get(self) -> bytes | None:
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
        holds = self._holds
        if holds is not None:  # nothing the metadata records moves until it is released
            start = (old_file_num, self._read_pos)
            self._last_held = holds.add(start)
            self._last_start = start
        else:
            if not self._count:
                self._dirty_since = time.monotonic()
            self._count += 1
        self._read_file_num = next_file_num
        self._read_pos = next_pos
        self._depth -= 1
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
        if self._holds is not None:  # deleted once the committed position leaves it
            self._drop_finished_files()
            return
        # deleted by the sync that persists metadata past it
        self._doomed_paths.append(self.file_name(old_file_num))
        self._request_sync()

    def peek(self, limit: int) -> Iterator[bytes]:
        """Up to ``limit`` records from the read cursor on, read from the files on their own:
        nothing of the queue moves (no position, buffer, depth or sync count). A record that
        is incomplete or has a bad size ends the peek (the reader will report it)."""
        if limit <= 0 or self._depth <= 0:
            return
        file_num, offset = self._read_file_num, self._read_pos
        write_file_num, write_pos = self._write_file_num, self._write_pos
        produced = 0
        while produced < limit and file_num <= write_file_num:
            end = write_pos if file_num == write_file_num else None
            try:
                fd = os.open(self.file_name(file_num), os.O_RDONLY | _OPEN_FLAGS_CLOEXEC)
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
        if end is None:
            end = os.fstat(fd).st_size
        while offset + 4 <= end:
            header = os.pread(fd, 4, offset)
            if len(header) < 4:
                return
            (size,) = _LENGTH.unpack(header)
            if size < self._min_msg_size or size > self._max_msg_size or offset + 4 + size > end:
                return
            yield os.pread(fd, size, offset + 4)
            offset += 4 + size

    def hold_reads(self) -> None:
        """From now on the metadata records the committed read position: the start of the
        oldest record handed out by ``get_held``/``put_held`` and not yet ``release``d."""
        if self._holds is None:
            self._holds = ReadHolds()
            self._committed_file = self._read_file_num
            self._skip_plan = self._load_held_file()

    def get_held(self) -> tuple[bytes, Hold] | None:
        """``get``, and the hold that keeps the record on disk until it is released; skips
        the records the side file says were finished before a restart."""
        holds = self._holds
        assert holds is not None, "get_held() needs hold_reads()"
        while True:
            record = self._get()
            if record is None:
                return None
            self._last_record = record
            hold = self._last_held  # set by _consume
            plan = self._skip_plan
            if plan is not None:
                start = self._last_start
                if start >= plan.cursor:
                    self._skip_plan = None
                elif start not in plan.unfinished:
                    self.release(hold)
                    continue
            return record, hold

    def _load_held_file(self) -> SkipPlan | None:
        try:
            with open(self.held_file_name(), "rb") as side:
                data = side.read()
        except OSError:
            return None
        plan = decode_held(data)
        committed = (self._read_file_num, self._read_pos)
        if plan is None or plan.cursor <= committed or not self._boundary_found(plan):
            return None  # nothing it could skip, or it describes other records
        self._log(
            "INFO",
            f"DISKQUEUE({self._name}): {len(plan.unfinished)} unfinished records between "
            f"{committed} and {plan.cursor}; the others there were finished",
        )
        return plan

    def _boundary_found(self, plan: SkipPlan) -> bool:
        """The side file's boundary record is on disk where it says, byte for byte."""
        file_num, pos = plan.boundary
        if (file_num, pos) >= plan.cursor or plan.cursor > (self._write_file_num, self._write_pos):
            return False
        try:
            fd = os.open(self.file_name(file_num), os.O_RDONLY | _OPEN_FLAGS_CLOEXEC)
            try:
                found = os.pread(fd, 4 + BOUNDARY_BYTES, pos)
            finally:
                os.close(fd)
        except OSError:
            return False
        if len(found) < 4:
            return False
        (size,) = _LENGTH.unpack_from(found)
        expected = min(size, BOUNDARY_BYTES)
        return (
            expected == len(plan.boundary_bytes) and found[4 : 4 + expected] == plan.boundary_bytes
        )

    def release(self, hold: Hold) -> None:
        """The held record's message is finished (or stored again as a newer record)."""
        self.release_many((hold,))

    def release_many(self, held: Sequence[Hold]) -> None:
        """:meth:`release` for several (a batch of FINs)."""
        holds = self._holds
        if holds is None:
            return
        release = holds.release
        count = 0
        moved = False
        for hold in held:
            released = release(hold)
            if released:
                count += 1
                moved = moved or released == HEAD_MOVED
        if not count:
            return
        # every release counts toward a sync, so the side file soon knows it is finished
        if not self._count:
            self._dirty_since = time.monotonic()
        self._count += count
        if moved:
            oldest = holds.oldest()
            if (oldest[0] if oldest is not None else self._read_file_num) > self._committed_file:
                self._drop_finished_files()

    def held(self) -> tuple[int, Hold]:
        """How many records the committed position keeps (finished ones after an unfinished
        one included), and the hold of the oldest (NO_HOLD if none)."""
        holds = self._holds
        return (len(holds), holds.oldest_hold()) if holds is not None else (0, NO_HOLD)

    def release_all(self) -> None:
        """Every held message is stored again (a clean shutdown flushed them to the tail)."""
        holds = self._holds
        if holds is not None and len(holds):
            holds.clear()
            self._count += 1
            self._drop_finished_files()
