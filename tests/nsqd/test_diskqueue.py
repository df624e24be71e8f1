"""DiskQueue: go-diskqueue v1.1.0 behaviour and files, on real files in a temporary directory.

The format helpers below are written from go-diskqueue's format, not from the module under test,
so the byte-level tests check one against the other: ``<name>.diskqueue.NNNNNN.dat`` files of
``BE32(len) payload`` records, and a text metadata file ``<name>.diskqueue.meta.dat`` holding
``depth\nreadFileNum,readPos\nwriteFileNum,writePos\n``.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqpy.nsqd.diskqueue import DiskQueue, DiskQueueError

from ..raw_v2 import wait_until_async

# nsqd's sizes: minMsgSize = 8 + 2 + 16, maxMsgSize = --max-msg-size + 26
NSQD_MIN = 26
NSQD_MAX = 1024 * 1024 + 26


# ------------------------------------------------------------------ independent format helpers


def data_file(directory: Path, name: str, num: int) -> Path:
    return directory / f"{name}.diskqueue.{num:06d}.dat"


def meta_file(directory: Path, name: str) -> Path:
    return directory / f"{name}.diskqueue.meta.dat"


def frame(record: bytes) -> bytes:
    return struct.pack(">I", len(record)) + record


def nsqd_message(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    assert len(msg_id) == 16
    return struct.pack(">QH", timestamp, attempts) + msg_id + body


def parse_data_file(path: Path) -> list[bytes]:
    """Split a data file into records; it must end exactly on a record boundary."""
    data = path.read_bytes()
    records = []
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        assert pos + 4 + length <= len(data), f"truncated record at {pos} in {path}"
        records.append(data[pos + 4 : pos + 4 + length])
        pos += 4 + length
    return records


def read_meta(directory: Path, name: str) -> tuple[int, int, int, int, int]:
    text = meta_file(directory, name).read_text()
    match = re.fullmatch(r"(-?\d+)\n(\d+),(\d+)\n(\d+),(\d+)\n", text)
    assert match is not None, repr(text)
    depth, read_num, read_pos, write_num, write_pos = (int(g) for g in match.groups())
    return depth, read_num, read_pos, write_num, write_pos


def write_meta(directory: Path, name: str, depth: int, rnum: int, rpos: int, wnum: int, wpos: int):
    meta_file(directory, name).write_text(f"{depth}\n{rnum},{rpos}\n{wnum},{wpos}\n")


def data_file_numbers(directory: Path, name: str) -> list[int]:
    pattern = re.compile(re.escape(name) + r"\.diskqueue\.(\d{6})\.dat")
    return sorted(
        int(m.group(1)) for p in directory.iterdir() if (m := pattern.fullmatch(p.name)) is not None
    )


# ------------------------------------------------------------------------------- fixtures


class LogRecorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __call__(self, level: str, message: str) -> None:
        assert level in ("DEBUG", "INFO", "WARN", "ERROR")
        self.lines.append((level, message))

    def at(self, level: str) -> list[str]:
        return [message for lvl, message in self.lines if lvl == level]


def open_queue(
    directory: Path,
    log: Callable[[str, str], None],
    name: str = "q",
    max_bytes: int = 1024,
    min_size: int = 0,
    max_size: int = 1 << 10,
    sync_every: int = 2500,
    sync_timeout: float = 2.0,
) -> DiskQueue:
    return DiskQueue(
        name, str(directory), max_bytes, min_size, max_size, sync_every, sync_timeout, log
    )


@pytest.fixture
def log() -> LogRecorder:
    return LogRecorder()


def drain(queue: DiskQueue) -> list[bytes]:
    out = []
    while (record := queue.get()) is not None:
        out.append(record)
    return out


def snapshot_dir(source: Path, target: Path) -> None:
    """What a kill -9 leaves behind: the files as the kernel has them right now."""
    target.mkdir()
    for path in source.iterdir():
        shutil.copy2(path, target / path.name)


# ---------------------------------------------------------------------------- basic behaviour


def test_put_get_depth(tmp_path: Path, log: LogRecorder) -> None:
    queue = open_queue(tmp_path, log)
    assert queue.depth() == 0
    assert queue.get() is None
    queue.put(b"test")
    assert queue.depth() == 1
    assert queue.get() == b"test"
    assert queue.depth() == 0
    assert queue.get() is None
    queue.close()


def test_write_size_bounds_use_go_error_text(tmp_path: Path, log: LogRecorder) -> None:
    queue = open_queue(tmp_path, log, min_size=10, max_size=20)
    with pytest.raises(DiskQueueError, match=r"^invalid message write size \(9\) "):
        queue.put(b"x" * 9)
    with pytest.raises(DiskQueueError) as info:
        queue.put(b"x" * 21)
    assert str(info.value) == "invalid message write size (21) minMsgSize=10 maxMsgSize=20"
    # a batch with one bad record stores nothing
    with pytest.raises(DiskQueueError):
        queue.put_many([b"y" * 10, b"y" * 30])
    assert queue.depth() == 0
    queue.put(b"x" * 10)
    queue.put(b"x" * 20)
    assert drain(queue) == [b"x" * 10, b"x" * 20]
    queue.close()
    assert read_meta(tmp_path, "q") == (0, 0, 38, 0, 38)


def test_framed_records_too_big_are_left_to_put_many(tmp_path: Path, log: LogRecorder) -> None:
    """A framed batch is written whole only if its largest record is one put_many takes:
    otherwise nothing is written, and put_many refuses it with the size error (a record
    over the maximum would be read back as corruption)."""
    queue = open_queue(tmp_path, log, min_size=1, max_size=20)
    framed = b"".join(struct.pack(">I", len(r)) + r for r in (b"a" * 20, b"b" * 21))
    assert queue.put_framed(framed, 2, 21) is False
    assert queue.depth() == 0
    assert queue.put_framed(framed[: 4 + 20], 1, 20) is True
    assert drain(queue) == [b"a" * 20]
    queue.close()


def test_roll_like_go(tmp_path: Path, log: LogRecorder) -> None:
    """Go's TestDiskQueueRoll: the 11th record of 14 bytes starts file 1."""
    msg = bytes([1, 2, 3, 4, 5, 6, 7, 8, 9, 0])
    queue = open_queue(tmp_path, log, max_bytes=10 * (len(msg) + 4), min_size=len(msg))
    for i in range(11):
        queue.put(msg)
        assert queue.depth() == i + 1
    positions = queue.positions()
    assert (positions.write_file_num, positions.write_pos) == (1, len(msg) + 4)
    assert data_file(tmp_path, "q", 0).stat().st_size == 140
    assert data_file(tmp_path, "q", 1).stat().st_size == 14
    for i in range(11, 0, -1):
        assert queue.get() == msg
        assert queue.depth() == i - 1
    queue.close()


