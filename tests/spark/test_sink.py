"""The ``nsq`` sink: batch and streaming writes, topic/defer_ms columns, limits, retries."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from ..raw_v2 import unique, wait_until
from .helpers import NSQCluster, channel, consume_all, depth, make_topic, publish_numbered, tcp

CHECK = "check"


# Spark start-up and streaming queries: more than the suite's default per-test limit
pytestmark = pytest.mark.timeout(300)


def nsqd_list(cluster: NSQCluster) -> str:
    return ",".join(tcp(n) for n in cluster.nsqds)


def test_batch_write_of_n_rows_arrives_as_n_messages(
    spark: SparkSession, cluster: NSQCluster
) -> None:
    topic = unique("sink")
    make_topic(cluster, topic, CHECK)
    rows = 2000
    df = spark.range(rows, numPartitions=4).select(
        F.concat(F.lit("row-"), F.col("id").cast("string")).alias("body")
    )
    df.write.format("nsq").option("lookupd", cluster.lookupd_http).option("topic", topic).option(
        "batchSize", "300"
    ).mode("append").save()

    assert depth(cluster, topic, CHECK) == rows
    per_nsqd = [channel(n, topic, CHECK)["depth"] for n in cluster.nsqds]
    assert all(d > 0 for d in per_nsqd)  # partitions spread over both nsqd
    bodies = consume_all(cluster, topic, CHECK, rows)
    assert Counter(bodies) == Counter(b"row-%d" % i for i in range(rows))


def test_topic_and_defer_ms_columns(spark: SparkSession, cluster: NSQCluster) -> None:
    first, second = unique("sink_a"), unique("sink_b")
    for topic in (first, second):
        make_topic(cluster, topic, CHECK)
    data = [(f"x{i}", first if i % 2 else second, 4000 if i < 4 else None) for i in range(10)]
    df = spark.createDataFrame(data, "body string, topic string, defer_ms int")
    df.write.format("nsq").option("nsqd", nsqd_list(cluster)).mode("append").save()

    deferred = sum(
        channel(n, t, CHECK)["deferred_count"] for n in cluster.nsqds for t in (first, second)
    )
    assert deferred == 4  # rows 0-3 went out with DPUB
    wait_until(
        lambda: depth(cluster, first, CHECK) + depth(cluster, second, CHECK) == 10,
        timeout=20,
        what="deferred messages",
    )
    assert sorted(consume_all(cluster, first, CHECK, 5)) == [b"x1", b"x3", b"x5", b"x7", b"x9"]


def test_oversize_body_fails_the_write_instead_of_dropping_it(
    spark: SparkSession, cluster: NSQCluster
) -> None:
    topic = unique("big")
    make_topic(cluster, topic, CHECK)
    df = spark.createDataFrame([("small",), ("y" * 2000,)], "body string").coalesce(1)
    with pytest.raises(Exception, match="over maxMessageSize 1000"):
        df.write.format("nsq").option("nsqd", nsqd_list(cluster)).option("topic", topic).option(
            "maxMessageSize", "1000"
        ).mode("append").save()


def test_missing_body_column_is_reported_at_write(spark: SparkSession, cluster: NSQCluster) -> None:
    df = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(Exception, match="needs a 'body' column"):
        df.write.format("nsq").option("nsqd", nsqd_list(cluster)).option("topic", "t").mode(
            "append"
        ).save()


def test_task_retry_publishes_again(
    spark: SparkSession, cluster: NSQCluster, tmp_path: Path
) -> None:
    """At-least-once: a task that fails after publishing is retried and publishes again."""
    topic = unique("retry")
    make_topic(cluster, topic, CHECK)
    fault = json.dumps({"point": "after_publish", "dir": str(tmp_path / "faults")})
    df = spark.range(100, numPartitions=2).select(F.col("id").cast("string").alias("body"))
    df.write.format("nsq").option("nsqd", nsqd_list(cluster)).option("topic", topic).option(
        "_faultInjection", fault
    ).mode("append").save()
    # both partitions failed once after publishing, and their retries published again
    assert depth(cluster, topic, CHECK) == 200
    assert Counter(consume_all(cluster, topic, CHECK, 200)) == Counter(
        {b"%d" % i: 2 for i in range(100)}
    )


def test_failover_to_the_next_nsqd(spark: SparkSession, cluster: NSQCluster) -> None:
    topic = unique("failover")
    make_topic(cluster, topic, CHECK)
    df = spark.range(50, numPartitions=1).select(F.col("id").cast("string").alias("body"))
    df.write.format("nsq").option("nsqd", f"127.0.0.1:1,{tcp(cluster.nsqds[1])}").option(
        "topic", topic
    ).mode("append").save()
    assert channel(cluster.nsqds[1], topic, CHECK)["depth"] == 50


def test_streaming_copy_from_one_topic_to_another(
    spark: SparkSession, cluster: NSQCluster, tmp_path: Path
) -> None:
    source, target = unique("from"), unique("to")
    make_topic(cluster, source, "spark")
    make_topic(cluster, target, CHECK)
    bodies = publish_numbered(cluster, source, 0, 300)
    query = (
        spark.readStream.format("nsq")
        .options(**cluster.source_options(source, "spark", tmp_path / "staging"))
        .load()
        .select("body")
        .writeStream.format("nsq")
        .option("lookupd", cluster.lookupd_http)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert Counter(consume_all(cluster, target, CHECK, 300)) == Counter(bodies)
