"""The stream reader's driver side against real nsqd and nsqlookupd, without a SparkSession:
read limits, minimum batch size with a deadline, AvailableNow's target, commit, data loss."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from nsqpy.spark.options import parse_source_options
from nsqpy.spark.plan import read_tasks
from nsqpy.spark.source import FULL_SCHEMA, NSQPartition, NSQStreamReader
from nsqpy.spark.staging import StagingError

from ..raw_v2 import NsqConn, unique, wait_until
from .helpers import NSQCluster, depth, make_topic, post, publish, tcp

CHANNEL = "spark"


def reader(
    cluster: NSQCluster, topic: str, staging: Path, channel: str = CHANNEL, **extra: str
) -> NSQStreamReader:
    raw = cluster.source_options(topic, channel, staging, **extra)
    return NSQStreamReader(parse_source_options(raw, streaming=True), FULL_SCHEMA)


def planned(offset: dict[str, Any], topic: str) -> dict[str, list[int]]:
    return dict(offset["topics"].get(topic, {}))


def test_read_limit_is_split_over_the_nsqd_by_depth(cluster: NSQCluster, tmp_path: Path) -> None:
    topic = unique("plan")
    make_topic(cluster, topic, CHANNEL)
    first, second = cluster.nsqds
    publish(first, topic, [b"x"] * 300)
    publish(second, topic, [b"y"] * 100)
    stream = reader(cluster, topic, tmp_path, messagesPerPartition="60", readersPerNsqd="2")
    start = stream.initialOffset()

    end = stream.latestOffset(start, ReadMaxRows(200))
    assert end["tick"] == 1
    # 200 of 400 in proportion to depth: 150 and 50; at most 60 per task, at least 2 tasks
    assert planned(end, topic) == {tcp(first): [3, 150], tcp(second): [2, 50]}
    tasks = read_tasks(start, end)
    assert sum(t.messages for t in tasks) == 200 and max(t.messages for t in tasks) <= 60
    assert planned(stream.latestOffset(start, ReadAllAvailable()), topic) == {
        tcp(first): [5, 300],
        tcp(second): [2, 100],
    }
    report = stream.reportLatestOffset()
    assert report is not None and report["depth"] == 400
    assert report["nsqds"][f"{topic}@{tcp(first)}"]["depth"] == 300


def test_min_messages_wait_until_max_trigger_delay(cluster: NSQCluster, tmp_path: Path) -> None:
    topic = unique("plan")
    make_topic(cluster, topic, CHANNEL)
    publish(cluster.nsqds[0], topic, [b"x"] * 5)
    stream = reader(cluster, topic, tmp_path, minMessagesPerTrigger="10", maxTriggerDelay="1500ms")
    assert isinstance(stream.getDefaultReadLimit(), ReadMinRows)
    start = stream.initialOffset()
    assert stream.latestOffset(start, ReadMinRows(10)) == start  # 5 < 10: wait
    publish(cluster.nsqds[1], topic, [b"y"] * 5)
    assert stream.latestOffset(start, ReadMinRows(10))["tick"] == 1  # 10: go

    later = reader(
        cluster,
        topic,
        tmp_path / "b",
        minMessagesPerTrigger="50",
        maxTriggerDelay="1s",
        channel="other",
    )
    begin = later.initialOffset()  # creates channel "other": it gets what comes next
    publish(cluster.nsqds[0], topic, [b"z"] * 5)
    assert later.latestOffset(begin, ReadMinRows(50)) == begin
    time.sleep(1.2)
    assert later.latestOffset(begin, ReadMinRows(50))["tick"] == 1  # the delay expired


def test_available_now_stops_at_the_depth_seen_when_it_started(
    cluster: NSQCluster, tmp_path: Path
) -> None:
    topic = unique("plan")
    make_topic(cluster, topic, CHANNEL)
    publish(cluster.nsqds[0], topic, [b"x"] * 100)
    stream = reader(cluster, topic, tmp_path)
    start = stream.initialOffset()
    stream.prepareForTriggerAvailableNow()
    publish(cluster.nsqds[0], topic, [b"later"] * 50)  # after the target: not this run's

    first = stream.latestOffset(start, ReadMaxRows(60))
    assert planned(first, topic) == {tcp(cluster.nsqds[0]): [1, 60]}
    second = stream.latestOffset(first, ReadMaxRows(60))
    assert planned(second, topic) == {tcp(cluster.nsqds[0]): [1, 40]}
    assert stream.latestOffset(second, ReadMaxRows(60)) == second  # target reached: done


def _hold_in_flight(nsqd: Any, topic: str, count: int, msg_timeout_ms: int) -> None:
    """Take ``count`` messages of the channel in flight and drop them: they time out back."""
    with NsqConn(nsqd.tcp_address) as conn:
        conn.identify(msg_timeout=msg_timeout_ms)
        conn.sub(topic, CHANNEL)
        conn.rdy(count)
        for _ in range(count):
            conn.expect_message()


def _drain_available_now(stream: NSQStreamReader, start: dict[str, Any]) -> list[int]:
    """Run the batches Spark would run, reading each; the rows each batch staged."""
    batches: list[int] = []
    for _ in range(10):
        end = stream.latestOffset(start, ReadAllAvailable())
        if end == start:
            return batches
        parts = [p for p in stream.partitions(start, end) if isinstance(p, NSQPartition)]
        batches.append(sum(b.num_rows for p in parts for b in stream.read(p)))
        start = end
    raise AssertionError(f"AvailableNow did not stop: {batches}")


def test_available_now_comes_back_for_what_a_batch_could_not_read(
    cluster: NSQCluster, tmp_path: Path
) -> None:
    topic = unique("plan")
    make_topic(cluster, topic, CHANNEL)
    publish(cluster.nsqds[0], topic, [b"x"] * 100)
    stream = reader(cluster, topic, tmp_path)
    start = stream.initialOffset()
    stream.prepareForTriggerAvailableNow()
    first = stream.latestOffset(start, ReadAllAvailable())
    assert planned(first, topic) == {tcp(cluster.nsqds[0]): [1, 100]}
    # another consumer holds 40 while the batch reads: it stages 60; the 40 come back
    _hold_in_flight(cluster.nsqds[0], topic, 40, msg_timeout_ms=1000)
    parts = [p for p in stream.partitions(start, first) if isinstance(p, NSQPartition)]
    assert sum(b.num_rows for p in parts for b in stream.read(p)) == 60
    wait_until(
        lambda: depth(cluster, topic, CHANNEL) == 40,
        what="the held messages' timeout",
        timeout=20.0,
    )
    assert _drain_available_now(stream, first) == [40]


def test_available_now_stops_when_nothing_can_be_read(cluster: NSQCluster, tmp_path: Path) -> None:
    topic = unique("plan")
    make_topic(cluster, topic, CHANNEL)
    publish(cluster.nsqds[0], topic, [b"x"] * 10)
    post(cluster.nsqds[0], "/channel/pause", topic=topic, channel=CHANNEL)
    stream = reader(cluster, topic, tmp_path, waitMs="100")
    start = stream.initialOffset()
    stream.prepareForTriggerAvailableNow()
    # a paused channel reports its depth but delivers nothing: a few empty tries, then done
    assert _drain_available_now(stream, start) == [0, 0, 0]
    assert depth(cluster, topic, CHANNEL) == 10


def test_partitions_commit_and_data_loss(cluster: NSQCluster, tmp_path: Path) -> None:
    topic = unique("plan")
    make_topic(cluster, topic, CHANNEL)
    publish(cluster.nsqds[0], topic, [b"x"] * 10)
    stream = reader(cluster, topic, tmp_path)
    start = stream.initialOffset()
    end = stream.latestOffset(start, ReadAllAvailable())
    parts = stream.partitions(start, end)
    assert [p.task for p in parts if isinstance(p, NSQPartition)] == read_tasks(start, end)
    for part in parts:
        assert isinstance(part, NSQPartition)
        rows = list(stream.read(part))
        assert sum(batch.num_rows for batch in rows) == 10
    assert list(tmp_path.glob("t1-*.arrow"))

    stream.commit(end)
    assert not list(tmp_path.glob("t1-*.arrow"))  # committed: staged rows are gone
    with pytest.raises(StagingError, match="staged messages were deleted"):
        stream.partitions(start, end)  # re-planning a committed batch would lose data
    lenient = reader(cluster, topic, tmp_path, failOnDataLoss="false")
    assert lenient.partitions(start, end)  # warns and goes on


def test_unreachable_lookupd_is_reported_at_the_first_offset(tmp_path: Path) -> None:
    raw = {
        "lookupd": "127.0.0.1:1",
        "topic": "t",
        "channel": CHANNEL,
        "stagingLocation": str(tmp_path),
    }
    stream = NSQStreamReader(parse_source_options(raw, streaming=True), FULL_SCHEMA)
    with pytest.raises(ConnectionError, match="could not reach any nsqlookupd"):
        stream.initialOffset()