def test_rotation_across_files_and_deletion_after_consumption(
    tmp_path: Path, log: LogRecorder
) -> None:
    records = [bytes([i]) * 200 for i in range(20)]
    queue = open_queue(tmp_path, log, max_bytes=1000, min_size=200, max_size=200)
    for record in records:
        queue.put(record)
    # 4 records of 204 bytes fit in 1000; the 5th would make 1020
    assert data_file_numbers(tmp_path, "q") == [0, 1, 2, 3, 4]
    assert all(data_file(tmp_path, "q", n).stat().st_size == 816 for n in range(5))

    assert [queue.get() for _ in range(9)] == records[:9]
    assert queue.positions()[1:3] == (2, 204)
    # finished files are only removed once metadata that no longer names them is on disk
    assert data_file_numbers(tmp_path, "q") == [0, 1, 2, 3, 4]
    queue.close()
    assert data_file_numbers(tmp_path, "q") == [2, 3, 4]
    assert read_meta(tmp_path, "q") == (11, 2, 204, 4, 816)

    queue = open_queue(tmp_path, log, max_bytes=1000, min_size=200, max_size=200)
    assert drain(queue) == records[9:]
    queue.close()
    assert data_file_numbers(tmp_path, "q") == [4]
    assert read_meta(tmp_path, "q") == (0, 4, 816, 4, 816)
    assert not list(tmp_path.glob("*.bad"))
    assert not list(tmp_path.glob("*.tmp"))


def test_put_many_writes_the_same_bytes_as_put(tmp_path: Path, log: LogRecorder) -> None:
    records = [bytes([i % 251]) * (30 + (i * 37) % 170) for i in range(300)]
    one, batch = tmp_path / "one", tmp_path / "batch"
    one.mkdir()
    batch.mkdir()
    single = open_queue(one, log, max_bytes=2000)
    for record in records:
        single.put(record)
    batched = open_queue(batch, log, max_bytes=2000)
    batched.put_many(records[:7])
    batched.put_many(records[7:250])
    batched.put_many([])
    batched.put_many(records[250:])
    assert batched.positions() == single.positions()
    single.close()
    batched.close()
    numbers = data_file_numbers(one, "q")
    assert len(numbers) > 10
    assert numbers == data_file_numbers(batch, "q")
    for n in numbers:
        assert data_file(one, "q", n).read_bytes() == data_file(batch, "q", n).read_bytes()
    assert meta_file(one, "q").read_bytes() == meta_file(batch, "q").read_bytes()


def test_record_larger_than_file_limit_gets_its_own_file(tmp_path: Path, log: LogRecorder) -> None:
    queue = open_queue(tmp_path, log, max_bytes=100)
    queue.put_many([b"a" * 10, b"b" * 300, b"c" * 10])
    assert [data_file(tmp_path, "q", n).stat().st_size for n in range(3)] == [14, 304, 14]
    assert drain(queue) == [b"a" * 10, b"b" * 300, b"c" * 10]
    queue.close()


def test_empty_like_go(tmp_path: Path, log: LogRecorder) -> None:
    """Go's TestDiskQueueEmpty."""
    msg = bytes(10)
    queue = open_queue(tmp_path, log, max_bytes=100)
    for i in range(100):
        queue.put(msg)
        assert queue.depth() == i + 1
    for _ in range(3):
        assert queue.get() == msg
    assert queue.depth() == 97
    last_file = queue.positions().write_file_num
    asyncio.run(queue.sync())
    assert meta_file(tmp_path, "q").exists()

    queue.empty()
    assert not meta_file(tmp_path, "q").exists()
    assert data_file_numbers(tmp_path, "q") == []
    assert queue.positions() == (0, last_file + 1, 0, last_file + 1, 0)
    assert ("INFO", "DISKQUEUE(q): emptying") in log.lines

    for i in range(100):
        queue.put(msg)
        assert queue.depth() == i + 1
    assert drain(queue) == [msg] * 100
    positions = queue.positions()
    assert positions.depth == 0
    assert positions[1:3] == positions[3:5]
    queue.close()


