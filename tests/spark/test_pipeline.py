"""The pipeline's aggregate job: windowed counts per key, published back to NSQ."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from nsqpy.client.sync import ConsumeTimeout
from nsqpy.pipeline.cli import build_parser
from nsqpy.pipeline.jobs import SourceConfig, Trigger, aggregate_query

from ..raw_v2 import unique
from .helpers import NSQCluster, consume_all, make_topic, publish

# Spark start-up and streaming queries: more than the suite's default per-test limit
pytestmark = pytest.mark.timeout(300)


def test_aggregate_counts_per_key_and_window_arrive_on_the_output_topic(
    spark: SparkSession, cluster: NSQCluster, tmp_path: Path
) -> None:
    topic, output = unique("events"), unique("counts")
    make_topic(cluster, topic, "aggregate")
    make_topic(cluster, output, "check")
    pages = ["/a"] * 30 + ["/b"] * 20 + ["/c"] * 10
    for i, nsqd in enumerate(cluster.nsqds):
        publish(
            nsqd,
            topic,
            [json.dumps({"page": p, "n": n}).encode() for n, p in enumerate(pages) if n % 2 == i],
        )
    publish(cluster.nsqds[0], topic, [b"not json", b'{"other": 1}'])  # counted under null
    # a later event moves the watermark past the first events' windows, which then close
    time.sleep(3.0)
    publish(cluster.nsqds[1], topic, [json.dumps({"page": "/late-marker"}).encode()])

    query = aggregate_query(
        spark,
        SourceConfig(topic=topic, lookupd=[cluster.lookupd_http]),
        output_topic=output,
        checkpoint=tmp_path / "ckpt",
        staging=tmp_path / "staging",
        window="2 seconds",
        watermark="1 second",
        trigger=Trigger(available_now=True),
    )
    query.awaitTermination(120)
    assert query.exception() is None
    batches = [
        (p["batchId"], p["numInputRows"], p.get("eventTime", {}).get("watermark"))
        for p in query.recentProgress
    ]
    assert sum(rows for _, rows, _ in batches) == 63, batches

    counts: Counter[str | None] = Counter()
    try:
        first = consume_all(cluster, output, "check", 1, timeout=10)
    except ConsumeTimeout as exc:
        raise AssertionError(f"no window published; batches {batches}") from exc
    results = [json.loads(b) for b in first]
    # the first message may not carry every window: take all that arrived
    results += [json.loads(b) for b in _drain(cluster, output)]
    for result in results:
        assert set(result) == {"window_start", "window_end", "page", "count"}
        assert result["window_start"] < result["window_end"]
        counts[result["page"]] += result["count"]
    assert counts["/a"] == 30 and counts["/b"] == 20 and counts["/c"] == 10
    assert counts[None] == 2
    assert "/late-marker" not in counts  # its window is still open


def _drain(cluster: NSQCluster, topic: str) -> list[bytes]:
    from .helpers import depth

    remaining = depth(cluster, topic, "check")
    return consume_all(cluster, topic, "check", remaining) if remaining else []


def test_cli_defaults_keep_everything_under_the_work_dir() -> None:
    args = build_parser().parse_args(["--lookupd", "127.0.0.1:4161", "all"])
    assert args.master is None and args.topic == "clicks"
    assert str(args.work_dir) == "nsqpy-pipeline"
    assert args.key == "page" and args.window == "10 seconds"
