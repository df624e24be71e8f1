"""Start-up salvage and repair: the metadata read back, missing or grown files, tail checks,
unreadable files renamed .bad."""

from __future__ import annotations

import os

from .files import (
    _COUNT_BUFFER,
    _LENGTH,
    _META_PATTERN,
    _close_quietly,
    _describe,
    _remove_quietly,
)
from .holds import (
    NO_HOLD,
)
from .syncing import _Syncing


class _Recovery(_Syncing):
    __slots__ = ()

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
        # with hold_reads, the files of held records before the cursor go too
        first = self._read_file_num if self._holds is None else self._committed_file
        for file_num in range(first, self._write_file_num + 1):
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
        if self._holds is not None:
            self._holds.clear()
            self._committed_file = self._read_file_num
            self._skip_plan = None
            self._last_held = NO_HOLD
            self._last_record = None
        _remove_quietly(self.held_file_name())
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
        if self._holds is not None:
            self._drop_finished_files()
        self._check_tail_corruption(self._depth)