def test_delete_removes_everything_and_closes(tmp_path: Path, log: LogRecorder) -> None:
    queue = open_queue(tmp_path, log, max_bytes=100)
    queue.put_many([b"z" * 30] * 10)
    queue.get()
    asyncio.run(queue.sync())
    queue.delete()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(DiskQueueError, match="exiting"):
        queue.put(b"late")
    assert queue.get() is None
    queue.close()  # no-op after delete: must not bring the metadata back
    assert list(tmp_path.iterdir()) == []


def test_reopen_restores_positions_depth_and_records(tmp_path: Path, log: LogRecorder) -> None:
    records = [f"record-{i:04d}".encode() * 3 for i in range(40)]
    queue = open_queue(tmp_path, log, max_bytes=300)
    queue.put_many(records)
    taken = [queue.get() for _ in range(13)]
    before = queue.positions()
    queue.close()
    assert read_meta(tmp_path, "q") == tuple(before)
    assert before.depth == 27

    queue = open_queue(tmp_path, log, max_bytes=300)
    assert queue.positions() == before
    assert taken + drain(queue) == records
    queue.close()
    assert stat.S_IMODE(meta_file(tmp_path, "q").stat().st_mode) == 0o600


def test_resize_between_runs_like_go(tmp_path: Path, log: LogRecorder) -> None:
    """Go's TestDiskQueueResize: a changed max_bytes_per_file applies to new files only."""
    msg = bytearray(range(10))
    queue = open_queue(tmp_path, log, max_bytes=8 * 14, min_size=10)
    for i in range(9):
        msg[0] = i
        queue.put(bytes(msg))
    assert queue.positions()[3:] == (1, 14)
    queue.close()
    queue = open_queue(tmp_path, log, max_bytes=10 * 14, min_size=10)
    for i in range(10):
        msg[0] = 20 + i
        queue.put(bytes(msg))
    assert queue.positions()[3:] == (2, 14)
    assert queue.depth() == 19
    assert [r[0] for r in drain(queue)] == list(range(9)) + list(range(20, 30))
    queue.close()
    assert not list(tmp_path.glob("*.bad"))


@pytest.mark.parametrize("slack", [0, 5])
def test_reader_caught_up_when_writer_rolls_is_not_corruption(
    tmp_path: Path, log: LogRecorder, slack: int
) -> None:
    """go-diskqueue issue #42: Go renames the finished file to .bad here; we move on."""
    queue = open_queue(tmp_path, log, max_bytes=10 * 14 + slack, min_size=10)
    for round_ in range(3):
        for _ in range(10):
            queue.put(bytes([round_]) * 10)
            assert queue.get() == bytes([round_]) * 10
    queue.put(b"x" * 10)  # rolls: the reader is at the end of the finished file
    assert queue.get() == b"x" * 10
    assert queue.get() is None
    queue.close()
    assert not list(tmp_path.glob("*.bad"))
    assert log.at("ERROR") == []
    assert data_file_numbers(tmp_path, "q") == [3]


def test_reader_in_write_file_stops_where_the_writer_rolled(
    tmp_path: Path, log: LogRecorder
) -> None:
    queue = open_queue(tmp_path, log, max_bytes=10 * 14 + 5, min_size=10)
    queue.put_many([b"a" * 10] * 4)
    assert queue.get() == b"a" * 10  # the reader has the write file open
    queue.put_many([b"b" * 10] * 10)  # rolls after 10 records, at 140 < 145
    assert drain(queue) == [b"a" * 10] * 3 + [b"b" * 10] * 10
    queue.close()
    assert not list(tmp_path.glob("*.bad"))
    assert log.at("ERROR") == []


def test_files_are_mode_0600(tmp_path: Path, log: LogRecorder) -> None:
    queue = open_queue(tmp_path, log, max_bytes=50)
    queue.put_many([b"m" * 30] * 3)
    queue.close()
    for path in tmp_path.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


# ------------------------------------------------------------------------------ syncing


def test_sync_due_counts_reads_and_writes(tmp_path: Path, log: LogRecorder) -> None:
    queue = open_queue(tmp_path, log, sync_every=3, sync_timeout=60.0)
    assert not queue.sync_due()
    queue.put(b"a")
    queue.put(b"b")
    assert not queue.sync_due()
    queue.get()
    assert queue.sync_due()
    asyncio.run(queue.sync())
    assert not queue.sync_due()
    assert read_meta(tmp_path, "q") == (1, 0, 5, 0, 10)
    queue.put_many([b"c"] * 5)  # a batch counts every record
    assert queue.sync_due()
    queue.close()


