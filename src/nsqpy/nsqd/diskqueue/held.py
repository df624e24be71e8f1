"""Held reads: records handed out but kept on disk until their messages are finished.

After :meth:`HeldReads.hold_reads` the metadata records the committed read position (the
bookkeeping and the side file's format are in holds.py); here are the reads, the writes
handed out at once, the releases, and the side file read back at start-up.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .files import LENGTH, OPEN_FLAGS_CLOEXEC, QueueFiles
from .holds import (
    BOUNDARY_BYTES,
    HEAD_MOVED,
    NO_HOLD,
    Hold,
    ReadHolds,
    SkipPlan,
    decode_held,
)
from .reading import Reader
from .state import QueueState
from .syncing import Syncer
from .writing import Writer


class HeldReads:
    """The held-read operations of one queue (its reader, writer and syncer do the I/O)."""

    __slots__ = ("_files", "_reader", "_state", "_syncer", "_writer")

    def __init__(
        self,
        state: QueueState,
        files: QueueFiles,
        syncer: Syncer,
        reader: Reader,
        writer: Writer,
    ) -> None:
        self._state = state
        self._files = files
        self._syncer = syncer
        self._reader = reader
        self._writer = writer

    def hold_reads(self) -> None:
        """From now on the metadata records the committed read position: the start of the
        oldest record handed out by ``get_held``/``put_held`` and not yet ``release``d."""
        st = self._state
        if st.holds is None:
            st.holds = ReadHolds()
            st.committed_file = st.read_file_num
            st.skip_plan = self._load_held_file()

    def get_held(self) -> tuple[bytes, Hold] | None:
        """``get``, and the hold that keeps the record on disk until it is released; skips
        the records the side file says were finished before a restart."""
        st = self._state
        holds = st.holds
        assert holds is not None, "get_held() needs hold_reads()"
        while True:
            record = self._reader.get_record()
            if record is None:
                return None
            st.last_record = record
            hold = st.last_held  # set by the reader
            plan = st.skip_plan
            if plan is not None:
                start = st.last_start
                if start >= plan.cursor:
                    st.skip_plan = None
                elif start not in plan.unfinished:
                    self.release(hold)
                    continue
            return record, hold

    def get_many_held(self, limit: int) -> tuple[list[bytes], list[Hold]]:
        """:meth:`get_held` for up to ``limit`` records: the records and their holds, in
        order, those the read buffer holds taken in one loop (``Reader.get_many``)."""
        st = self._state
        assert st.holds is not None, "get_many_held() needs hold_reads()"
        records: list[bytes] = []
        holds: list[Hold] = []
        if st.skip_plan is not None:  # the side file decides, record by record
            while len(records) < limit and (got := self.get_held()) is not None:
                records.append(got[0])
                holds.append(got[1])
            return records, holds
        records = self._reader.get_many(limit, holds)
        if records:
            st.last_record = records[-1]
        return records, holds

    def _load_held_file(self) -> SkipPlan | None:
        st = self._state
        try:
            with open(self._files.held_path, "rb") as side:
                data = side.read()
        except OSError:
            return None
        plan = decode_held(data)
        committed = (st.read_file_num, st.read_pos)
        if plan is None or plan.cursor <= committed or not self._boundary_found(plan):
            return None  # nothing it could skip, or it describes other records
        st.log(
            "INFO",
            f"DISKQUEUE({st.name}): {len(plan.unfinished)} unfinished records between "
            f"{committed} and {plan.cursor}; the others there were finished",
        )
        return plan

    def _boundary_found(self, plan: SkipPlan) -> bool:
        """The side file's boundary record is on disk where it says, byte for byte."""
        st = self._state
        file_num, pos = plan.boundary
        if (file_num, pos) >= plan.cursor or plan.cursor > (st.write_file_num, st.write_pos):
            return False
        try:
            fd = os.open(self._files.segment(file_num), os.O_RDONLY | OPEN_FLAGS_CLOEXEC)
            try:
                found = os.pread(fd, 4 + BOUNDARY_BYTES, pos)
            finally:
                os.close(fd)
        except OSError:
            return False
        if len(found) < 4:
            return False
        (size,) = LENGTH.unpack_from(found)
        expected = min(size, BOUNDARY_BYTES)
        return (
            expected == len(plan.boundary_bytes) and found[4 : 4 + expected] == plan.boundary_bytes
        )

    def put_held(self, data: bytes) -> Hold | None:
        """Append a record that is handed out at once, when nothing waits before it (the
        cursor is at the write position); None, writing nothing, when records wait."""
        st = self._state
        holds = st.holds
        if holds is None or (st.read_file_num, st.read_pos) != (
            st.write_file_num,
            st.write_pos,
        ):
            return None
        self._writer.put(data)
        start = (st.write_file_num, st.write_pos - 4 - len(data))
        hold = holds.add(start)
        st.last_held, st.last_start, st.last_record = hold, start, data
        old_file_num = st.read_file_num
        st.read_file_num = st.write_file_num
        st.read_pos = st.write_pos
        st.depth -= 1
        if old_file_num != st.read_file_num:  # the put rolled to a new file
            self._reader.leave_file(old_file_num)
        return hold

    def release(self, hold: Hold) -> None:
        """The held record's message is finished (or stored again as a newer record)."""
        self.release_many((hold,))

    def release_many(self, held: Sequence[Hold]) -> None:
        """:meth:`release` for several (a batch of FINs)."""
        st = self._state
        holds = st.holds
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
        if not st.count:
            st.dirty_since = st.clock()
        st.count += count
        if moved:
            oldest = holds.oldest()
            if (oldest[0] if oldest is not None else st.read_file_num) > st.committed_file:
                self._syncer.drop_finished_files()

    def held(self) -> tuple[int, Hold]:
        """How many records the committed position keeps (finished ones after an unfinished
        one included), and the hold of the oldest (NO_HOLD if none)."""
        st = self._state
        holds = st.holds
        return (len(holds), holds.oldest_hold()) if holds is not None else (0, NO_HOLD)

    def release_all(self) -> None:
        """Every held message is stored again (a clean shutdown flushed them to the tail)."""
        st = self._state
        holds = st.holds
        if holds is not None and len(holds):
            holds.clear()
            st.count += 1
            self._syncer.drop_finished_files()
