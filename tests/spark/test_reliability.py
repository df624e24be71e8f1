"""Reliability in ``local[2,4]`` against two nsqd: injected task failures (Python workers
killed between staging and FIN, tasks failing after FIN) and a query stopped and restarted
while messages keep arriving. Every published message must reach the Parquet output; raw
duplicates appear only for crashes between staging and FIN, and the archive job removes them.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from nsqpy.pipeline.jobs import SourceConfig, Trigger, archive_query
from nsqpy.testing import start_nsqd

from ..raw_v2 import unique, wait_until
from .helpers import NSQCluster, depth, in_flight, make_topic, parquet_rows, publish_numbered

# Spark start-up and streaming queries: more than the suite's default per-test limit
pytestmark = pytest.mark.timeout(300)

CHANNEL = "archive"
TOTAL = 3000
ROUNDS = 30


class Publisher(threading.Thread):
    """Publishes m0..m<TOTAL-1> in ROUNDS bursts over both nsqd while the query runs."""

    def __init__(self, cluster: NSQCluster, topic: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.topic = cluster, topic
        self.published = 0
        self.error: BaseException | None = None
        self.halfway = threading.Event()

    def run(self) -> None:
        per_round = TOTAL // ROUNDS
        try:
            for i in range(ROUNDS):
                publish_numbered(self.cluster, self.topic, i * per_round, per_round)
                self.published += per_round
                if i == ROUNDS // 2:
                    self.halfway.set()
                threading.Event().wait(0.1)
        except BaseException as exc:
            self.error = exc
            raise


def fault(point: str, directory: Path, mode: str, limit: int = 3) -> str:
    """Fail the first ``limit`` tasks (once each) at ``point``."""
    return json.dumps({"point": point, "dir": str(directory), "mode": mode, "max": limit})


def source(cluster: NSQCluster, topic: str, faults: str) -> SourceConfig:
    return SourceConfig(
        topic=topic,
        lookupd=[cluster.lookupd_http],
        options={
            "_faultInjection": faults,
            "maxMessagesPerTrigger": "400",
            "messagesPerPartition": "100",
            "readersPerNsqd": "2",
            "waitMs": "500",
            "nsq.msg_timeout": "2s",  # redeliveries of crashed tasks come back quickly
        },
    )


def input_rows(*queries: StreamingQuery) -> int:
    return sum(p["numInputRows"] for q in queries for p in q.recentProgress)


def assert_every_message_archived_once(output: Path) -> list[dict[str, Any]]:
    rows = parquet_rows(output)
    bodies = Counter(r["body"] for r in rows)
    missing = {b"m%d" % i for i in range(TOTAL)} - set(bodies)
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"
    duplicated = {b: n for b, n in bodies.items() if n > 1}
    assert not duplicated, f"{len(duplicated)} duplicates in the archive"
    assert len(rows) == TOTAL
    return rows


def run_archive(
    spark: SparkSession,
    cluster: NSQCluster,
    topic: str,
    tmp_path: Path,
    faults: str,
    trigger: Trigger,
    *,
    dedupe: bool = True,
) -> StreamingQuery:
    config = source(cluster, topic, faults)
    if dedupe:
        return archive_query(
            spark,
            config,
            output=tmp_path / "out",
            checkpoint=tmp_path / "ckpt",
            staging=tmp_path / "staging",
            trigger=trigger,
        )
    df = (
        spark.readStream.format("nsq")
        .options(**config.source_options(CHANNEL, tmp_path / "staging"))
        .load()
    )
    writer = (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
    )
    return trigger.apply(writer).start()


def drive(
    spark: SparkSession,
    cluster: NSQCluster,
    tmp_path: Path,
    first_faults: str,
    second_faults: str,
    dedupe: bool,
) -> tuple[str, list[StreamingQuery]]:
    """Run, stop mid-stream, restart with other faults, then drain with AvailableNow."""
    topic = unique("reliable")
    make_topic(cluster, topic, CHANNEL)
    publisher = Publisher(cluster, topic)
    live = Trigger("200 milliseconds")
    first = run_archive(spark, cluster, topic, tmp_path, first_faults, live, dedupe=dedupe)
    publisher.start()
    publisher.halfway.wait(60)
    wait_until(lambda: input_rows(first) > 500, timeout=90, what="first run progress")
    first.stop()  # mid-stream: the running batch is interrupted and replanned on restart
    assert first.exception() is None

    second = run_archive(spark, cluster, topic, tmp_path, second_faults, live, dedupe=dedupe)
    publisher.join(60)
    assert publisher.error is None and publisher.published == TOTAL
    wait_until(lambda: input_rows(second) > 0, timeout=90, what="second run progress")
    second.stop()
    assert second.exception() is None

    # crashed deliveries come back after msg_timeout: drain until the channel is empty
    queries = [first, second]
    for _ in range(10):
        wait_until(lambda: in_flight(cluster, topic, CHANNEL) == 0, timeout=30, what="timeouts")
        drain = run_archive(
            spark,
            cluster,
            topic,
            tmp_path,
            second_faults,
            Trigger(available_now=True),
            dedupe=dedupe,
        )
        drain.awaitTermination(120)
        assert drain.exception() is None
        queries.append(drain)
        if depth(cluster, topic, CHANNEL) == 0 and in_flight(cluster, topic, CHANNEL) == 0:
            break
    return topic, queries


def test_archive_survives_worker_crashes_between_staging_and_fin_and_a_restart(
    spark: SparkSession, cluster: NSQCluster, tmp_path: Path
) -> None:
    crashes = fault("after_stage", tmp_path / "faults", mode="exit")
    after_fin = fault("after_fin", tmp_path / "faults2", mode="raise")
    _, queries = drive(spark, cluster, tmp_path, crashes, after_fin, dedupe=True)

    rows = assert_every_message_archived_once(tmp_path / "out")
    crashed = list((tmp_path / "faults").glob("*.after_stage"))
    assert crashed, "no worker was killed between staging and FIN"
    # the killed workers' messages were delivered again (same id): the source produced
    # duplicates, and the archive's dedupe on (nsqd, id) removed every one of them
    assert input_rows(*queries) > TOTAL
    assert {r["channel"] for r in rows} == {CHANNEL}
    assert all(r["date"] and r["hour"] is not None for r in rows)
    assert not [
        p
        for p in (tmp_path / "out").iterdir()
        if p.name.startswith("date=") is False and p.name != "_spark_metadata"
    ]


def test_raw_output_duplicates_only_redeliveries(
    spark: SparkSession, cluster: NSQCluster, tmp_path: Path
) -> None:
    """Without dedupe: task failures after FIN and restarts replay staged rows exactly, so
    no message is written twice by a replay. A copy can only come from nsqd redelivering a
    message whose task died between staging and FIN (here: a task killed by the mid-stream
    stop in that window, which is rare), and then the copies differ in ``attempts``."""
    after_fin = fault("after_fin", tmp_path / "faults", mode="exit")
    after_fin_raise = fault("after_fin", tmp_path / "faults2", mode="raise")
    _, queries = drive(spark, cluster, tmp_path, after_fin, after_fin_raise, dedupe=False)

    rows = parquet_rows(tmp_path / "out")
    copies: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        copies.setdefault((row["nsqd"], row["id"]), []).append(row["attempts"])
    missing = {b"m%d" % i for i in range(TOTAL)} - {r["body"] for r in rows}
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"
    assert len(copies) == TOTAL
    replayed_twice = {k: a for k, a in copies.items() if len(a) != len(set(a))}
    assert not replayed_twice, f"rows written twice by a replay: {list(replayed_twice)[:5]}"
    assert len(rows) - TOTAL <= 200  # redeliveries, if any, are few
    assert list((tmp_path / "faults").glob("*.after_fin")), "no task failed after FIN"
    assert input_rows(*queries) >= TOTAL


def test_an_nsqd_restarting_mid_stream_loses_nothing(
    spark: SparkSession, cluster: NSQCluster, tmp_path: Path
) -> None:
    """No single point of failure: one nsqd shuts down and comes back (on a new port, as
    nsqlookupd then reports) while the archive runs; its queued and in-flight messages are
    archived once it is back."""
    topic = unique("restart")
    lookupd_tcp = f"127.0.0.1:{cluster.lookupd.tcp_port}"
    nsqds = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        nsqds.append(start_nsqd(tmp_path / name, f"--lookupd-tcp-address={lookupd_tcp}"))
    try:
        pair = NSQCluster(cluster.lookupd, nsqds)
        make_topic(pair, topic, CHANNEL)
        publish_numbered(pair, topic, 0, TOTAL)
        config = SourceConfig(
            topic=topic,
            lookupd=[cluster.lookupd_http],
            options={
                "maxMessagesPerTrigger": "300",
                "waitMs": "500",
                "lookupdPollIntervalMs": "200",
                "nsq.msg_timeout": "2s",
            },
        )
        query = archive_query(
            spark,
            config,
            output=tmp_path / "out",
            checkpoint=tmp_path / "ckpt",
            staging=tmp_path / "staging",
            trigger=Trigger("200 milliseconds"),
        )
        try:
            wait_until(lambda: input_rows(query) >= 600, timeout=90, what="progress")
            nsqds[1].restart()  # SIGTERM: nsqd persists its queue, then a new process
            wait_until(
                lambda: len(parquet_rows(tmp_path / "out")) >= TOTAL,
                timeout=120,
                what="every message archived",
            )
        finally:
            query.stop()
        assert query.exception() is None
        assert_every_message_archived_once(tmp_path / "out")
    finally:
        for nsqd in nsqds:
            nsqd.stop()