def test_sync_timeout_needs_activity(tmp_path: Path, log: LogRecorder) -> None:
    queue = open_queue(tmp_path, log, sync_every=1000, sync_timeout=0.05)
    time.sleep(0.06)
    assert not queue.sync_due()  # nothing happened: no sync, as Go's ticker
    queue.put(b"a")
    assert not queue.sync_due()
    time.sleep(0.06)
    assert queue.sync_due()
    queue.close()


def meta_is(directory: Path, expected: tuple[int, int, int, int, int]) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return read_meta(directory, "q") == expected
        except (FileNotFoundError, AssertionError):
            return False

    return check


async def test_sync_after_read_like_go(tmp_path: Path, log: LogRecorder) -> None:
    """Go's TestDiskQueueSyncAfterRead, with the syncer task the owner runs."""
    queue = open_queue(tmp_path, log, max_bytes=1 << 11, sync_timeout=0.05)
    syncer = asyncio.create_task(queue.run_syncer())
    msg = bytes(1000)
    queue.put(msg)
    await wait_until_async(meta_is(tmp_path, (1, 0, 0, 0, 1004)), timeout=10.0)
    queue.put(msg)
    assert queue.get() == msg
    await wait_until_async(meta_is(tmp_path, (1, 0, 1004, 0, 2008)), timeout=10.0)
    syncer.cancel()
    queue.close()


async def test_rotation_and_read_file_change_start_a_sync(tmp_path: Path, log: LogRecorder) -> None:
    queue = open_queue(tmp_path, log, max_bytes=100, sync_timeout=60.0)
    queue.put_many([b"r" * 40] * 3)  # two files: 88 + 44 bytes
    await wait_until_async(meta_is(tmp_path, (3, 0, 0, 1, 44)), timeout=10.0)
    assert queue.get() == b"r" * 40
    assert queue.get() == b"r" * 40  # leaves file 0
    await wait_until_async(meta_is(tmp_path, (1, 1, 0, 1, 44)), timeout=10.0)
    await wait_until_async(lambda: not data_file(tmp_path, "q", 0).exists(), timeout=10.0)
    queue.close()


async def test_syncer_syncs_after_sync_every_operations(tmp_path: Path, log: LogRecorder) -> None:
    queue = open_queue(tmp_path, log, sync_every=10, sync_timeout=60.0)
    syncer = asyncio.create_task(queue.run_syncer(interval=0.01))
    queue.put_many([b"s" * 10] * 9)
    await asyncio.sleep(0.05)
    assert not meta_file(tmp_path, "q").exists()
    queue.put(b"s" * 10)
    await wait_until_async(meta_is(tmp_path, (10, 0, 0, 0, 140)), timeout=10.0)
    syncer.cancel()
    queue.close()


async def test_failed_sync_is_logged_and_retried(tmp_path: Path, log: LogRecorder) -> None:
    queue = open_queue(tmp_path, log, max_bytes=100, sync_timeout=60.0)
    blocker = meta_file(tmp_path, "q")
    blocker.mkdir()  # renaming the metadata over a non-empty directory fails
    (blocker / "keep").touch()
    queue.put_many([b"f" * 40] * 3)  # files 0 and 1
    assert [queue.get(), queue.get()] == [b"f" * 40] * 2  # leaves file 0
    await queue.sync()
    assert any("failed to sync" in line for line in log.at("ERROR"))
    assert not queue.sync_due()  # backing off: the retry waits a little (0.1 s, doubling)
    await wait_until_async(queue.sync_due, timeout=10.0)
    # the finished file is freed although the metadata on disk still names it: a full disk
    # needs that space back to write the metadata at all (start-up skips a missing read file)
    assert not data_file(tmp_path, "q", 0).exists()
    assert not list(tmp_path.glob("*.tmp"))
    await queue.sync()  # fails again: said once, not once per retry
    assert sum("failed to sync" in line for line in log.at("ERROR")) == 1

    shutil.rmtree(blocker)
    await wait_until_async(queue.sync_due, timeout=10.0)
    await queue.sync()
    assert read_meta(tmp_path, "q") == (1, 1, 0, 1, 44)
    assert not data_file(tmp_path, "q", 0).exists()
    assert not queue.sync_due()
    queue.close()


async def test_sync_runs_alongside_puts_gets_and_rotation(tmp_path: Path, log: LogRecorder) -> None:
    queue = open_queue(tmp_path, log, max_bytes=500, sync_timeout=60.0)
    expected: deque[bytes] = deque()
    pending: list[asyncio.Task[None]] = []
    for i in range(200):
        batch = [f"{i}-{j}".encode() * 5 for j in range(i % 4 + 1)]
        queue.put_many(batch)
        expected.extend(batch)
        pending.append(asyncio.create_task(queue.sync()))
        await asyncio.sleep(0)
        for _ in range(i % 3):
            record = queue.get()
            assert record == (expected.popleft() if expected else None)
    await asyncio.gather(*pending)
    await queue.sync()
    # the newest snapshot won, whatever order the worker threads finished in
    assert read_meta(tmp_path, "q") == tuple(queue.positions())
    depth, rnum, rpos, wnum, _ = read_meta(tmp_path, "q")
    on_disk = []
    for n in range(rnum, wnum + 1):
        records = parse_data_file(data_file(tmp_path, "q", n))
        on_disk.extend(records)
    # the records between the persisted read and write positions are exactly the unread ones
    skipped = len(parse_data_file_prefix(data_file(tmp_path, "q", rnum), rpos))
    assert on_disk[skipped:] == list(expected)
    assert depth == len(expected)
    assert data_file_numbers(tmp_path, "q")[0] == rnum
    queue.close()
    assert not list(tmp_path.glob("*.tmp"))


