"""The ``nsq`` source in Spark: streams (AvailableNow and processing-time), batch reads, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from ..raw_v2 import unique, wait_until
from .helpers import NSQCluster, depth, http, make_topic, publish, publish_numbered, tcp

CHANNEL = "spark"


# Spark start-up and streaming queries: more than the suite's default per-test limit
pytestmark = pytest.mark.timeout(300)


def stream(spark: SparkSession, options: dict[str, str]) -> DataFrame:
    return spark.readStream.format("nsq").options(**options).load()


def to_memory(df: DataFrame, name: str, checkpoint: Path, **trigger: Any) -> StreamingQuery:
    return (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )


def test_available_now_reads_every_message_once_within_the_trigger_limit(
    spark: SparkSession, cluster: NSQCluster, tmp_path: Path
) -> None:
    topic = unique("avail")
    make_topic(cluster, topic, CHANNEL)
    bodies = publish_numbered(cluster, topic, 0, 600)
    options = cluster.source_options(
        topic, CHANNEL, tmp_path / "staging", maxMessagesPerTrigger="250"
    )
    query = to_memory(stream(spark, options), topic, tmp_path / "ckpt", availableNow=True)
    query.awaitTermination(120)

    rows = spark.table(topic).collect()
    assert sorted(r.body for r in rows) == sorted(bodies)
    assert len({(r.nsqd, r.id) for r in rows}) == 600
    assert {r.nsqd for r in rows} == {tcp(n) for n in cluster.nsqds}
    assert {(r.topic, r.channel, r.attempts) for r in rows} == {(topic, CHANNEL, 1)}
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 3 and max(p["numInputRows"] for p in batches) <= 250
    # lag is reported through reportLatestOffset: depth per nsqd
    latest = json.loads(batches[0]["sources"][0]["latestOffset"])
    assert latest["depth"] == 600 and len(latest["nsqds"]) == 2
    assert depth(cluster, topic, CHANNEL) == 0
    # committed ticks' staged files are gone; only the last batch's (not yet committed) remain
    staged = sorted(p.name for p in (tmp_path / "staging").glob("t*.arrow"))
    last_tick = {name.split("-")[0] for name in staged}
    assert len(last_tick) == 1


def test_processing_time_stream_follows_new_messages(
    spark: SparkSession, cluster: NSQCluster, tmp_path: Path
) -> None:
    topic = unique("live")
    make_topic(cluster, topic, CHANNEL)
    options = cluster.source_options(topic, CHANNEL, tmp_path / "staging")
    query = to_memory(
        stream(spark, options), topic, tmp_path / "ckpt", processingTime="500 milliseconds"
    )
    try:
        publish_numbered(cluster, topic, 0, 50)
        wait_until(lambda: spark.table(topic).count() == 50, timeout=60, what="first 50")
        publish_numbered(cluster, topic, 50, 70)
        wait_until(lambda: spark.table(topic).count() == 120, timeout=60, what="all 120")
    finally:
        query.stop()
    bodies = sorted(r.body for r in spark.table(topic).collect())
    assert bodies == sorted(b"m%d" % i for i in range(120))


def test_static_nsqd_list_and_minimal_columns(
    spark: SparkSession, cluster: NSQCluster, tmp_path: Path
) -> None:
    topic = unique("static")
    make_topic(cluster, topic, CHANNEL)
    publish_numbered(cluster, topic, 0, 40)
    options = {
        "nsqd": ",".join(tcp(n) for n in cluster.nsqds),
        "nsqdHttp": ",".join(http(n) for n in cluster.nsqds),
        "topic": topic,
        "channel": CHANNEL,
        "stagingLocation": str(tmp_path / "staging"),
        "includeMetadata": "false",
    }
    df = stream(spark, options)
    assert df.columns == ["body", "id", "nsqd"]
    to_memory(df, topic, tmp_path / "ckpt", availableNow=True).awaitTermination(120)
    assert spark.table(topic).count() == 40


def test_topic_pattern_reads_every_matching_topic(
    spark: SparkSession, cluster: NSQCluster, tmp_path: Path
) -> None:
    prefix = unique("pat")
    for suffix in ("a", "b", "other"):
        make_topic(cluster, f"{prefix}_{suffix}", CHANNEL)
        publish(cluster.nsqds[0], f"{prefix}_{suffix}", [b"%s" % suffix.encode()] * 5)
    options = cluster.source_options("x", CHANNEL, tmp_path / "staging")
    del options["topic"]
    options["topicPattern"] = f"{prefix}_(a|b)"
    to_memory(
        stream(spark, options), prefix, tmp_path / "ckpt", availableNow=True
    ).awaitTermination(120)
    rows = spark.table(prefix).collect()
    assert sorted({r.topic for r in rows}) == [f"{prefix}_a", f"{prefix}_b"]
    assert len(rows) == 10


def test_batch_read_drains_up_to_max_messages_and_replays(
    spark: SparkSession, cluster: NSQCluster, tmp_path: Path
) -> None:
    topic = unique("batch")
    make_topic(cluster, topic, CHANNEL)
    publish_numbered(cluster, topic, 0, 100)
    reader = spark.read.format("nsq").options(
        **cluster.source_options(topic, CHANNEL, tmp_path / "staging", maxMessages="60")
    )
    df = reader.load()
    first = sorted(r.body for r in df.collect())
    assert len(first) == 60
    assert depth(cluster, topic, CHANNEL) == 40
    # a second action replays the staged rows: same data, nothing more taken from nsqd
    assert sorted(r.body for r in df.collect()) == first
    assert depth(cluster, topic, CHANNEL) == 40
    rest = (
        spark.read.format("nsq")
        .options(**cluster.source_options(topic, CHANNEL, tmp_path / "staging"))
        .load()
    )
    assert rest.count() == 40
    assert depth(cluster, topic, CHANNEL) == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"channel": None}, "option 'channel' is required"),
        ({"channel": "spark#ephemeral"}, "is ephemeral"),
        ({"topic": None}, "option 'topic' is required"),
    ],
)
def test_option_errors_surface_at_load(
    spark: SparkSession, cluster: NSQCluster, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    options = cluster.source_options("t", CHANNEL, tmp_path / "staging")
    for key, value in change.items():
        if value is None:
            options.pop(key)
        else:
            options[key] = value
    with pytest.raises(Exception, match=message):
        stream(spark, options)


def test_unreachable_lookupd_fails_the_query_clearly(
    spark: SparkSession, cluster: NSQCluster, tmp_path: Path
) -> None:
    options = cluster.source_options("t", CHANNEL, tmp_path / "staging")
    options["lookupd"] = "127.0.0.1:1"  # nothing listens there
    query = to_memory(
        stream(spark, options), unique("nolookupd"), tmp_path / "ckpt", availableNow=True
    )
    with pytest.raises(Exception, match="could not reach any nsqlookupd"):
        query.awaitTermination(120)
