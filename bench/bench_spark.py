"""Throughput of the Spark connector: NSQ -> Parquet through the source, DataFrame -> NSQ
through the sink, on a local nsqlookupd and two nsqd.

    python bench/bench_spark.py --messages 1000000 --size 100 --master 'local[2]'

1. Fills topic ``bench`` with ``--messages`` bodies of ``--size`` bytes, split over both nsqd
   (channel ``spark`` created first, so every message waits for the query).
2. Source: a streaming query reads the channel with Trigger.AvailableNow (``--per-trigger``
   messages per micro-batch) into Parquet. Prints msgs/s over the whole query (first
   micro-batch and Python worker start included) and over the micro-batches after the first.
3. Sink: the archived bodies (cached) are written to topic ``bench_out`` with
   ``df.write.format("nsq")``. Prints rows/s.

Each step checks its count (Parquet rows, nsqd depth) so a fast wrong run cannot pass.
The machine's load average is printed too: other work on the cores skews the figures.
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
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from nsqpy.client import Producer
from nsqpy.pipeline.local import LocalNSQ


def post(http: str, path: str, **params: str) -> None:
    url = f"http://{http}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10):
        pass


def channel_depth(nsq: LocalNSQ, topic: str, channel: str) -> int:
    total = 0
    for http in nsq.nsqd_http:
        url = f"http://{http}/stats?format=json&include_clients=false&topic={topic}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            for t in json.loads(resp.read()).get("topics") or ():
                for c in t.get("channels") or ():
                    if c["channel_name"] == channel:
                        total += int(c["depth"])
    return total


async def fill(nsq: LocalNSQ, topic: str, count: int, size: int) -> float:
    started = time.perf_counter()
    per_nsqd = count // len(nsq.nsqd_tcp)
    for address in nsq.nsqd_tcp:
        async with Producer(address) as producer:
            pending = []
            for start in range(0, per_nsqd, 1000):
                n = min(1000, per_nsqd - start)
                bodies = [b"%010d" % (start + i) + b"x" * (size - 10) for i in range(n)]
                pending.append(producer.multi_publish(topic, bodies))
                if len(pending) >= 8:
                    await asyncio.gather(*pending)
                    pending = []
            await asyncio.gather(*pending)
    return time.perf_counter() - started


def parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    files = [f for f in path.rglob("*.parquet") if "_spark_metadata" not in f.parts]
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def rate(count: int, seconds: float, unit: str) -> str:
    return f"{count / seconds:10,.0f} {unit}/s  ({count:,} in {seconds:.2f} s)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes (>= 10)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--per-trigger", type=int, default=100_000, help="maxMessagesPerTrigger")
    parser.add_argument("--per-partition", type=int, default=10_000, help="messagesPerPartition")
    parser.add_argument("--sink-batch", type=int, default=500, help="batchSize (MPUB size)")
    args = parser.parse_args()
    size = max(10, args.size)
    count = args.messages - args.messages % 2

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    nsq = LocalNSQ(work, extra_nsqd_flags=[f"--mem-queue-size={count}"]).start()
    try:
        for http in nsq.nsqd_http:
            post(http, "/topic/create", topic="bench")
            post(http, "/channel/create", topic="bench", channel="spark")
            post(http, "/topic/create", topic="bench_out")
            post(http, "/channel/create", topic="bench_out", channel="check")
        filled = asyncio.run(fill(nsq, "bench", count, size))
        print(f"nsqd x2: filled {count:,} messages of {size} B in {filled:.2f} s", flush=True)
        return run_spark(args, nsq, work, count)
    finally:
        nsq.stop()
        shutil.rmtree(work, ignore_errors=True)


def run_spark(args: argparse.Namespace, nsq: LocalNSQ, work: Path, count: int) -> int:
    from nsqpy.pipeline.session import pipeline_session

    spark = pipeline_session(args.master, "bench_spark", log_level="ERROR")
    try:
        spark.range(1000).selectExpr("sum(id)").collect()  # JVM warm-up, outside the timing
        out = work / "parquet"
        options = {
            "lookupd": nsq.lookupd_http,
            "topic": "bench",
            "channel": "spark",
            "stagingLocation": str(work / "staging"),
            "maxMessagesPerTrigger": str(args.per_trigger),
            "messagesPerPartition": str(args.per_partition),
        }
        df = spark.readStream.format("nsq").options(**options).load()
        started = time.perf_counter()
        query = (
            df.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(work / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        elapsed = time.perf_counter() - started
        if query.exception() is not None:
            print(f"query failed: {query.exception()}", file=sys.stderr)
            return 1
        archived = parquet_rows(out)
        batches: list[Any] = [p for p in query.recentProgress if p["numInputRows"] > 0]
        later = batches[1:]
        steady_rows = sum(p["numInputRows"] for p in later)
        steady_ms = sum(p["durationMs"]["triggerExecution"] for p in later)
        print(f"source -> Parquet ({args.master}, {len(batches)} micro-batches):", flush=True)
        print(f"  whole query          {rate(archived, elapsed, 'msgs')}", flush=True)
        if steady_ms:
            print(f"  after the 1st batch  {rate(steady_rows, steady_ms / 1000, 'msgs')}")
        if archived != count:
            print(f"ERROR: {archived} rows archived, {count} published", file=sys.stderr)
            return 1

        bodies = spark.read.parquet(str(out)).select("body").cache()
        assert bodies.count() == count
        started = time.perf_counter()
        bodies.write.format("nsq").option("lookupd", nsq.lookupd_http).option(
            "topic", "bench_out"
        ).option("batchSize", str(args.sink_batch)).mode("append").save()
        elapsed = time.perf_counter() - started
        published = channel_depth(nsq, "bench_out", "check")
        print(f"DataFrame -> sink ({args.master}, {bodies.rdd.getNumPartitions()} partitions):")
        print(f"  df.write.format('nsq')  {rate(published, elapsed, 'rows')}")
        if published != count:
            print(f"ERROR: {published} messages arrived, {count} rows written", file=sys.stderr)
            return 1
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"load average during the run: {load} ({os.cpu_count()} cores)")
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