def test_an_older_snapshot_never_overwrites_a_newer_one(tmp_path: Path, log: LogRecorder) -> None:
    """Two syncs whose worker threads finish in the opposite order (driven by hand)."""
    queue = open_queue(tmp_path, log)
    queue.put(b"first")
    older = queue._take_sync_job()
    queue.put(b"second")
    newer = queue._take_sync_job()
    assert queue._run_sync_job(newer).ok
    assert queue._run_sync_job(older).ok
    assert read_meta(tmp_path, "q") == (2, 0, 0, 0, 19)
    assert not list(tmp_path.glob("*.tmp"))

    in_flight = queue._take_sync_job()
    queue.empty()
    queue._run_sync_job(in_flight)
    assert not meta_file(tmp_path, "q").exists()  # Empty deleted it; it stays deleted
    queue.close()
    assert read_meta(tmp_path, "q") == (0, 1, 0, 1, 0)


def parse_data_file_prefix(path: Path, end: int) -> list[bytes]:
    """The records of a data file that lie before byte offset ``end``."""
    records = []
    pos = 0
    data = path.read_bytes()
    while pos < end:
        (length,) = struct.unpack_from(">I", data, pos)
        records.append(data[pos + 4 : pos + 4 + length])
        pos += 4 + length
    assert pos == end
    return records


# --------------------------------------------------------------------------- corruption


def test_truncated_finished_file_is_renamed_bad_and_reading_continues(
    tmp_path: Path, log: LogRecorder
) -> None:
    """The first half of Go's TestDiskQueueCorruption."""
    msg = bytearray(120)  # 124 bytes per record, 8 records (992 bytes) per file
    msg[0], msg[62], msg[119] = 91, 4, 211
    queue = open_queue(tmp_path, log, max_bytes=1000, min_size=10, sync_every=5)
    queue.put_many([bytes(msg)] * 25)
    assert queue.depth() == 25
    os.truncate(data_file(tmp_path, "q", 1), 400)  # 3 whole records, then a torn one

    for _ in range(19):  # 8 from file 0, 3 from file 1, 8 from file 2
        assert queue.get() == msg
    bad = data_file(tmp_path, "q", 1)
    assert Path(str(bad) + ".bad").exists()
    assert f"DISKQUEUE(q) reading at 372 of {bad} - unexpected EOF" in log.at("ERROR")
    assert f"DISKQUEUE(q) jump to next file and saving bad file as {bad}.bad" in log.at("WARN")

    assert queue.get() == msg  # the one record in file 3
    assert queue.get() is None
    # 5 records were lost with the bad file: depth is repaired at the tail, as in Go
    assert queue.depth() == 0
    assert "DISKQUEUE(q) positive depth at tail (5), data loss, resetting 0..." in log.at("ERROR")
    queue.put(bytes(msg))
    assert queue.get() == msg
    queue.close()


def test_truncated_write_file_moves_the_writer_on(tmp_path: Path, log: LogRecorder) -> None:
    queue = open_queue(tmp_path, log, max_bytes=1000, min_size=10)
    queue.put_many([b"a" * 100, b"b" * 100, b"c" * 100])
    os.truncate(data_file(tmp_path, "q", 0), 150)  # "b" is torn, "c" is gone
    assert queue.get() == b"a" * 100
    assert queue.get() is None
    assert Path(str(data_file(tmp_path, "q", 0)) + ".bad").exists()
    assert queue.positions() == (0, 1, 0, 1, 0)
    queue.put(b"d" * 100)
    assert queue.get() == b"d" * 100
    queue.close()
    assert parse_data_file(data_file(tmp_path, "q", 1)) == [b"d" * 100]


@pytest.mark.parametrize(
    ("garbage", "reported"),
    [(b"\x00\x00\x00\x00", 0), (b"\xff\xff\xff\xff", -1), (b"\x7f\xff\xff\xff", 2147483647)],
)
def test_garbage_length_is_corruption(
    tmp_path: Path, log: LogRecorder, garbage: bytes, reported: int
) -> None:
    queue = open_queue(tmp_path, log, max_bytes=100, min_size=10)
    records = [bytes([i]) * 40 for i in range(6)]  # two per file, files 0..2
    queue.put_many(records)
    with open(data_file(tmp_path, "q", 1), "r+b") as f:
        f.seek(44)  # the header of the second record in file 1
        f.write(garbage)
    assert drain(queue) == [records[0], records[1], records[2], records[4], records[5]]
    assert f"invalid message read size ({reported})" in log.at("ERROR")[0]
    assert Path(str(data_file(tmp_path, "q", 1)) + ".bad").exists()
    assert queue.depth() == 0
    queue.close()


