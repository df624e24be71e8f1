"""nsqd's data directory against Go's format: go-diskqueue's data and metadata files, nsqd.dat,
and what a clean shutdown writes (nsqd_storage_support states the format).

Both directions: a directory built byte by byte as Go nsqd writes it opens with every message
(IDs, timestamps, attempts, bodies, pause state), and the files a real nsqd writes parse back
under the same description (nsqd_storage_support holds the independent format code).
"""

from __future__ import annotations

import json
import re
import stat
import time
from pathlib import Path

from nsqpy.testing import DaemonProcess

from ..raw_v2 import (
    Message,
    NsqConn,
    channel_stats,
    decode_message,
    http_ok,
    stats,
    topic_stats,
    wait_until,
)
from .nsqd_storage_support import (
    consume,
    data_file,
    encode_message,
    frame_record,
    launch,
    make_id,
    meta_file,
    nsqd_dat,
    parse_records,
    queue_payloads,
    read_meta,
    start_again,
    subscriber,
    write_queue,
)

MAX_BYTES = 1024
GO_ID = re.compile(rb"[0-9a-f]{16}")


# ------------------------------------------------------------------------------ reading Go's


def go_message(number: int, attempts: int = 0, size: int = 300) -> Message:
    """A message as Go stores it; 300-byte bodies make 330-byte records, three per 1 KiB file."""
    body = (b"%d:" % number + bytes(range(256)) * 2)[:size]
    return Message(1_690_000_000_123_456_789 + number * 1_000_003, attempts, make_id(number), body)


def records(msgs: list[Message]) -> list[bytes]:
    return [encode_message(m) for m in msgs]


def as_delivered(msgs: list[Message]) -> set[Message]:
    """What a consumer receives for stored messages: the same message, one more attempt."""
    return {Message(m.timestamp, m.attempts + 1, m.id, m.body) for m in msgs}


