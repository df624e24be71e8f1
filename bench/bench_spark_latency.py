"""Latency of the nsq source: publish -> row visible in the Parquet output, at a steady rate.

    python bench/bench_spark_latency.py --rate 10000 --seconds 30 --trigger "1 second"

A producer publishes ``--rate`` messages per second (MPUB every 10 ms, over two nsqd) for
``--seconds``; each body starts with its publish time. A streaming query reads them with
``format("nsq")`` into Parquet with a processing-time trigger. A watcher polls the file sink's
commit log (``_spark_metadata``) every 20 ms: a row is visible when the log lists its file.
Prints p50 / p99 / max of publish -> visible, the time from ``start()`` to the first
committed batch, and the load average (the machine is shared with other work).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _spark_common import load, make_topic
from nsqpy.client import Producer
from nsqpy.pipeline.local import LocalNSQ


async def produce(nsqd: list[str], rate: int, seconds: float, size: int) -> int:
    sent = 0
    async with Producer(nsqd) as producer:
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < seconds:
            due = int(elapsed * rate) - sent
            if due > 0:
                stamp = b"%.6f " % time.time()
                body = stamp + b"x" * max(0, size - len(stamp))
                await producer.multi_publish("latency", [body] * due)
                sent += due
            await asyncio.sleep(0.01)
    return sent


class Watcher(threading.Thread):
    """Polls the file sink's commit log; records publish -> visible for every row."""

    def __init__(self, out: Path) -> None:
        super().__init__(daemon=True)
        self.out = out
        self.latencies: list[float] = []
        self.published: list[float] = []
        self.first_commit: float | None = None
        self.stopping = threading.Event()
        self.seen: set[str] = set()
        self.files: set[str] = set()

    def run(self) -> None:
        import pyarrow.parquet as pq

        log = self.out / "_spark_metadata"
        while not self.stopping.wait(0.02):
            if not log.exists():
                continue
            for entry in sorted(log.iterdir(), key=lambda p: p.name):
                if not entry.name.split(".")[0].isdigit() or entry.name in self.seen:
                    continue  # N and N.compact (every 10th batch, it repeats older entries)
                now = time.time()
                self.seen.add(entry.name)
                for line in entry.read_text().splitlines()[1:]:
                    url = urllib.parse.urlparse(json.loads(line)["path"])
                    path = urllib.parse.unquote(url.path)
                    if path in self.files:
                        continue
                    self.files.add(path)
                    bodies = pq.read_table(path, columns=["body"])["body"].to_pylist()
                    if bodies and self.first_commit is None:
                        self.first_commit = now
                    stamps = [float(b.split(b" ", 1)[0]) for b in bodies]
                    self.published += stamps
                    self.latencies += [now - stamp for stamp in stamps]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--trigger", default="1 second")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--option", action="append", default=[], help="KEY=VALUE source option")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from nsqpy.pipeline.session import pipeline_session

    work = Path(tempfile.mkdtemp(prefix="bench-spark-latency-"))
    nsq = LocalNSQ(work).start()
    spark = pipeline_session(args.master, "bench_spark_latency", log_level="ERROR")
    try:
        make_topic(nsq, "latency", "archive")
        spark.range(1000).selectExpr("sum(id)").collect()
        options = {
            "lookupd": nsq.lookupd_http,
            "topic": "latency",
            "channel": "archive",
            "stagingLocation": str(work / "staging"),
            **dict(item.split("=", 1) for item in args.option),
        }
        out = work / "out"
        watcher = Watcher(out)
        watcher.start()
        started = time.time()
        query = (
            spark.readStream.format("nsq")
            .options(**options)
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(work / "ckpt"))
            .trigger(processingTime=args.trigger)
            .start()
        )
        sent = asyncio.run(produce(nsq.nsqd_tcp, args.rate, args.seconds, args.size))
        deadline = time.monotonic() + 60
        while len(watcher.latencies) < sent and time.monotonic() < deadline:
            time.sleep(0.1)
        query.stop()
        watcher.stopping.set()
        watcher.join(5)
        seen = len(watcher.latencies)
        print(
            f"{args.rate:,} msgs/s for {args.seconds:.0f} s, trigger {args.trigger}, {args.master}"
        )
        if watcher.first_commit is not None:
            print(f"  start() -> first committed batch  {watcher.first_commit - started:.2f} s")
        if watcher.latencies:
            p50 = percentile(watcher.latencies, 0.5)
            p99 = percentile(watcher.latencies, 0.99)
            top = max(watcher.latencies)
            print(
                f"  publish -> visible in Parquet  p50 {p50:.2f} s  p99 {p99:.2f} s  "
                f"max {top:.2f} s"
            )
            # the second half of the run: the start-up backlog is behind it
            half = started + args.seconds / 2
            steady = [
                latency
                for latency, stamp in zip(watcher.latencies, watcher.published, strict=True)
                if stamp >= half
            ]
            if steady:
                print(
                    f"  published in the 2nd half of the run  p50 {percentile(steady, 0.5):.2f} s"
                    f"  p99 {percentile(steady, 0.99):.2f} s"
                )
        batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
        if batches:
            first = batches[0]
            print(
                f"  first batch: {first['numInputRows']:,} rows, durationMs {first['durationMs']}"
            )
            rows = [p["numInputRows"] for p in batches[1:]]
            if rows:
                print(f"  later batches: {len(rows)}, {sum(rows) / len(rows):,.0f} rows on average")
        print(f"  rows {seen:,} of {sent:,}  {load()}")
        return 0 if seen == sent else 1
    finally:
        spark.stop()
        nsq.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