def test_bad_length_in_write_file_continues_in_a_new_file(tmp_path: Path, log: LogRecorder) -> None:
    """Go's test writes a zero length straight into the queue's write file, then keeps putting."""
    queue = open_queue(tmp_path, log, max_bytes=1000, min_size=10)
    queue.put(b"a" * 20)
    assert queue.get() == b"a" * 20
    write_fd = queue._write_fd
    assert write_fd is not None
    os.write(write_fd, b"\x00\x00\x00\x00")
    queue.put(b"b" * 20)  # lands after the garbage, in the broken file
    assert queue.get() is None  # the broken file is given up, "b" with it
    assert "DISKQUEUE(q) positive depth at tail (1), data loss, resetting 0..." in log.at("ERROR")
    assert queue.positions() == (0, 1, 0, 1, 0)
    queue.put(b"d" * 20)
    assert queue.get() == b"d" * 20
    queue.close()
    assert data_file_numbers(tmp_path, "q") == [1]
    assert read_meta(tmp_path, "q") == (0, 1, 24, 1, 24)


def test_metadata_ahead_of_data(tmp_path: Path, log: LogRecorder) -> None:
    """Metadata claims 10 records but the file holds 5: read 5, give up the file, depth 0."""
    records = [bytes([i]) * 50 for i in range(5)]
    data_file(tmp_path, "q", 0).write_bytes(b"".join(frame(r) for r in records))
    write_meta(tmp_path, "q", 10, 0, 0, 0, 540)
    queue = open_queue(tmp_path, log)
    assert queue.depth() == 10
    assert drain(queue) == records
    assert queue.depth() == 0
    assert "DISKQUEUE(q) positive depth at tail (5), data loss, resetting 0..." in log.at("ERROR")
    queue.put(b"new")
    assert queue.get() == b"new"
    queue.close()


def test_metadata_read_position_past_write_position(tmp_path: Path, log: LogRecorder) -> None:
    data_file(tmp_path, "q", 4).write_bytes(frame(b"x" * 10) * 2)
    write_meta(tmp_path, "q", 0, 4, 42, 4, 28)
    queue = open_queue(tmp_path, log)
    assert queue.positions() == (0, 5, 0, 5, 0)
    assert any("readPos > writePos (42 > 28)" in line for line in log.at("ERROR"))
    queue.put(b"fresh")
    assert queue.get() == b"fresh"
    queue.close()
    assert data_file_numbers(tmp_path, "q") == [5]


def test_metadata_behind_data_go_crash(tmp_path: Path, log: LogRecorder) -> None:
    """Go's salvage case: the write file grew past the recorded writePos before a crash."""
    records = [
        nsqd_message(1_700_000_000_000_000_000 + i, 1, b"%016x" % i, b"body") for i in range(8)
    ]
    data_file(tmp_path, "q", 2).write_bytes(b"".join(frame(r) for r in records))
    write_meta(tmp_path, "q", 3, 2, 34 * 2, 2, 34 * 5)  # read 2, synced 5, wrote 8
    queue = open_queue(tmp_path, log, min_size=NSQD_MIN, max_size=NSQD_MAX)
    path = data_file(tmp_path, "q", 2)
    assert (
        f"DISKQUEUE(q) {path} metadata writePos 170 < file size of 272, skipping to new file"
        in log.at("WARN")
    )
    assert queue.positions() == (6, 2, 68, 3, 0)  # depth counts the 3 unsynced records too
    queue.put(records[0])
    assert drain(queue) == records[2:] + records[:1]
    assert log.at("ERROR") == []
    queue.close()


def test_crash_after_unsynced_rotation_keeps_every_record(tmp_path: Path, log: LogRecorder) -> None:
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    live.mkdir()
    records = [f"{i:05d}".encode() * 8 for i in range(60)]
    queue = open_queue(live, log, max_bytes=200)
    queue.put_many(records[:10])
    assert [queue.get() for _ in range(4)] == records[:4]
    queue.close()  # metadata: depth 6, both sides in the first files
    queue = open_queue(live, log, max_bytes=200)
    queue.put_many(records[10:])  # several rotations, no sync (no event loop)
    assert [queue.get() for _ in range(10)] == records[4:14]
    snapshot_dir(live, crashed)
    queue.close()

    recovered = open_queue(crashed, log, max_bytes=200)
    # consumed-but-unsynced records come again, nothing is lost, depth is exact
    assert recovered.depth() == 56
    assert drain(recovered) == records[4:]
    assert recovered.depth() == 0
    recovered.put(b"after")
    assert drain(recovered) == [b"after"]
    recovered.close()
    assert not list(crashed.glob("*.bad"))


def test_data_without_metadata_is_salvaged(tmp_path: Path, log: LogRecorder) -> None:
    records = [bytes([65 + i]) * 30 for i in range(5)]
    data_file(tmp_path, "q", 0).write_bytes(b"".join(frame(r) for r in records[:3]))
    data_file(tmp_path, "q", 1).write_bytes(b"".join(frame(r) for r in records[3:]))
    queue = open_queue(tmp_path, log, max_bytes=100)
    assert queue.positions() == (5, 0, 0, 2, 0)
    queue.put(b"z" * 30)
    assert drain(queue) == [*records, b"z" * 30]
    queue.close()