def test_opens_a_data_directory_written_as_go_would(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    topic_msgs = [go_message(n) for n in range(5)]  # topic records are never delivered yet
    billing = [go_message(10, 1), go_message(11, 2), go_message(12, 5)]
    audit = [go_message(20, 1), go_message(21, 0)]
    idle = [go_message(30), go_message(31, size=26)]
    (tmp_path / "nsqd.dat").write_bytes(
        nsqd_dat(
            [
                ("orders", False, [("billing", False), ("audit", True), ("bad/chan", False)]),
                ("idle", True, []),
                ("bad topic!", False, []),
            ]
        )
    )
    # a full first file (a fourth 330-byte record would not fit in 1024 bytes), then the rest
    write_queue(tmp_path, "orders", [records(topic_msgs[:3]), records(topic_msgs[3:])])
    # files 0-2 were consumed and deleted, billing[0] is consumed but its file is still current
    write_queue(tmp_path, "orders:billing", [records(billing)], first_num=3, read_pos=330)
    write_queue(tmp_path, "orders:audit", [records(audit)])
    write_queue(tmp_path, "idle", [records(idle)])
    assert read_meta(tmp_path, "orders:billing").depth == 2

    nsqd = launch(daemons, tmp_path, f"--max-bytes-per-file={MAX_BYTES}")
    assert "skipping creation of invalid topic bad topic!" in nsqd.log
    assert "skipping creation of invalid channel bad/chan" in nsqd.log
    assert [t["topic_name"] for t in stats(nsqd)["topics"]] == ["idle", "orders"]
    idle_stats = topic_stats(nsqd, "idle") or {}
    assert (idle_stats["paused"], idle_stats["depth"]) == (True, 2)
    assert (topic_stats(nsqd, "orders") or {})["paused"] is False
    wait_until(lambda: (topic_stats(nsqd, "orders") or {}).get("depth") == 0, what="fan-out")
    billing_stats = channel_stats(nsqd, "orders", "billing") or {}
    audit_stats = channel_stats(nsqd, "orders", "audit") or {}
    assert (billing_stats["paused"], billing_stats["depth"]) == (False, 2 + 5)
    assert (audit_stats["paused"], audit_stats["depth"]) == (True, 2 + 5)

    got = consume(subscriber(nsqd, "orders", "billing"), 7)
    assert set(got) == as_delivered(billing[1:] + topic_msgs)

    audit_conn = subscriber(nsqd, "orders", "audit")
    audit_conn.rdy(10)
    audit_conn.expect_nothing(0.3)  # paused, as nsqd.dat says
    http_ok(nsqd, "POST", "/channel/unpause?topic=orders&channel=audit")
    got = [audit_conn.expect_message() for _ in range(7)]
    assert set(got) == as_delivered(audit + topic_msgs)

    idle_conn = subscriber(nsqd, "idle", "c")
    idle_conn.rdy(10)
    idle_conn.expect_nothing(0.3)
    http_ok(nsqd, "POST", "/topic/unpause?topic=idle")
    got = [idle_conn.expect_message() for _ in range(2)]
    assert set(got) == as_delivered(idle)


# ------------------------------------------------------------------------------ what we write


def check_nsqd_dat(path: Path, expected: dict[str, tuple[bool, dict[str, bool] | None]]) -> None:
    """Go's json.Marshal of the Metadata struct: compact, struct field order, null for none."""
    raw = path.read_bytes()
    parsed = json.loads(raw)
    assert json.dumps(parsed, separators=(",", ":")).encode() == raw, "not compact Go JSON"
    pairs = json.loads(raw, object_pairs_hook=list)
    assert [key for key, _ in pairs] == ["topics", "version"]
    assert parsed["version"] == "1.3.0"
    found: dict[str, tuple[bool, dict[str, bool] | None]] = {}
    for topic in dict(pairs)["topics"]:
        assert [key for key, _ in topic] == ["name", "paused", "channels"]
        entry = dict(topic)
        channels = None
        if entry["channels"] is not None:
            channels = {}
            for channel in entry["channels"]:
                assert [key for key, _ in channel] == ["name", "paused"]
                channels[dict(channel)["name"]] = dict(channel)["paused"]
            assert channels, "an empty channel list is null"
        found[entry["name"]] = (entry["paused"], channels)
    assert found == expected


def check_queue_files(directory: Path, queue: str) -> list[Message]:
    """Every rule of go-diskqueue's files for one queue (file names, records within size bounds,
    files read before the read position deleted, depth as recorded); returns its unread messages
    in order."""
    meta = read_meta(directory, queue)  # asserts "%d\n%d,%d\n%d,%d\n" exactly
    for num in range(meta.read_num):
        assert not data_file(directory, queue, num).exists(), "consumed files are deleted"
    sizes = {}
    first_records = {}
    for num in range(meta.read_num, meta.write_num + 1):
        path = data_file(directory, queue, num)
        if not path.exists():
            assert (num, meta.write_pos) == (meta.write_num, 0), f"{path.name} is missing"
            continue
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        data = path.read_bytes()
        file_records = parse_records(data)  # ends exactly on a record boundary
        sizes[num] = len(data)
        first_records[num] = file_records[0]
        assert len(data) <= MAX_BYTES or len(file_records) == 1
    for num in range(meta.read_num, meta.write_num):  # a file ends only when the next won't fit
        if num + 1 in first_records:
            assert sizes[num] + 4 + len(first_records[num + 1]) > MAX_BYTES
    if meta.write_num in sizes:
        assert meta.write_pos == sizes[meta.write_num]
    payloads = queue_payloads(directory, queue)
    assert meta.depth == len(payloads)
    return [decode_message(p) for p in payloads]


def test_files_we_write_follow_the_format_description(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=0", f"--max-bytes-per-file={MAX_BYTES}")
    http_ok(nsqd, "POST", "/topic/create?topic=fanned")
    http_ok(nsqd, "POST", "/channel/create?topic=fanned&channel=c1")
    http_ok(nsqd, "POST", "/channel/create?topic=fanned&channel=c2")
    http_ok(nsqd, "POST", "/channel/pause?topic=fanned&channel=c1")
    http_ok(nsqd, "POST", "/topic/create?topic=stopped")
    http_ok(nsqd, "POST", "/topic/pause?topic=stopped")
    plain = [b"plain %02d " % i + bytes([i]) * (100 + 7 * i) for i in range(20)]
    fanned = [b"fanned %d " % i + b"\n" * (150 + i) for i in range(8)]
    started_ns = time.time_ns()
    conn = NsqConn(nsqd.tcp_address)
    for body in plain[:10]:
        conn.pub("plain", body)
    conn.mpub("plain", plain[10:])
    for body in fanned:
        conn.pub("fanned", body)
    conn.mpub("stopped", [b"s1", b"s2"])
    conn.close()
    finished_ns = time.time_ns()
    consumed = consume(subscriber(nsqd, "fanned", "c2"), 3)
    assert [m.body for m in consumed] == fanned[:3]
    assert nsqd.stop() == 0

    check_nsqd_dat(
        tmp_path / "nsqd.dat",
        {
            "fanned": (False, {"c1": True, "c2": False}),
            "plain": (False, None),
            "stopped": (True, None),
        },
    )
    assert stat.S_IMODE((tmp_path / "nsqd.dat").stat().st_mode) == 0o600
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert not leftovers
    assert not (tmp_path / "nsqpy.deferred.json").exists()
    for queue in ("plain", "fanned", "fanned:c1", "fanned:c2", "stopped"):
        assert stat.S_IMODE(meta_file(tmp_path, queue).stat().st_mode) == 0o600

    plain_msgs = check_queue_files(tmp_path, "plain")
    assert len(list(tmp_path.glob("plain.diskqueue.*.dat"))) > 2, "files rolled"
    assert [m.body for m in plain_msgs] == plain
    assert check_queue_files(tmp_path, "fanned") == []
    c1 = check_queue_files(tmp_path, "fanned:c1")
    c2 = check_queue_files(tmp_path, "fanned:c2")
    assert [m.body for m in c1] == fanned
    assert c2 == c1[3:], "each channel stores the same message (ID, timestamp, body)"
    stopped = check_queue_files(tmp_path, "stopped")
    assert [m.body for m in stopped] == [b"s1", b"s2"]
    for topic_msgs in (plain_msgs, c1, stopped):  # IDs are unique per topic (Go's GUIDs)
        assert len({m.id for m in topic_msgs}) == len(topic_msgs)
        for msg in topic_msgs:
            assert GO_ID.fullmatch(msg.id), msg.id
            assert started_ns <= msg.timestamp <= finished_ns
            assert msg.attempts == 0

    start_again(nsqd)  # and what we wrote opens again
    assert (topic_stats(nsqd, "plain") or {})["depth"] == 20
    assert (channel_stats(nsqd, "fanned", "c2") or {})["depth"] == 5


def test_shutdown_writes_memory_then_in_flight_then_deferred_like_go(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """What a clean shutdown writes, in Go's order: a channel's memory queue, then its in-flight
    messages, then its deferred ones, with attempts as they stand; a topic's memory queue
    (deferred messages included)."""
    nsqd = launch(daemons, tmp_path)
    http_ok(nsqd, "POST", "/topic/create?topic=t")
    http_ok(nsqd, "POST", "/channel/create?topic=t&channel=c")
    conn = NsqConn(nsqd.tcp_address)
    for i in range(6):
        conn.pub("t", b"m%d" % i)
    conn.dpub("t", 60_000, b"d0")
    conn.dpub("t", 60_000, b"d1")
    conn.pub("held", b"h0")
    conn.dpub("held", 60_000, b"hd")
    conn.pub("held", b"h1")
    consumer = subscriber(nsqd, "t", "c")
    consumer.rdy(2)
    first, second = consumer.expect_message(), consumer.expect_message()
    consumer.rdy(0)
    consumer.req(second.id, 60_000)
    wait_until(lambda: (channel_stats(nsqd, "t", "c") or {}).get("deferred_count") == 3)
    assert nsqd.stop() == 0
    conn.close()
    consumer.close()

    stored = check_channel_flush(tmp_path)
    assert [(m.body, m.attempts) for m in stored[:4]] == [(b"m%d" % i, 0) for i in range(2, 6)]
    assert [(m.body, m.attempts) for m in stored[4:5]] == [(first.body, 1)]
    assert {(m.body, m.attempts) for m in stored[5:]} == {(second.body, 1), (b"d0", 0), (b"d1", 0)}
    assert stored[4].id == first.id and stored[4].timestamp == first.timestamp
    held = [m.body for m in check_queue_files(tmp_path, "held")]
    assert held == [b"h0", b"hd", b"h1"]
    side = json.loads((tmp_path / "nsqpy.deferred.json").read_bytes())
    assert set(side["queues"]) == {"t:c", "held"}


def check_channel_flush(directory: Path) -> list[Message]:
    stored = check_queue_files(directory, "t:c")
    assert len(stored) == 8
    assert check_queue_files(directory, "t") == []
    return stored


def test_records_are_framed_with_a_big_endian_length(tmp_path: Path) -> None:
    """The support code itself, on a record spelled out by hand: the tests above rely on it."""
    msg = Message(0x0102030405060708, 0x090A, b"0123456789abcdef", b"hi")
    record = frame_record(encode_message(msg))
    assert record == (
        b"\x00\x00\x00\x1c"
        + b"\x01\x02\x03\x04\x05\x06\x07\x08"
        + b"\x09\x0a"
        + b"0123456789abcdef"
        + b"hi"
    )
    assert [decode_message(p) for p in parse_records(record * 2)] == [msg, msg]
    write_queue(tmp_path, "q", [[encode_message(msg)]])
    assert meta_file(tmp_path, "q").read_bytes() == b"1\n0,0\n0,32\n"
