"""Start-up salvage and repair: the metadata read back, missing or grown files, tail checks,
unreadable files renamed .bad."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .files import (
    COUNT_BUFFER,
    LENGTH,
    META_PATTERN,
    QueueFiles,
    describe,
    remove_quietly,
)
from .holds import (
    NO_HOLD,
)
from .state import QueueState
from .syncing import Syncer

if TYPE_CHECKING:
    from .reading import Reader
    from .writing import Writer


class Recovery:
    """Brings a queue's state in line with its files: at start-up (the metadata read back,
    missing or grown files), when the reader catches up (the tail checks) and when a file
    cannot be read (renamed .bad)."""

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

    def start(self) -> None:
        """Read the metadata back and reconcile it with the files found (Go's start-up, and
        the salvage described in the package docstring)."""
        st = self._state
        self._retrieve_metadata()
        self._skip_missing_read_files()
        self._salvage_unrecorded_writes()
        self.check_tail_corruption(st.depth)

    def check_tail_corruption(self, depth: int) -> None:
        """When the reader has caught up, depth must be 0 and positions must be equal."""
        st = self._state
        if st.read_file_num < st.write_file_num or st.read_pos < st.write_pos:
            return
        if depth != 0:
            if depth < 0:
                st.log(
                    "ERROR",
                    f"DISKQUEUE({st.name}) negative depth at tail ({depth}), "
                    "metadata corruption, resetting 0...",
                )
            else:
                st.log(
                    "ERROR",
                    f"DISKQUEUE({st.name}) positive depth at tail ({depth}), "
                    "data loss, resetting 0...",
                )
            st.depth = 0
            self._syncer.request_sync()
        if st.read_file_num != st.write_file_num or st.read_pos != st.write_pos:
            if st.read_file_num > st.write_file_num:
                st.log(
                    "ERROR",
                    f"DISKQUEUE({st.name}) readFileNum > writeFileNum "
                    f"({st.read_file_num} > {st.write_file_num}), corruption, "
                    "skipping to next writeFileNum and resetting 0...",
                )
            if st.read_pos > st.write_pos:
                st.log(
                    "ERROR",
                    f"DISKQUEUE({st.name}) readPos > writePos "
                    f"({st.read_pos} > {st.write_pos}), corruption, "
                    "skipping to next writeFileNum and resetting 0...",
                )
            self.skip_to_next_rw_file()
            self._syncer.request_sync()

    def skip_to_next_rw_file(self) -> OSError | None:
        """Delete readFileNum..writeFileNum and start both sides on a fresh file."""
        st = self._state
        self._reader.close_file()
        self._writer.close_file()
        failure: OSError | None = None
        # with hold_reads, the files of held records before the cursor go too
        first = st.read_file_num if st.holds is None else st.committed_file
        for file_num in range(first, st.write_file_num + 1):
            path = self._files.segment(file_num)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                st.log(
                    "ERROR",
                    f"DISKQUEUE({st.name}) failed to remove data file - {describe(exc)}",
                )
                failure = exc
        st.write_file_num += 1
        st.write_pos = 0
        st.read_file_num = st.write_file_num
        st.read_pos = 0
        st.depth = 0
        if st.holds is not None:
            st.holds.clear()
            st.committed_file = st.read_file_num
            st.skip_plan = None
            st.last_held = NO_HOLD
            st.last_record = None
        remove_quietly(self._files.held_path)
        return failure

    def _retrieve_metadata(self) -> None:
        st = self._state
        try:
            with open(self._files.meta_path, "rb") as meta:
                text = meta.read()
        except FileNotFoundError:
            return  # a new queue
        except OSError as exc:
            st.log(
                "ERROR",
                f"DISKQUEUE({st.name}) failed to retrieveMetaData - {describe(exc)}",
            )
            return
        match = META_PATTERN.match(text)
        if match is None:
            st.log(
                "ERROR",
                f"DISKQUEUE({st.name}) failed to retrieveMetaData - "
                f"unparsable metadata {text[:100]!r}",
            )
            return
        depth, read_num, read_pos, write_num, write_pos = (int(g) for g in match.groups())
        st.depth = depth
        st.read_file_num = read_num
        st.read_pos = read_pos
        st.write_file_num = write_num
        st.write_pos = write_pos

    def _skip_missing_read_files(self) -> None:
        """A read position in a file that is gone: continue at the next file that exists.

        This queue deletes a finished file before its metadata is written when the metadata
        cannot be written (a full disk); a crash then leaves the recorded read position in that
        deleted file. Go's own queue deletes first and syncs after, so its data directories can
        show the same. The depth is recounted from the files, as the recorded one still counts
        the records of the deleted file.
        """
        st = self._state
        if st.read_file_num >= st.write_file_num:
            return  # the write file itself: get() handles a missing one as corruption
        if os.path.exists(self._files.segment(st.read_file_num)):
            return
        missing = st.read_file_num
        resume = missing + 1
        while resume < st.write_file_num and not os.path.exists(self._files.segment(resume)):
            resume += 1
        depth = 0
        for file_num in range(resume, st.write_file_num + 1):
            end = st.write_pos if file_num == st.write_file_num else None
            depth += self._count_records(self._files.segment(file_num), 0, end)
        st.log(
            "WARN",
            f"DISKQUEUE({st.name}) read file {self._files.segment(missing)} is gone (finished "
            f"before the metadata could record it), continuing at file {resume}, "
            f"depth {st.depth} -> {depth}",
        )
        st.read_file_num = resume
        st.read_pos = 0
        st.depth = depth
        self._syncer.request_sync()

    def _salvage_unrecorded_writes(self) -> None:
        """Handle data written after the last metadata sync (a crash, or a kill).

        Go's rule: a write file longer than writePos makes writing skip to the next file, and the
        reader salvages the old file up to its real size. Here the writer also skips any data
        files after writeFileNum, and the records found beyond writePos are added to the depth.
        """
        st = self._state
        write_path = self._files.segment(st.write_file_num)
        try:
            size: int | None = os.stat(write_path).st_size
        except OSError:
            size = None
        grown = size is not None and size > st.write_pos
        if grown:
            st.log(
                "WARN",
                f"DISKQUEUE({st.name}) {write_path} metadata writePos {st.write_pos} "
                f"< file size of {size}, skipping to new file",
            )
        first_free = st.write_file_num + 1
        while os.path.exists(self._files.segment(first_free)):
            first_free += 1
        extra_files = range(st.write_file_num + 1, first_free)
        if extra_files:
            st.log(
                "WARN",
                f"DISKQUEUE({st.name}) data files {self._files.segment(extra_files[0])} to "
                f"{self._files.segment(extra_files[-1])} are newer than the metadata, "
                f"skipping to file {first_free}",
            )
        if not grown and not extra_files:
            return
        found = self._count_records(write_path, st.write_pos) if grown else 0
        for file_num in extra_files:
            found += self._count_records(self._files.segment(file_num), 0)
        if found:
            st.log(
                "WARN",
                f"DISKQUEUE({st.name}) found {found} records written after the last "
                f"metadata sync, depth {st.depth} -> {st.depth + found}",
            )
            st.depth += found
        st.write_file_num = first_free
        st.write_pos = 0
        self._syncer.request_sync()

    def _count_records(self, path: str, start: int, end: int | None = None) -> int:
        """Count the well-formed records in a file from ``start`` up to the first bad one
        (or up to ``end``)."""
        st = self._state
        count = 0
        try:
            data_file = open(path, "rb", buffering=COUNT_BUFFER)  # noqa: SIM115
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
                (length,) = LENGTH.unpack(header)
                if length < st.min_msg_size or length > st.max_msg_size:
                    break
                if pos + 4 + length > size:
                    break
                data_file.seek(length, os.SEEK_CUR)
                pos += 4 + length
                count += 1
        return count

    def handle_read_error(self) -> None:
        """Rename the unreadable file to .bad and carry on with the next file number."""
        st = self._state
        if st.read_file_num == st.write_file_num:
            # the write file itself is broken: never append to it again
            self._writer.close_file()
            st.write_file_num += 1
            st.write_pos = 0
        self._reader.close_file()
        bad_path = self._files.segment(st.read_file_num)
        bad_rename = bad_path + ".bad"
        st.log(
            "WARN",
            f"DISKQUEUE({st.name}) jump to next file and saving bad file as {bad_rename}",
        )
        try:
            os.rename(bad_path, bad_rename)
        except OSError:
            st.log(
                "ERROR",
                f"DISKQUEUE({st.name}) failed to rename bad diskqueue file "
                f"{bad_path} to {bad_rename}",
            )
        st.read_file_num += 1
        st.read_pos = 0
        self._syncer.request_sync()
        if st.holds is not None:
            self._syncer.drop_finished_files()
        self.check_tail_corruption(st.depth)