def test_unparsable_metadata_is_logged(tmp_path: Path, log: LogRecorder) -> None:
    meta_file(tmp_path, "q").write_text("garbage\n")
    queue = open_queue(tmp_path, log)
    assert any("failed to retrieveMetaData" in line for line in log.at("ERROR"))
    queue.put(b"ok")
    assert queue.get() == b"ok"
    queue.close()
    assert read_meta(tmp_path, "q") == (0, 0, 6, 0, 6)


# ----------------------------------------------------------------- byte-exact file format


def test_reads_a_directory_built_from_the_format_description(
    tmp_path: Path, log: LogRecorder
) -> None:
    """A channel queue as Go nsqd would leave it: a finished file, a current one, metadata."""
    name = "orders:billing"
    messages = [
        nsqd_message(1_700_000_000_123_456_789 + i, 1 + i % 3, b"0a1b2c3d4e5f%04d" % i, body)
        for i, body in enumerate(
            [b"", b"hello", b"x" * 600, "ünïcode".encode(), bytes(range(256)), b"{}", b"last"]
        )
    ]
    framed = [frame(m) for m in messages]
    # Go with --max-bytes-per-file=700 rolls before the record that would pass 700 bytes
    first = b"".join(framed[:3])
    assert len(first) + len(framed[3]) > 700
    second = b"".join(framed[3:])
    data_file(tmp_path, name, 7).write_bytes(first)
    data_file(tmp_path, name, 8).write_bytes(second)
    # one message of file 7 was already consumed
    write_meta(tmp_path, name, 6, 7, len(framed[0]), 8, len(second))

    queue = open_queue(
        tmp_path, log, name=name, max_bytes=700, min_size=NSQD_MIN, max_size=NSQD_MAX
    )
    assert queue.depth() == 6
    assert drain(queue) == messages[1:]
    for record in messages[1:]:
        timestamp, attempts = struct.unpack_from(">QH", record)
        assert timestamp >= 1_700_000_000_123_456_789
        assert 1 <= attempts <= 3
    queue.close()
    assert log.at("ERROR") == log.at("WARN") == []
    assert data_file_numbers(tmp_path, name) == [8]
    assert meta_file(tmp_path, name).read_text() == f"0\n8,{len(second)}\n8,{len(second)}\n"


def test_files_we_write_follow_the_format_description(tmp_path: Path, log: LogRecorder) -> None:
    name = "events"
    messages = [
        nsqd_message(1_600_000_000_000_000_000 + i, 1, b"%016d" % i, b"payload-%d" % i * (i % 7))
        for i in range(120)
    ]
    queue = open_queue(
        tmp_path, log, name=name, max_bytes=1500, min_size=NSQD_MIN, max_size=NSQD_MAX
    )
    queue.put_many(messages[:50])
    for message in messages[50:]:
        queue.put(message)
    assert [queue.get() for _ in range(20)] == messages[:20]
    queue.close()

    numbers = data_file_numbers(tmp_path, name)
    assert numbers == list(range(numbers[0], numbers[-1] + 1))
    on_disk: list[bytes] = []
    for n in numbers:
        path = data_file(tmp_path, name, n)
        size = path.stat().st_size
        assert size <= 1500
        records = parse_data_file(path)
        if n != numbers[-1]:
            next_record = parse_data_file(data_file(tmp_path, name, n + 1))[0]
            assert size + 4 + len(next_record) > 1500, "rolled too early"
        on_disk.extend(records)
    depth, rnum, rpos, wnum, wpos = read_meta(tmp_path, name)
    assert (rnum, wnum, wpos) == (
        numbers[0],
        numbers[-1],
        data_file(tmp_path, name, wnum).stat().st_size,
    )
    consumed_in_first = parse_data_file_prefix(data_file(tmp_path, name, rnum), rpos)
    assert on_disk[len(consumed_in_first) :] == messages[20:]
    assert depth == 100
    assert meta_file(tmp_path, name).read_text() == f"100\n{rnum},{rpos}\n{wnum},{wpos}\n"


# ------------------------------------------------------------------- property: list model


