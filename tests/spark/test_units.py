"""Options, planning and staging: the connector's pure parts, no Spark and no nsqd."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from nsqpy.spark.options import NSQOptionError, parse_sink_options, parse_source_options
from nsqpy.spark.plan import (
    INITIAL_OFFSET,
    allocate,
    make_offset,
    partitions_for,
    read_tasks,
    split_messages,
    tick_of_key,
)
from nsqpy.spark.staging import STAGED_SCHEMA, Staging, StagingError

BASE = {
    "lookupd": "127.0.0.1:4161",
    "topic": "clicks",
    "channel": "archive",
    "stagingLocation": "/tmp/x",
}


def source(**changes: str | None) -> dict[str, str]:
    options = dict(BASE)
    for key, value in changes.items():
        if value is None:
            options.pop(key, None)
        else:
            options[key] = value
    return options


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"topic": None}, "option 'topic' is required"),
        ({"channel": None}, "option 'channel' is required"),
        ({"channel": "archive#ephemeral"}, "is ephemeral"),
        ({"stagingLocation": None}, "'stagingLocation' is required"),
        ({"lookupd": None}, "give 'lookupd'"),
        ({"nsqd": "127.0.0.1:4150"}, "either 'lookupd' or 'nsqd'"),
        ({"topic": "bad topic"}, "invalid topic name"),
        ({"topicPattern": "c.*"}, "either 'topic' or 'topicPattern'"),
        ({"lookupd": "nohost"}, "expected host:port"),
        ({"maxMessagesPerTrigger": "ten"}, "must be an integer"),
        ({"maxMessagesPerTrigger": "10", "minMessagesPerTrigger": "20"}, "exceeds"),
        ({"poisonPolicy": "explode"}, "'poisonPolicy' must be one of"),
        ({"poisonPolicy": "deadletter"}, "needs 'deadLetterTopic'"),
        ({"waitMs": "soon"}, "milliseconds or a duration"),
        ({"nsq.sample_rate": "10"}, "silently lose"),
        ({"nsq.bogus": "1"}, "unknown option 'nsq.bogus'"),
        ({"nsq.tls_root_ca_file": "/ca.pem"}, "TLS is off"),
        ({"stagingLocation": "s3://bucket/x"}, "only file paths"),
        ({"maxMessages": "5"}, "for batch reads"),
    ],
)
def test_source_option_errors_say_what_to_do(changes: dict[str, str | None], message: str) -> None:
    with pytest.raises(NSQOptionError, match=message):
        parse_source_options(source(**changes), streaming=True)


def test_source_options_parse_and_are_case_insensitive() -> None:
    options = parse_source_options(
        source(
            MAXMESSAGESPERTRIGGER="5000",
            waitMs="1.5s",
            readersPerNsqd="3",
            **{"nsq.msg_timeout": "30s", "nsq.snappy": "true"},
        ),
        streaming=True,
    )
    assert options.max_messages_per_trigger == 5000
    assert options.wait == 1.5
    assert options.readers_per_nsqd == 3
    assert dict(options.connection) == {"msg_timeout": "30s", "snappy": "true"}
    assert options.create_channel is True and options.include_metadata is True


def test_sink_options() -> None:
    with pytest.raises(NSQOptionError, match="give 'nsqd'"):
        parse_sink_options({"topic": "t"})
    options = parse_sink_options({"nsqd": "127.0.0.1:4150,127.0.0.1:4250", "batchSize": "7"})
    assert options.nsqd == ("127.0.0.1:4150", "127.0.0.1:4250")
    assert options.batch_size == 7 and options.topic is None


def test_sink_says_which_columns_it_does_not_publish(caplog: pytest.LogCaptureFixture) -> None:
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    from nsqpy.spark.sink import check_sink_schema

    options = parse_sink_options({"nsqd": "127.0.0.1:4150", "topic": "t"})
    needed = [StructField("body", BinaryType()), StructField("defer_ms", LongType())]
    with caplog.at_level("WARNING", logger="nsqpy.spark"):
        check_sink_schema(StructType(needed), options)
        assert not caplog.records
        check_sink_schema(StructType([*needed, StructField("nsqd", StringType())]), options)
    assert "columns nsqd are not published" in caplog.text


def test_allocate_respects_the_budget_in_proportion() -> None:
    assert allocate({"a": 10, "b": 30}, None) == {"a": 10, "b": 30}
    shares = allocate({"a": 10, "b": 30}, 20)
    assert shares == {"a": 5, "b": 15}
    odd = allocate({"a": 1, "b": 1, "c": 1}, 2)
    assert sum(odd.values()) == 2 and max(odd.values()) == 1
    assert odd == allocate({"c": 1, "b": 1, "a": 1}, 2)  # deterministic


def test_split_and_partition_counts() -> None:
    assert [split_messages(10, 3, j) for j in range(3)] == [4, 3, 3]
    assert partitions_for(0, 2, 100) == 0
    assert partitions_for(1, 2, 100) == 1
    assert partitions_for(50, 2, 100) == 2
    assert partitions_for(450, 2, 100) == 5


def test_read_tasks_are_a_pure_function_of_the_offsets() -> None:
    end = make_offset(3, {"t": {"127.0.0.1:4250": (2, 5), "127.0.0.1:4150": (1, 7)}})
    # keys in a stable order: the JSON text is what Spark compares
    assert json.dumps(end) == (
        '{"tick": 3, "topics": {"t": {"127.0.0.1:4150": [1, 7], "127.0.0.1:4250": [2, 5]}}}'
    )
    start = {"tick": 2, "topics": {}}
    tasks = read_tasks(start, end)
    assert [(t.key, t.messages) for t in tasks] == [
        ("t3-t-127.0.0.1_4150-r0", 7),
        ("t3-t-127.0.0.1_4250-r0", 3),
        ("t3-t-127.0.0.1_4250-r1", 2),
    ]
    assert read_tasks(json.loads(json.dumps(start)), json.loads(json.dumps(end))) == tasks
    assert read_tasks(end, end) == []
    assert tick_of_key(tasks[0].key) == 3
    assert read_tasks(INITIAL_OFFSET, make_offset(1, {})) == []


def _table(bodies: list[bytes]) -> pa.Table:
    n = len(bodies)
    return pa.Table.from_arrays(
        [
            pa.array(bodies, pa.binary()),
            pa.array([f"{i:016x}" for i in range(n)], pa.string()),
            pa.array([1] * n, pa.int32()),
            pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            pa.array(["n:1"] * n, pa.string()),
            pa.array(["t"] * n, pa.string()),
            pa.array(["c"] * n, pa.string()),
        ],
        schema=STAGED_SCHEMA,
    )


def test_staging_first_writer_wins_and_replays(tmp_path: Path) -> None:
    staging = Staging(tmp_path / "st")
    staging.claim("me")
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def attempt(i: int) -> None:
        barrier.wait()
        results.append(staging.publish("t1-x-r0", _table([b"attempt %d" % i])))

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    loaded = staging.load("t1-x-r0")
    assert loaded is not None and loaded.num_rows == 1
    assert staging.load("t1-x-r1") is None
    assert not list((tmp_path / "st" / "_tmp").iterdir())  # no temporaries left


def test_staging_commit_removes_only_old_ticks(tmp_path: Path) -> None:
    staging = Staging(tmp_path)
    staging.claim("me")
    for key in ("t1-a-r0", "t2-a-r0", "t3-a-r0", "t10-a-r0"):
        staging.publish(key, _table([b"x"]))
    assert staging.remove_through(2) == 2
    assert staging.keys() == ["t10-a-r0", "t3-a-r0"]


def test_staging_ownership_and_visibility(tmp_path: Path) -> None:
    Staging(tmp_path / "a").claim("query one")
    with pytest.raises(StagingError, match="belongs to another query"):
        Staging(tmp_path / "a").claim("query two")
    with pytest.raises(StagingError, match="not visible from this executor"):
        Staging(tmp_path / "elsewhere").check_owner("query one")


def test_unreadable_staged_file_is_reported(tmp_path: Path) -> None:
    staging = Staging(tmp_path)
    staging.claim("me")
    staging.file("t1-a-r0").write_bytes(b"not arrow")
    with pytest.raises(StagingError, match="unreadable"):
        staging.load("t1-a-r0")


@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary()])
def test_mpubs_framed_from_arrow_buffers_equal_the_per_row_framing(kind: pa.DataType) -> None:
    from nsqpy.protocol.commands import mpub, mpub_encoded
    from nsqpy.spark.framing import encoded_batches

    bodies = [b"m%d" % i * (i % 7 + 1) for i in range(1, 1003)]
    column = pa.array(bodies, kind).slice(2)  # a slice: the buffers start at an offset
    batches, rest = encoded_batches(column, 250)
    assert [b.count for b in batches] == [250] * 4
    expected = bodies[2:]
    for n, batch in enumerate(batches):
        sent = mpub_encoded("t", batch.count, batch.messages)
        assert sent == mpub("t", expected[n * 250 : (n + 1) * 250])
    assert rest.to_pylist() == expected[1000:]
    assert encoded_batches(column.slice(0, 10), 250) == ([], column.slice(0, 10))


def test_raw_frames_become_staged_rows_across_chunks_and_other_frames() -> None:
    # what a read task receives, cut at arbitrary points: message frames with a heartbeat and
    # a non-fatal error between them; the rows must be exactly the messages, in order
    from nsqpy.client.connection import ConnectionOptions
    from nsqpy.protocol.frames import (
        FRAME_HEARTBEAT,
        FRAME_TYPE_MESSAGE,
        encode_error,
        encode_frame,
    )
    from nsqpy.protocol.message import encode_message
    from nsqpy.spark.fetch import _Collector
    from nsqpy.spark.receive import FrameConnection, answer_lines, frames_table

    def message(n: int) -> bytes:
        body = b"body-%d-" % n + b"x" * (n * 37 % 300)
        payload = encode_message(1_700_000_000_123_456_789 + n, n + 1, b"%016x" % n, body)
        return encode_frame(FRAME_TYPE_MESSAGE, payload)

    stream = b"".join(
        [message(0), message(1), FRAME_HEARTBEAT, message(2), encode_error(b"E_FIN_FAILED x")]
        + [message(n) for n in range(3, 40)]
    )
    collector = _Collector()
    conn = FrameConnection("127.0.0.1:4150", ConnectionOptions(), collector)
    for start in range(0, len(stream), 7):
        conn._process(stream[start : start + 7])
    late = message(40)
    conn._process(late[:20])  # a frame's head when the task stops taking messages
    table = frames_table(conn.freeze(), "clicks", "archive", "127.0.0.1:4150")
    conn._process(late[20:])

    assert collector.received == 40 and collector.late_count == 1
    assert table.schema == STAGED_SCHEMA
    assert table.column("body").to_pylist() == [
        b"body-%d-" % n + b"x" * (n * 37 % 300) for n in range(40)
    ]
    assert table.column("id").to_pylist() == [f"{n:016x}" for n in range(40)]
    assert table.column("attempts").to_pylist() == [n + 1 for n in range(40)]
    micros = table.column("timestamp").cast(pa.int64()).to_pylist()
    assert micros == [(1_700_000_000_123_456_789 + n) // 1000 for n in range(40)]
    assert set(table.column("topic").to_pylist()) == {"clicks"}
    fin = answer_lines(table.column("id").slice(38), b"FIN")
    assert fin == b"FIN %016x\nFIN %016x\n" % (38, 39)
    assert answer_lines(table.column("id").slice(0, 1), b"REQ") == b"REQ %016x 0\n" % 0
