"""DiskQueue.hold_reads: the metadata records the start of the oldest record handed
out and not yet released, so whatever is not finished is read again after a restart, by us or
by Go's diskqueue (the files keep go-diskqueue's format; only the position written differs)."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqpy.nsqd.diskqueue import DiskQueue
from nsqpy.nsqd.diskqueue.holds import Hold

from .test_diskqueue import LogRecorder, data_file_numbers, drain, open_queue, read_meta


def held_queue(directory: Path, max_bytes: int = 1000) -> DiskQueue:
    queue = open_queue(directory, LogRecorder(), max_bytes=max_bytes, min_size=1, max_size=200)
    queue.hold_reads()
    return queue


def take(queue: DiskQueue) -> tuple[bytes, Hold]:
    got = queue.get_held()
    assert got is not None
    return got


def test_metadata_keeps_the_oldest_unreleased_record(tmp_path: Path) -> None:
    queue = held_queue(tmp_path)
    for i in range(5):
        queue.put(b"r%d" % i + bytes(8))  # 14-byte records with their length
    taken = [take(queue) for _ in range(3)]
    assert queue.depth() == 2  # what waits: the in-flight ones are not counted
    assert queue.committed_positions() == (5, 0, 0, 0, 70)  # the metadata's view: nothing released
    queue.release(taken[1][1])
    assert queue.committed_positions() == (5, 0, 0, 0, 70)  # the oldest is still held
    queue.release(taken[0][1])
    assert queue.committed_positions() == (3, 0, 28, 0, 70)  # past both, up to the one still held
    queue.close()
    assert read_meta(tmp_path, "q") == (3, 0, 28, 0, 70)

    again = open_queue(tmp_path, LogRecorder(), max_bytes=1000, min_size=1, max_size=200)
    assert [r[:2] for r in drain(again)] == [b"r2", b"r3", b"r4"]
    again.close()


def test_files_go_only_when_the_committed_position_leaves_them(tmp_path: Path) -> None:
    queue = held_queue(tmp_path, max_bytes=100)
    for i in range(12):
        queue.put(bytes([i]) * 46)  # two 50-byte records per file
    assert data_file_numbers(tmp_path, "q") == [0, 1, 2, 3, 4, 5]
    first, _ = take(queue)
    for _ in range(6):
        _, hold = take(queue)
        queue.release(hold)
    queue.close()
    assert data_file_numbers(tmp_path, "q") == [0, 1, 2, 3, 4, 5]
    assert read_meta(tmp_path, "q") == (12, 0, 0, 5, 100)

    queue = held_queue(tmp_path, max_bytes=100)
    again, again_hold = take(queue)
    assert again == first  # held, so read again
    assert queue.committed_positions()[1:3] == (0, 0)
    # the side file written at close: records 1-6 were finished, so the next is record 7
    seventh, seventh_hold = take(queue)
    assert seventh == bytes([7]) * 46
    holds = [again_hold, seventh_hold]
    while (got := queue.get_held()) is not None:
        holds.append(got[1])
    assert len(holds) == 2 + 4
    for hold in holds:
        queue.release(hold)
    queue.close()
    assert data_file_numbers(tmp_path, "q") == [5]
    assert read_meta(tmp_path, "q") == (0, 5, 100, 5, 100)


def test_put_held_hands_out_only_when_nothing_waits(tmp_path: Path) -> None:
    queue = held_queue(tmp_path, max_bytes=100)
    hold = queue.put_held(b"a" * 46)
    assert hold is not None
    assert queue.depth() == 0 and queue.get() is None
    assert queue.committed_positions() == (1, 0, 0, 0, 50)
    queue.put(b"b" * 46)
    assert queue.put_held(b"c" * 46) is None  # b waits: nothing written
    assert queue.committed_positions() == (2, 0, 0, 0, 100)
    assert take(queue)[0] == b"b" * 46
    rolled = queue.put_held(b"d" * 46)  # does not fit in file 0: file 1, handed out at once
    assert rolled is not None
    assert queue.committed_positions()[3:] == (1, 50)
    queue.release(hold)
    assert queue.committed_positions()[:3] == (2, 0, 50)
    queue.close()


def test_empty_removes_held_files_and_old_holds_do_nothing(tmp_path: Path) -> None:
    queue = held_queue(tmp_path, max_bytes=100)
    for i in range(6):
        queue.put(bytes([i]) * 46)
    held = [take(queue)[1] for _ in range(5)]
    queue.empty()
    assert data_file_numbers(tmp_path, "q") == []
    for hold in held:
        queue.release(hold)
    queue.put(b"new")
    assert take(queue)[0] == b"new"
    queue.close()
    assert read_meta(tmp_path, "q") == (1, 3, 0, 3, 7)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.integers(1, 120)),
            st.tuples(st.just("put_held"), st.integers(1, 120)),
            st.tuples(st.just("get"), st.just(0)),
            st.tuples(st.just("release"), st.integers(0, 50)),
        ),
        max_size=80,
    )
)
def test_a_restart_reads_every_unreleased_record(
    tmp_path_factory: object, ops: list[tuple[str, int]]
) -> None:
    """Whatever was put and not released is read again after close and reopen (no holds then),
    whatever the interleaving of puts, reads, hand-outs and out-of-order releases."""
    directory = tmp_path_factory.mktemp("holds")  # type: ignore[attr-defined]
    queue = held_queue(directory, max_bytes=300)
    held: list[tuple[bytes, Hold]] = []
    unreleased: Counter[bytes] = Counter()
    stored: set[bytes] = set()
    for op, arg in ops:
        if op in ("put", "put_held"):
            record = b"%05d" % len(stored) + bytes(arg)
            if op == "put":
                queue.put(record)
                stored.add(record)
                unreleased[record] += 1
            else:
                hold = queue.put_held(record)
                if hold is not None:
                    stored.add(record)
                    held.append((record, hold))
                    unreleased[record] += 1
        elif op == "get":
            got = queue.get_held()
            if got is not None:
                held.append(got)
        elif held:
            record, hold = held.pop(arg % len(held))
            queue.release(hold)
            unreleased[record] -= 1
    queue.close()
    side_file = directory / "q.diskqueue.held.dat"
    for side in (True, False):  # without it, as after Go ran on the directory
        copy = directory / ("ours" if side else "go")
        copy.mkdir()
        for path in directory.glob("q.*"):
            if side or path != side_file:
                shutil.copy(path, copy / path.name)
        reopened = held_queue(copy, max_bytes=300)
        found: Counter[bytes] = Counter()
        while (got := reopened.get_held()) is not None:
            found[got[0]] += 1
        reopened.close()
        assert not +(unreleased - found), "records lost"
        assert set(found) <= stored, "records never put"
        assert max(found.values(), default=1) == 1, "a record read twice"
        if side:  # the side file written at close: exactly the unreleased records come back
            assert found == +unreleased


def test_side_file_skips_records_finished_before_the_restart(tmp_path: Path) -> None:
    queue = held_queue(tmp_path)
    for i in range(6):
        queue.put(b"r%d" % i + bytes(8))
    taken = [take(queue) for _ in range(5)]
    for index in (1, 2, 4):
        queue.release(taken[index][1])
    queue.close()  # r0 and r3 unfinished, r5 never read
    assert read_meta(tmp_path, "q")[1:3] == (0, 0)

    reopened = held_queue(tmp_path)
    assert [take(reopened)[0][:2] for _ in range(3)] == [b"r0", b"r3", b"r5"]
    assert reopened.get_held() is None
    reopened.close()


def test_side_file_about_other_records_is_ignored(tmp_path: Path) -> None:
    """The queue was deleted and written again by someone else (Go): the side file's boundary
    record is not there byte for byte, so nothing is skipped."""
    queue = held_queue(tmp_path)
    for i in range(4):
        queue.put(b"r%d" % i + bytes(8))
    take(queue)
    queue.release(take(queue)[1])
    queue.close()
    side = (tmp_path / "q.diskqueue.held.dat").read_bytes()
    for path in tmp_path.glob("q.diskqueue.*"):
        path.unlink()
    again = held_queue(tmp_path)
    for i in range(4):
        again.put(b"n%d" % i + bytes(8))  # the same sizes at the same places
    again.close()
    (tmp_path / "q.diskqueue.held.dat").write_bytes(side)

    reopened = held_queue(tmp_path)
    assert [take(reopened)[0][:2] for _ in range(4)] == [b"n0", b"n1", b"n2", b"n3"]
    reopened.close()


def test_get_on_a_held_queue_takes_the_record_for_good(tmp_path: Path) -> None:
    """A plain get() (e.g. --queue-full-policy=drop-oldest dropping the head) holds nothing;
    positions() is the reader's, committed_positions() the metadata's."""
    queue = held_queue(tmp_path)
    for i in range(3):
        queue.put(b"r%d" % i + bytes(8))
    held = take(queue)
    assert queue.get() == b"r1" + bytes(8)
    assert queue.positions() == (1, 0, 28, 0, 42)
    assert queue.committed_positions() == (3, 0, 0, 0, 42)
    queue.release(held[1])
    assert queue.committed_positions() == (1, 0, 28, 0, 42)
    queue.close()
