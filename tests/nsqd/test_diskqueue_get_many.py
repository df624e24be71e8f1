"""DiskQueue.get_many: a channel's read-back takes many records per call. It must be get()
repeated: the same records in the same order, the same positions, depth and sync counting, the
same handling of a corrupt file. Each test reads one queue with get_many and a copy of it with
get, and compares them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqpy.nsqd.diskqueue import DiskQueue

from .test_diskqueue import LogRecorder, data_file, drain, open_queue, read_meta


def twins(
    root: Path, max_bytes: int, records: list[bytes], sync_every: int = 2500
) -> tuple[DiskQueue, LogRecorder, DiskQueue, LogRecorder]:
    """Two queues holding the same files: one for get_many, one for get."""
    (root / "many").mkdir()
    first = open_queue(root / "many", LogRecorder(), max_bytes=max_bytes, sync_every=sync_every)
    first.put_many(records)
    first.close()
    shutil.copytree(root / "many", root / "one")
    many_log, one_log = LogRecorder(), LogRecorder()
    many = open_queue(root / "many", many_log, max_bytes=max_bytes, sync_every=sync_every)
    one = open_queue(root / "one", one_log, max_bytes=max_bytes, sync_every=sync_every)
    return many, many_log, one, one_log


def get_each(queue: DiskQueue, limit: int) -> list[bytes]:
    out: list[bytes] = []
    while len(out) < limit and (record := queue.get()) is not None:
        out.append(record)
    return out


def test_get_many_crosses_files_like_get(tmp_path: Path) -> None:
    records = [b"%03d" % i + bytes(i % 37) for i in range(200)]  # 3..39 bytes, ~15 files
    many, _, one, _ = twins(tmp_path, 400, records)
    got: list[bytes] = []
    for limit in (1, 7, 50, 3, 100, 1000):
        batch = many.get_many(limit)
        assert batch == get_each(one, limit)
        assert many.positions() == one.positions()
        assert many.depth() == len(records) - len(got) - len(batch)
        got.extend(batch)
    assert got == records
    assert many.get_many(10) == []
    many.close()
    one.close()
    # the read files left behind were deleted by the close's sync, as with get()
    assert sorted(p.name for p in (tmp_path / "many").iterdir()) == sorted(
        p.name for p in (tmp_path / "one").iterdir()
    )
    assert read_meta(tmp_path / "many", "q") == read_meta(tmp_path / "one", "q")


def test_get_many_counts_every_record_toward_a_sync(tmp_path: Path) -> None:
    records = [bytes([i]) * 30 for i in range(40)]
    many, _, _, _ = twins(tmp_path, 4096, records, sync_every=25)
    assert len(many.get_many(24)) == 24
    assert not many.sync_due()
    assert len(many.get_many(1)) == 1
    assert many.sync_due()  # 25 reads, as 25 get() calls would count
    many.close()
    assert read_meta(tmp_path / "many", "q") == (15, 0, 25 * 34, 0, 40 * 34)


def test_get_many_skips_a_corrupt_file_like_get(tmp_path: Path) -> None:
    records = [bytes([i]) * 40 for i in range(6)]  # two per file, files 0..2
    many, many_log, one, one_log = twins(tmp_path, 100, records)
    for queue_dir in ("many", "one"):
        with open(data_file(tmp_path / queue_dir, "q", 1), "r+b") as f:
            f.seek(44)  # the header of the second record in file 1
            f.write(b"\xff\xff\xff\xff")
    assert many.get_many(100) == drain(one) == [records[i] for i in (0, 1, 2, 4, 5)]
    assert many.positions() == one.positions()
    assert many.depth() == 0
    assert [m.replace("/many/", "/one/") for m in many_log.at("ERROR")] == one_log.at("ERROR")
    assert "invalid message read size (-1)" in many_log.at("ERROR")[0]
    assert Path(str(data_file(tmp_path / "many", "q", 1)) + ".bad").exists()
    many.close()
    one.close()


def test_get_many_in_the_write_file_sees_later_puts(tmp_path: Path) -> None:
    queue = open_queue(tmp_path, LogRecorder(), max_bytes=1 << 20)
    queue.put_many([b"a" * 20] * 3)
    assert queue.get_many(2) == [b"a" * 20] * 2  # the read buffer ends at the write position
    queue.put_many([b"b" * 20] * 3)
    assert queue.get_many(10) == [b"a" * 20] + [b"b" * 20] * 3
    assert queue.positions() == (0, 0, 6 * 24, 0, 6 * 24)
    assert queue.get_many(10) == []
    queue.close()


put_op = st.tuples(st.just("put"), st.lists(st.integers(0, 60), max_size=15))
get_op = st.tuples(st.just("get"), st.integers(1, 20))
steps = st.lists(st.one_of(put_op, get_op), max_size=30)


def put_numbered(queues: list[DiskQueue], sizes: object, last: int) -> int:
    """Put a record of each size, numbered on from ``last``, in every queue; the last number."""
    assert isinstance(sizes, list)
    batch = []
    for size in sizes:
        last += 1
        batch.append((last.to_bytes(4, "big") * (size // 4 + 1))[:size])
    for queue in queues:
        queue.put_many(batch)
    return last


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=steps, max_bytes=st.integers(20, 400))
def test_get_many_is_get_repeated(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, object]], max_bytes: int
) -> None:
    root = tmp_path_factory.mktemp("q")
    (root / "many").mkdir()
    (root / "one").mkdir()
    many = open_queue(root / "many", LogRecorder(), max_bytes=max_bytes)
    one = open_queue(root / "one", LogRecorder(), max_bytes=max_bytes)
    counter = 0
    for kind, arg in ops:
        if kind == "put":
            counter = put_numbered([many, one], arg, counter)
        else:
            assert isinstance(arg, int)
            assert many.get_many(arg) == get_each(one, arg)
        assert many.positions() == one.positions()
    assert many.get_many(1 << 20) == drain(one)
    many.close()
    one.close()


def test_get_many_ending_on_a_file_end_moves_to_the_next_file(tmp_path: Path) -> None:
    records = [bytes([i]) * 20 for i in range(12)]  # 24 bytes framed: four per 100-byte file
    many, _, one, _ = twins(tmp_path, 100, records)
    assert many.get_many(4) == get_each(one, 4) == records[:4]
    assert many.positions() == one.positions() == (8, 1, 0, 2, 96)
    many.close()
    one.close()


def get_each_held(queue: DiskQueue, limit: int) -> tuple[list[bytes], list[int]]:
    records: list[bytes] = []
    holds: list[int] = []
    while len(records) < limit and (got := queue.get_held()) is not None:
        records.append(got[0])
        holds.append(got[1])
    return records, holds


held_steps = st.lists(
    st.one_of(put_op, get_op, st.tuples(st.just("release"), st.integers(0, 1000))), max_size=30
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=held_steps, max_bytes=st.integers(20, 400))
def test_get_many_held_is_get_held_repeated(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, object]], max_bytes: int
) -> None:
    """The durable mode's read-back: the same records and holds as get_held repeated, the same
    positions and held count as records are released (the committed position moving), the
    same metadata and side file once closed, and the same records again after a restart."""
    root = tmp_path_factory.mktemp("q")
    queues = {}
    for name in ("many", "one"):
        (root / name).mkdir()
        queues[name] = open_queue(root / name, LogRecorder(), max_bytes=max_bytes, sync_every=1)
        queues[name].hold_reads()
    many, one = queues["many"], queues["one"]
    unreleased: list[int] = []
    counter = 0
    for kind, arg in ops:
        if kind == "put":
            counter = put_numbered([many, one], arg, counter)
        elif kind == "get":
            assert isinstance(arg, int)
            got = many.get_many_held(arg)
            assert got == get_each_held(one, arg)
            unreleased.extend(got[1])
        elif kind == "release" and unreleased:
            assert isinstance(arg, int)
            hold = unreleased.pop(arg % len(unreleased))
            many.release(hold)
            one.release(hold)
        assert many.positions() == one.positions()
        assert many.held() == one.held()
    many.close()
    one.close()
    assert read_meta(root / "many", "q") == read_meta(root / "one", "q")
    files = {p.name: p.read_bytes() for p in (root / "one").iterdir()}
    assert {p.name: p.read_bytes() for p in (root / "many").iterdir()} == files
    for name in ("many", "one"):
        queues[name] = open_queue(root / name, LogRecorder(), max_bytes=max_bytes, sync_every=1)
        queues[name].hold_reads()
    assert queues["many"].get_many_held(1 << 20) == get_each_held(queues["one"], 1 << 20)
    queues["many"].close()
    queues["one"].close()
