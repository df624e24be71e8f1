"""Scale-out of the nsq source on a real Spark cluster: a standalone master and workers
started on loopback from the pyspark install (``spark-class``), the same source -> Parquet
query submitted to ``spark://`` in client mode.

    python bench/bench_spark_cluster.py --messages 200000 --workers 1,2 --nsqd 1,2 --readers 1,2,4

For each worker count (each worker: ``--cores`` cores, ``--memory``), each nsqd count, each
``readersPerNsqd``: the topic is filled once per nsqd count with one channel per readers value,
and each run drains its own channel with Trigger.AvailableNow. ``messagesPerPartition`` is
set to the whole trigger, so ``readersPerNsqd`` decides how many read tasks each nsqd gets.
Prints msgs/s for the whole query and after the first micro-batch, with the load average
(the machine is shared: figures from a busy machine say so).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _spark_common import fill, load, make_topic, parquet_rows, rate
from nsqpy.pipeline.local import LocalNSQ
from nsqpy.pipeline.standalone import StandaloneSpark


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def run_query(spark: Any, options: dict[str, str], work: Path, name: str) -> tuple[float, Any]:
    out = work / f"{name}-out"
    started = time.perf_counter()
    query = (
        spark.readStream.format("nsq")
        .options(**options)
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(work / f"{name}-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"{name}: {query.exception()}")
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    return elapsed, (batches, parquet_rows(out))


def channel_counts(nsq: LocalNSQ, channel: str) -> list[dict[str, Any]]:
    """The channel's counters on each nsqd, to explain a short run."""
    keys = ("depth", "in_flight_count", "deferred_count", "requeue_count", "timeout_count")
    found = []
    for http in nsq.nsqd_http:
        url = f"http://{http}/stats?format=json&topic=bench&channel={channel}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            for topic in json.loads(resp.read()).get("topics") or ():
                for c in topic.get("channels") or ():
                    found.append({k: c.get(k) for k in keys})
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--workers", type=ints, default=[1, 2])
    parser.add_argument("--nsqd", type=ints, default=[1, 2])
    parser.add_argument("--readers", type=ints, default=[1, 2, 4])
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--memory", default="1g", help="memory per worker")
    parser.add_argument("--per-trigger", type=int, default=100_000)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = Path(tempfile.mkdtemp(prefix="bench-spark-cluster-"))
    failures = 0
    try:
        for workers in args.workers:
            with StandaloneSpark(
                work / f"spark-w{workers}", workers, args.cores, args.memory
            ) as sc:
                failures += run_cluster(args, sc, work / f"w{workers}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


def run_cluster(args: argparse.Namespace, cluster: StandaloneSpark, work: Path) -> int:
    from nsqpy.pipeline.session import pipeline_session

    conf = {
        "spark.executor.memory": "512m",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(cluster.workers * cluster.cores),
    }
    spark = pipeline_session(cluster.url, "bench_spark_cluster", conf, log_level="ERROR")
    failures = 0
    try:
        spark.range(1000).selectExpr("sum(id)").collect()  # executors up before the timing
        for nsqd_count in args.nsqd:
            run_work = work / f"nsqd{nsqd_count}"
            count = args.messages - args.messages % nsqd_count
            flags = [f"--mem-queue-size={count}"]
            with LocalNSQ(run_work, nsqd_count, extra_nsqd_flags=flags) as nsq:
                make_topic(nsq, "bench", *(f"r{r}" for r in args.readers))
                asyncio.run(fill(nsq, "bench", count, args.size))
                for readers in args.readers:
                    options = {
                        "lookupd": nsq.lookupd_http,
                        "topic": "bench",
                        "channel": f"r{readers}",
                        "stagingLocation": str(run_work / f"staging-r{readers}"),
                        "maxMessagesPerTrigger": str(args.per_trigger),
                        "messagesPerPartition": str(args.per_trigger),
                        "readersPerNsqd": str(readers),
                    }
                    elapsed, (batches, rows) = run_query(spark, options, run_work, f"r{readers}")
                    later = batches[1:]
                    steady_rows = sum(p["numInputRows"] for p in later)
                    steady_s = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000
                    print(
                        f"workers {cluster.workers} x {cluster.cores} core, nsqd {nsqd_count}, "
                        f"readersPerNsqd {readers}: whole {rate(rows, elapsed, 'msgs')}; "
                        f"after the 1st batch {rate(steady_rows, steady_s, 'msgs')}  {load()}",
                        flush=True,
                    )
                    if rows != count:
                        print(f"ERROR: {rows} rows, {count} published", file=sys.stderr)
                        print(f"  channel: {channel_counts(nsq, f'r{readers}')}", file=sys.stderr)
                        failures += 1
    finally:
        spark.stop()
    return failures


if __name__ == "__main__":
    sys.exit(main())