class QueueModel:
    """Drives a DiskQueue and a list side by side; "crash" reopens a copy of the files."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.generation = 0
        self.directory = self._new_dir()
        self.queue = self._open()
        self.expected: deque[bytes] = deque()
        self.unsynced_reads: list[bytes] = []

    def _new_dir(self) -> Path:
        self.generation += 1
        return self.root / f"g{self.generation}"

    def _open(self) -> DiskQueue:
        self.directory.mkdir(exist_ok=True)
        return open_queue(self.directory, LogRecorder(), max_bytes=self.max_bytes)

    def apply(self, op: tuple[str, int | list[int]]) -> None:
        kind, arg = op
        if kind == "put":
            assert isinstance(arg, int)
            record = self._record(arg)
            self.queue.put(record)
            self.expected.append(record)
        elif kind == "put_many":
            assert isinstance(arg, list)
            records = [self._record(size) for size in arg]
            self.queue.put_many(records)
            self.expected.extend(records)
        elif kind == "get":
            for _ in range(int(arg)):  # type: ignore[arg-type]
                got = self.queue.get()
                if self.expected:
                    want = self.expected.popleft()
                    assert got == want
                    self.unsynced_reads.append(want)
                else:
                    assert got is None
        elif kind == "reopen":
            self.queue.close()
            self.queue = self._open()
            self.unsynced_reads = []
        elif kind == "crash":
            target = self._new_dir()
            snapshot_dir(self.directory, target)
            self.queue.close()
            self.directory = target
            self.queue = self._open()
            # reads since the last persisted metadata are delivered again
            self.expected.extendleft(reversed(self.unsynced_reads))
            self.unsynced_reads = []
        assert self.queue.depth() == len(self.expected)

    _counter = 0

    def _record(self, size: int) -> bytes:
        QueueModel._counter += 1
        stamp = QueueModel._counter.to_bytes(4, "big")
        return (stamp * (size // 4 + 1))[:size]


operations = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 60)),
    st.tuples(st.just("put_many"), st.lists(st.integers(0, 60), max_size=12)),
    st.tuples(st.just("get"), st.integers(1, 6)),
    st.tuples(st.just("reopen"), st.just(0)),
    st.tuples(st.just("crash"), st.just(0)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(operations, max_size=40), max_bytes=st.integers(20, 400))
def test_behaves_like_a_list(ops: list[tuple[str, int | list[int]]], max_bytes: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        model = QueueModel(Path(root), max_bytes)
        for op in ops:
            model.apply(op)
        remaining = drain(model.queue)
        assert remaining == list(model.expected)
        model.queue.close()
        assert not list(model.directory.glob("*.bad"))


# ----------------------------------------------------------------- kill -9 in a subprocess

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from nsqpy.nsqd.diskqueue import DiskQueue

    directory, count, sync_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    async def main():
        queue = DiskQueue("crash", directory, 64 * 1024, 26, 4096, sync_every, 2.0,
                          lambda level, message: None)
        syncer = asyncio.create_task(queue.run_syncer())
        for start in range(0, count, 50):
            batch = [b"%016d" % i * 14 for i in range(start, min(start + 50, count))]
            if sync_every == 1:
                for record in batch:
                    queue.put(record)
                    await queue.sync()
            else:
                queue.put_many(batch)
                await asyncio.sleep(0)
            print(start + len(batch), flush=True)  # acknowledged so far
        print("done", flush=True)
        await asyncio.sleep(30)  # wait for the parent's SIGKILL
        syncer.cancel()

    asyncio.run(main())
    """
)


def expected_record(i: int) -> bytes:
    return b"%016d" % i * 14  # 224 bytes, as the child writes them


def run_and_kill(directory: Path, count: int, sync_every: int, kill_after: int) -> int:
    """Start a child that puts ``count`` records; SIGKILL it once ``kill_after`` are
    acknowledged. Returns the number the child had acknowledged."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), str(count), str(sync_every)],
        stdout=subprocess.PIPE,
        text=True,
    )
    acknowledged = 0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "done":
                break
            acknowledged = int(line)
            if acknowledged >= kill_after:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return acknowledged


def test_sigkill_after_synced_puts_loses_nothing(tmp_path: Path, log: LogRecorder) -> None:
    count = 400
    assert run_and_kill(tmp_path, count, sync_every=1, kill_after=count) == count
    queue = DiskQueue("crash", str(tmp_path), 64 * 1024, 26, 4096, 1, 2.0, log)
    assert queue.depth() == count
    assert drain(queue) == [expected_record(i) for i in range(count)]
    assert log.at("ERROR") == []
    queue.close()


def test_sigkill_mid_stream_with_default_sync_settings(
    tmp_path: Path, log: LogRecorder, capsys: pytest.CaptureFixture[str]
) -> None:
    acknowledged = run_and_kill(tmp_path, 200_000, sync_every=2500, kill_after=20_000)
    queue = DiskQueue("crash", str(tmp_path), 64 * 1024, 26, 4096, 2500, 2.0, log)
    survived = queue.depth()
    records = drain(queue)
    queue.close()
    with capsys.disabled():
        print(f"\n[SIGKILL, sync_every=2500] acknowledged {acknowledged}, survived {survived}")
    # every acknowledged put was in the kernel: all survive, in order, without gaps; a batch
    # torn by the kill can only add records after them
    assert len(records) == survived >= acknowledged
    assert records == [expected_record(i) for i in range(survived)]


def test_startup_continues_after_a_read_file_deleted_before_its_metadata(
    tmp_path: Path, log: LogRecorder
) -> None:
    """A finished file deleted while the metadata could not be written (a full disk), then a
    crash: the metadata's read position is in a file that is gone. Start-up continues at the
    next file and recounts the depth from the files, with no depth-at-tail error later."""
    queue = open_queue(tmp_path, log, max_bytes=100)
    records = [b"%02d" % i + b"x" * 38 for i in range(5)]  # files 0, 1 (2 each) and 2 (1)
    queue.put_many(records)
    queue.close()
    assert read_meta(tmp_path, "q") == (5, 0, 0, 2, 44)
    data_file(tmp_path, "q", 0).unlink()  # its two records were read before the crash

    reopened = open_queue(tmp_path, log, max_bytes=100)
    assert reopened.depth() == 3
    assert drain(reopened) == records[2:]
    assert reopened.depth() == 0
    assert any("is gone" in line for line in log.at("WARN"))
    assert not log.at("ERROR")
    reopened.close()
