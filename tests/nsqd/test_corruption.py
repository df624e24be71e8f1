"""A real nsqd on damaged data directories: it starts, serves what is readable, logs what it
skipped, and keeps accepting messages. As go-diskqueue, a read error (a short read, a length
out of bounds) renames the file to ``.bad`` and reading goes on with the next file.

Every directory is built byte by byte from the format description (nsqd_storage_support), so
the damage is exactly the one each test names.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Sequence
from pathlib import Path

import pytest

from nsqpy.testing import DaemonProcess

from ..raw_v2 import Message, NsqConn, channel_stats, http_ok, stats, topic_stats, wait_until
from .nsqd_storage_support import (
    consume_from,
    data_file,
    encode_message,
    frame_record,
    launch,
    log_lines_now,
    log_since,
    make_id,
    meta_bytes,
    meta_file,
    nsqd_dat,
    queue_payloads,
    read_meta,
    run_nsqd_to_exit,
    start_again,
    subscriber,
    write_queue,
)

TIMESTAMP = 1_700_000_000_000_000_000


def payload(number: int) -> bytes:
    return encode_message(Message(TIMESTAMP + number, 0, make_id(number), b"body %d" % number))


def payloads(numbers: Sequence[int]) -> list[bytes]:
    return [payload(n) for n in numbers]


def body(number: int) -> bytes:
    return b"body %d" % number


QUEUE_KINDS = ["topic", "channel"]


def prepare(directory: Path, queue_kind: str) -> str:
    """nsqd.dat with topic t and channel c; returns the queue name that holds the messages."""
    (directory / "nsqd.dat").write_bytes(nsqd_dat([("t", False, [("c", False)])]))
    return "t" if queue_kind == "topic" else "t:c"


def assert_serves(nsqd: DaemonProcess, numbers: Sequence[int]) -> None:
    """Channel c of topic t delivers exactly these messages to a consumer that is ready for
    more, and then has nothing left (the reader has run into whatever damage follows)."""
    conn = subscriber(nsqd, "t", "c")
    conn.rdy(len(numbers) + 10)
    received = [conn.expect_message() for _ in numbers]
    for msg in received:
        conn.fin(msg.id)
    conn.expect_nothing(0.3)
    conn.close()
    assert sorted(m.body for m in received) == sorted(body(n) for n in numbers)
    for msg in received:
        number = int(msg.body.split()[1])
        assert (msg.id, msg.timestamp, msg.attempts) == (make_id(number), TIMESTAMP + number, 1)
    wait_until(lambda: (channel_stats(nsqd, "t", "c") or {}).get("depth") == 0, what="depth 0")
    assert (topic_stats(nsqd, "t") or {})["depth"] == 0


def assert_accepts_new_messages(nsqd: DaemonProcess) -> None:
    conn = NsqConn(nsqd.tcp_address)
    conn.mpub("t", [b"fresh 1", b"fresh 2"])
    conn.close()
    received = consume_from(nsqd, "t", "c", 2)
    assert sorted(m.body for m in received) == [b"fresh 1", b"fresh 2"]
    assert (channel_stats(nsqd, "t", "c") or {})["depth"] == 0


def assert_logged(log: str, *patterns: str) -> None:
    for pattern in patterns:
        assert re.search(pattern, log), f"no log line matches {pattern!r}:\n{log}"


# ------------------------------------------------------------------------------ damaged data


@pytest.mark.parametrize("queue_kind", QUEUE_KINDS)
def test_truncated_data_file_serves_the_records_before_the_cut(
    tmp_path: Path, daemons: list[DaemonProcess], queue_kind: str
) -> None:
    queue = prepare(tmp_path, queue_kind)
    first, _ = write_queue(tmp_path, queue, [payloads(range(5)), payloads(range(5, 8))])
    data = first.read_bytes()
    cut_record_at = len(b"".join(frame_record(p) for p in payloads(range(4))))
    first.write_bytes(data[:-10])  # record 4 loses its last 10 bytes

    nsqd = launch(daemons, tmp_path)
    assert_serves(nsqd, [0, 1, 2, 3, 5, 6, 7])
    name = re.escape(queue)
    assert_logged(
        nsqd.log,
        rf"ERROR: DISKQUEUE\({name}\) reading at {cut_record_at} of {re.escape(str(first))}"
        r" - unexpected EOF",
        rf"WARNING: DISKQUEUE\({name}\) jump to next file and saving bad file as "
        + re.escape(f"{first}.bad"),
    )
    assert Path(f"{first}.bad").read_bytes() == data[:-10]
    assert_accepts_new_messages(nsqd)


GARBAGE_LENGTHS = {
    "too long": 0x7FFFFFFF,
    "shorter than a message header": 5,
    "negative": -7,
}


@pytest.mark.parametrize("garbage", list(GARBAGE_LENGTHS))
@pytest.mark.parametrize("queue_kind", QUEUE_KINDS)
def test_garbage_record_skips_the_rest_of_its_file(
    tmp_path: Path, daemons: list[DaemonProcess], queue_kind: str, garbage: str
) -> None:
    queue = prepare(tmp_path, queue_kind)
    length = GARBAGE_LENGTHS[garbage]
    first, second = write_queue(tmp_path, queue, [payloads([0, 1]), payloads([3, 4])])
    good = first.read_bytes()
    # a record with a length no reader can trust, then one it can no longer find
    first.write_bytes(good + struct.pack(">i", length) + bytes(40) + frame_record(payload(2)))
    meta_file(tmp_path, queue).write_bytes(meta_bytes(5, 0, 0, 1, second.stat().st_size))

    nsqd = launch(daemons, tmp_path)
    assert_serves(nsqd, [0, 1, 3, 4])
    assert_logged(
        nsqd.log,
        rf"ERROR: DISKQUEUE\({re.escape(queue)}\) reading at {len(good)} of "
        rf"{re.escape(str(first))} - invalid message read size \({length}\)",
        r"WARNING: DISKQUEUE\(.*\) jump to next file and saving bad file as "
        + re.escape(f"{first}.bad"),
    )
    assert_accepts_new_messages(nsqd)


# ------------------------------------------------------------------------------ metadata ahead


@pytest.mark.parametrize("queue_kind", QUEUE_KINDS)
def test_metadata_ahead_of_the_data_serves_what_exists(
    tmp_path: Path, daemons: list[DaemonProcess], queue_kind: str
) -> None:
    """The recorded write position is past the end of the file (data lost after the metadata
    was written): the existing records are served, then the end of data is reported, the file
    is set aside and the depth that can no longer be reached is dropped."""
    queue = prepare(tmp_path, queue_kind)
    (first,) = write_queue(tmp_path, queue, [payloads(range(4))])
    size = first.stat().st_size
    meta_file(tmp_path, queue).write_bytes(meta_bytes(10, 0, 0, 0, size + 600))

    nsqd = launch(daemons, tmp_path)
    assert_serves(nsqd, range(4))
    name = re.escape(queue)
    assert_logged(
        nsqd.log,
        rf"ERROR: DISKQUEUE\({name}\) reading at {size} of {re.escape(str(first))} - EOF",
        rf"WARNING: DISKQUEUE\({name}\) jump to next file and saving bad file as "
        + re.escape(f"{first}.bad"),
        rf"ERROR: DISKQUEUE\({name}\) positive depth at tail \(6\), data loss, resetting 0",
    )
    assert_accepts_new_messages(nsqd)


@pytest.mark.parametrize("queue_kind", QUEUE_KINDS)
def test_metadata_naming_a_missing_data_file(
    tmp_path: Path, daemons: list[DaemonProcess], queue_kind: str
) -> None:
    queue = prepare(tmp_path, queue_kind)
    write_queue(tmp_path, queue, [payloads(range(3))])
    missing = data_file(tmp_path, queue, 1)
    meta_file(tmp_path, queue).write_bytes(meta_bytes(6, 0, 0, 1, 500))

    nsqd = launch(daemons, tmp_path)
    assert_serves(nsqd, range(3))
    assert_logged(
        nsqd.log,
        rf"ERROR: DISKQUEUE\({re.escape(queue)}\) reading at 0 of {re.escape(str(missing))} - ",
    )
    assert_accepts_new_messages(nsqd)


# ------------------------------------------------------------------------------ metadata behind


@pytest.mark.parametrize("queue_kind", QUEUE_KINDS)
def test_metadata_behind_the_data_salvages_the_unrecorded_records(
    tmp_path: Path, daemons: list[DaemonProcess], queue_kind: str
) -> None:
    """A crash after writes the metadata never recorded (Go's "writePos < file size" case)."""
    queue = prepare(tmp_path, queue_kind)
    (first,) = write_queue(tmp_path, queue, [payloads(range(6))])
    recorded = len(b"".join(frame_record(p) for p in payloads(range(2))))
    meta_file(tmp_path, queue).write_bytes(meta_bytes(2, 0, 0, 0, recorded))
    size = first.stat().st_size

    nsqd = launch(daemons, tmp_path)
    assert_serves(nsqd, range(6))
    assert_logged(
        nsqd.log,
        rf"WARNING: DISKQUEUE\({re.escape(queue)}\) {re.escape(str(first))} metadata writePos "
        rf"{recorded} < file size of {size}, skipping to new file",
    )
    assert_accepts_new_messages(nsqd)
    wait_until(lambda: not first.exists(), what="the salvaged file deleted once read")


@pytest.mark.parametrize("queue_kind", QUEUE_KINDS)
def test_metadata_behind_the_data_by_a_whole_file(
    tmp_path: Path, daemons: list[DaemonProcess], queue_kind: str
) -> None:
    """A crash after a roll whose metadata sync never happened: a data file after the recorded
    write file exists. Go would reopen it for writing at position 0 and overwrite it; nsqpy
    salvages it (a documented improvement)."""
    queue = prepare(tmp_path, queue_kind)
    first, _ = write_queue(tmp_path, queue, [payloads(range(3)), payloads(range(3, 5))])
    meta_file(tmp_path, queue).write_bytes(meta_bytes(3, 0, 0, 0, first.stat().st_size))

    nsqd = launch(daemons, tmp_path)
    assert_serves(nsqd, range(5))
    assert_logged(nsqd.log, rf"WARNING: DISKQUEUE\({re.escape(queue)}\) data files .* newer than")
    assert_accepts_new_messages(nsqd)


@pytest.mark.parametrize("queue_kind", QUEUE_KINDS)
def test_data_without_queue_metadata_is_salvaged(
    tmp_path: Path, daemons: list[DaemonProcess], queue_kind: str
) -> None:
    """A crash before the first sync: the data file exists, its metadata file does not."""
    queue = prepare(tmp_path, queue_kind)
    write_queue(tmp_path, queue, [payloads(range(4))])
    meta_file(tmp_path, queue).unlink()

    nsqd = launch(daemons, tmp_path)
    assert_serves(nsqd, range(4))
    assert_logged(nsqd.log, rf"WARNING: DISKQUEUE\({re.escape(queue)}\) .* skipping to new file")
    assert_accepts_new_messages(nsqd)


@pytest.mark.parametrize("queue_kind", QUEUE_KINDS)
def test_unparsable_queue_metadata_is_logged_and_the_data_salvaged(
    tmp_path: Path, daemons: list[DaemonProcess], queue_kind: str
) -> None:
    queue = prepare(tmp_path, queue_kind)
    write_queue(tmp_path, queue, [payloads(range(4))])
    meta_file(tmp_path, queue).write_bytes(b"not\nmetadata\n")

    nsqd = launch(daemons, tmp_path)
    assert_serves(nsqd, range(4))
    assert_logged(
        nsqd.log, rf"ERROR: DISKQUEUE\({re.escape(queue)}\) failed to retrieveMetaData - "
    )
    assert_accepts_new_messages(nsqd)
    # rewritten in the format again (read_meta checks it), and up to date after the next sync
    wait_until(lambda: read_meta(tmp_path, queue).depth == 0, timeout=5, what="metadata")


# ------------------------------------------------------------------------------ nsqd.dat


def test_queue_files_missing_from_nsqd_dat_are_restored_at_start_up(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """nsqd.dat behind the data (a crash before the topic's metadata write). Go recreates the
    topic only when it is used again, so consumers cannot find it meanwhile; we restore every
    topic and channel that has queue files, and keep what nsqd.dat says of the listed ones."""
    (tmp_path / "nsqd.dat").write_bytes(nsqd_dat([("listed", True, [])]))
    write_queue(tmp_path, "t", [payloads(range(3))])
    write_queue(tmp_path, "t:c", [payloads(range(3, 5))])
    write_queue(tmp_path, "listed:lost", [payloads([9])])
    (tmp_path / "other.diskqueue.000000.dat.bad").write_bytes(b"junk")  # renamed, not a queue

    nsqd = launch(daemons, tmp_path)
    assert sorted(t["topic_name"] for t in stats(nsqd)["topics"]) == ["listed", "t"]
    assert (topic_stats(nsqd, "listed") or {})["paused"] is True
    assert (channel_stats(nsqd, "listed", "lost") or {})["depth"] == 1
    log = log_since(nsqd, 0)
    assert "TOPIC(t): found on disk but not in nsqd.dat, restored" in log
    assert "TOPIC(t): CHANNEL(c): found on disk but not in nsqd.dat, restored" in log
    assert "TOPIC(listed): CHANNEL(lost): found on disk but not in nsqd.dat, restored" in log
    metadata = json.loads((tmp_path / "nsqd.dat").read_bytes())
    assert [(t["name"], [c["name"] for c in t["channels"]]) for t in metadata["topics"]] == [
        ("listed", ["lost"]),
        ("t", ["c"]),
    ]
    assert_serves(nsqd, range(5))  # the topic's 3 went on to its channel, which held 2
    assert_accepts_new_messages(nsqd)


def test_nsqd_dat_ahead_of_the_data_starts_empty_queues(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    (tmp_path / "nsqd.dat").write_bytes(nsqd_dat([("t", False, [("c", True)])]))
    nsqd = launch(daemons, tmp_path)
    channel = channel_stats(nsqd, "t", "c") or {}
    assert (channel["depth"], channel["paused"]) == (0, True)
    http_ok(nsqd, "POST", "/channel/unpause?topic=t&channel=c")
    assert_accepts_new_messages(nsqd)


def test_unparsable_nsqd_dat_refuses_to_start_like_go(tmp_path: Path) -> None:
    path = tmp_path / "nsqd.dat"
    path.write_bytes(b'{"topics":[{"name":')
    code, stderr = run_nsqd_to_exit(tmp_path)
    assert code == 1
    assert re.search(
        rf"FATAL: failed to load metadata - failed to parse metadata in {re.escape(str(path))} - ",
        stderr,
    ), stderr
    assert path.read_bytes() == b'{"topics":[{"name":', "left for the operator to inspect"


# ------------------------------------------------------------------------------ deferred file


def stop_with_one_deferred_message(daemons: list[DaemonProcess], directory: Path) -> DaemonProcess:
    nsqd = launch(daemons, directory)
    http_ok(nsqd, "POST", "/topic/create?topic=t")
    http_ok(nsqd, "POST", "/channel/create?topic=t&channel=c")
    conn = NsqConn(nsqd.tcp_address)
    conn.dpub("t", 60_000, b"deferred")
    conn.close()
    wait_until(lambda: (channel_stats(nsqd, "t", "c") or {}).get("deferred_count") == 1)
    assert nsqd.stop() == 0
    assert (directory / "nsqpy.deferred.json").exists()
    return nsqd


def test_unreadable_deferred_file_is_ignored_and_messages_come_from_the_queue(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    nsqd = stop_with_one_deferred_message(daemons, tmp_path)
    (tmp_path / "nsqpy.deferred.json").write_bytes(b"\x00garbage")
    first_line = log_lines_now(nsqd)
    start_again(nsqd)
    assert_logged(log_since(nsqd, first_line), r"ERROR: ignoring deferred messages: ")
    received = consume_from(nsqd, "t", "c", 1, timeout=3)  # due at once, as in Go
    assert [m.body for m in received] == [b"deferred"]
    assert not (tmp_path / "nsqpy.deferred.json").exists()
    assert_accepts_new_messages(nsqd)


def test_deferred_file_is_not_trusted_once_the_queue_has_changed(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """Another process (a Go nsqd) wrote to the queue after our shutdown: our record of its
    positions no longer matches, so the deferred messages are delivered when read, as Go does,
    and nothing is delivered twice or lost."""
    nsqd = stop_with_one_deferred_message(daemons, tmp_path)
    meta = read_meta(tmp_path, "t:c")
    path = data_file(tmp_path, "t:c", meta.write_num)
    extra = encode_message(Message(TIMESTAMP, 0, make_id(99), b"written by go"))
    with path.open("ab") as handle:
        handle.write(frame_record(extra))
    size = path.stat().st_size
    meta_file(tmp_path, "t:c").write_bytes(
        meta_bytes(meta.depth + 1, meta.read_num, meta.read_pos, meta.write_num, size)
    )
    assert [p[26:] for p in queue_payloads(tmp_path, "t:c")] == [b"deferred", b"written by go"]

    first_line = log_lines_now(nsqd)
    start_again(nsqd)
    assert_logged(log_since(nsqd, first_line), r"WARNING: DISKQUEUE\(t:c\): changed since shutdown")
    received = consume_from(nsqd, "t", "c", 2, timeout=3)
    assert sorted(m.body for m in received) == [b"deferred", b"written by go"]
    assert (channel_stats(nsqd, "t", "c") or {})["deferred_count"] == 0
    assert_accepts_new_messages(nsqd)
