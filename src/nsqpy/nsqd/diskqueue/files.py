"""Disk queue files: the record and metadata formats, errors, small file helpers."""

from __future__ import annotations

import contextlib
import os
import re
import struct
from collections.abc import Callable
from typing import NamedTuple

from .holds import HELD_FILE_SUFFIX

LogFunc = Callable[[str, str], None]

# go-diskqueue reads the length as a signed int32; negative lengths fail the minimum check.
LENGTH = struct.Struct(">i")
READ_CHUNK = 32 * 1024  # small: nsqd may have thousands of queues with a backlog
COUNT_BUFFER = 1 << 20
# a failed sync is retried after this delay, doubled per failure up to the maximum
RETRY_FIRST = 0.1
RETRY_MAX = 5.0
OPEN_FLAGS_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Go parses the metadata with fmt.Fscanf("%d\n%d,%d\n%d,%d\n"): numbers may carry a sign and
# leading blanks; we also accept a missing final newline.
_NUMBER = rb"[ \t]*([+-]?\d+)"
META_PATTERN = re.compile(
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


class ReadError(Exception):
    """The record at the read position cannot be read: the file is treated as corrupt."""


#: the name of a queue's metadata or data file (``.bad`` files, renamed after corruption, are not)
_QUEUE_FILE = re.compile(r"(?P<name>.+)\.diskqueue\.(?:meta|\d{6})\.dat")


def queue_names(data_path: str) -> set[str]:
    """The names of every disk queue with a metadata or data file in ``data_path``."""
    return {m["name"] for m in map(_QUEUE_FILE.fullmatch, os.listdir(data_path)) if m}


def fsync_path(path: str) -> None:
    # fdatasync: the appended data and the file size reach the disk; only timestamps do not
    # (a third cheaper than fsync on this kind of disk, and as safe for an append-only file)
    fd = os.open(path, os.O_RDONLY | OPEN_FLAGS_CLOEXEC)
    try:
        _datasync(fd)
    finally:
        os.close(fd)


_datasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


def close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def describe(exc: BaseException) -> str:
    """Error text in the spirit of Go's: ``open <path>: no such file or directory``."""
    if isinstance(exc, OSError) and exc.strerror:
        target = f"{exc.filename}: " if exc.filename else ""
        return f"{target}{exc.strerror.lower()}"
    return str(exc)


class QueueFiles:
    """Where one queue's files are: data segments numbered from 0, the metadata, the side
    file of held reads (holds.py)."""

    __slots__ = ("data_path", "held_path", "meta_path", "name")

    def __init__(self, name: str, data_path: str) -> None:
        self.name = name
        self.data_path = data_path
        self.meta_path = os.path.join(data_path, f"{name}.diskqueue.meta.dat")
        self.held_path = os.path.join(data_path, name + HELD_FILE_SUFFIX)

    def segment(self, file_num: int) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.{file_num:06d}.dat")
