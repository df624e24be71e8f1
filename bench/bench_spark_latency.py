"""Latency of the nsq source: publish -> row visible in the Parquet output, at a steady rate.

    python bench/bench_spark_latency.py --rate 10000 --seconds 30 --trigger "1 second"
    python bench/bench_spark_latency.py --job aggregate --rate 10000 --seconds 40 \
        --window "2 seconds" --watermark "2 seconds"

A producer publishes ``--rate`` messages per second (MPUB every 10 ms, over two nsqd) for
``--seconds``; each body starts with its publish time. A streaming query reads them with
``format("nsq")`` into Parquet with a processing-time trigger. A watcher polls the file sink's
commit log (``_spark_metadata``) every 20 ms: a row is visible when the log lists its file.
Prints p50 / p99 / max of publish -> visible, the time from ``start()`` to the first
committed batch, and the load average (the machine is shared with other work).

``--job aggregate`` runs the pipeline's ``aggregate`` job instead (JSON events counted per
page in tumbling windows of publish time, each window's counts published to NSQ once the
watermark passes its end) and a consumer on the output topic; it prints, per event, publish ->
its window's count published, and per window, window end -> count published (which includes
the configured watermark by design: append mode waits for it).
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
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _spark_common import load, make_topic
from nsqpy.client import Consumer, Message, Producer
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


async def produce_events(
    nsqd: list[str], rate: int, seconds: float, flush: float, published: list[float]
) -> int:
    """``rate`` JSON events a second over ten pages for ``seconds`` (each MPUB's time in
    ``published``, once per event), then a trickle on page ``flush`` for ``flush`` seconds:
    event time moves on, so the watermark passes the last real windows and they close."""
    sent = 0
    async with Producer(nsqd) as producer:
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < seconds + flush:
            if elapsed >= seconds:
                await producer.publish("latency", b'{"page": "flush"}')
                await asyncio.sleep(0.1)
                continue
            due = int(elapsed * rate) - sent
            if due > 0:
                now = time.time()
                bodies = [b'{"page": "p%d"}' % ((sent + i) % 10) for i in range(due)]
                await producer.multi_publish("latency", bodies)
                published += [now] * due
                sent += due
            await asyncio.sleep(0.01)
    return sent


class WindowCounts:
    """The aggregate job's output as it arrives: (window start, page) -> (arrival, count)."""

    def __init__(self) -> None:
        self.arrivals: dict[tuple[float, str], tuple[float, int]] = {}
        self.duplicates = 0

    async def handle(self, message: Message) -> None:
        from datetime import datetime

        now = time.time()
        row = json.loads(message.body)
        if row["page"] == "flush":
            return
        start = datetime.fromisoformat(row["window_start"].replace("Z", "+00:00")).timestamp()
        key = (start, row["page"])
        if key in self.arrivals:
            self.duplicates += 1  # at least once: a replayed micro-batch publishes again
            return
        self.arrivals[key] = (now, int(row["count"]))


def run_aggregate(args: argparse.Namespace, spark: Any, nsq: LocalNSQ, work: Path) -> int:
    from nsqpy.pipeline.jobs import SourceConfig, Trigger, aggregate_query

    make_topic(nsq, "latency", "aggregate")
    make_topic(nsq, "latency_counts", "check")
    window = float(args.window.split()[0])
    watermark = float(args.watermark.split()[0])
    source = SourceConfig(
        "latency", lookupd=[nsq.lookupd_http], options=dict(i.split("=", 1) for i in args.option)
    )
    started = time.time()
    query = aggregate_query(
        spark,
        source,
        output_topic="latency_counts",
        checkpoint=work / "ckpt",
        staging=work / "staging",
        window=args.window,
        watermark=args.watermark,
        trigger=Trigger(args.trigger),
    )
    counts = WindowCounts()
    published: list[float] = []

    async def run() -> int:
        # RDY on every nsqd at once (max_in_flight 1 would leave one nsqd's counts waiting)
        consumer = Consumer(
            "latency_counts",
            "check",
            counts.handle,
            nsqd_tcp_addresses=nsq.nsqd_tcp,
            max_in_flight=200,
        )
        async with consumer:
            flush = window + watermark + 20
            return await produce_events(nsq.nsqd_tcp, args.rate, args.seconds, flush, published)

    sent = asyncio.run(run())
    batches = [b for b in query.recentProgress if b["numInputRows"] > 0][1:]
    dropped = sum(
        op.get("numRowsDroppedByWatermark", 0)
        for b in query.recentProgress
        for op in b.get("stateOperators", ())
    )
    query.stop()
    # each event's window (publish time here vs nsqd's timestamp there: a few events near a
    # boundary may be counted in the neighbouring window; the totals are checked below)
    latencies = []
    by_window: dict[float, float] = {}
    for n, stamp in enumerate(published):
        start = stamp - stamp % window
        arrival = counts.arrivals.get((start, f"p{n % 10}"))
        if arrival is not None:
            latencies.append(arrival[0] - stamp)
            by_window[start] = max(by_window.get(start, 0.0), arrival[0])
    counted = sum(count for _, count in counts.arrivals.values())
    print(
        f"aggregate job: {args.rate:,} events/s for {args.seconds:.0f} s, window {args.window}, "
        f"watermark {args.watermark}, trigger {args.trigger}, {args.master}"
    )
    if counts.arrivals:
        first = min(arrival for arrival, _ in counts.arrivals.values())
        print(f"  start() -> first count published  {first - started:.2f} s")
    if latencies:
        print(
            f"  event published -> its window's count published  p50 "
            f"{percentile(latencies, 0.5):.2f} s  p99 {percentile(latencies, 0.99):.2f} s  "
            f"max {max(latencies):.2f} s  ({len(latencies):,} events)"
        )
        ends = [arrival - (start + window) for start, arrival in by_window.items()]
        half = started + args.seconds / 2
        later = [
            arrival - (start + window) for start, arrival in by_window.items() if start >= half
        ]
        print(
            f"  window end -> last page's count published  p50 {percentile(ends, 0.5):.2f} s  "
            f"p99 {percentile(ends, 0.99):.2f} s  ({len(ends)} windows; the watermark "
            f"{watermark:g} s is in it by design)"
        )
        if later:
            print(
                f"  windows of the 2nd half  p50 {percentile(later, 0.5):.2f} s  "
                f"p99 {percentile(later, 0.99):.2f} s  ({len(later)} windows)"
            )
    if batches:
        mean = {
            key: sum(b["durationMs"].get(key, 0) for b in batches) / len(batches)
            for key in ("triggerExecution", "addBatch")
        }
        rows = sum(b["numInputRows"] for b in batches) / len(batches)
        print(
            f"  {len(batches)} micro-batches after the first: "
            f"{rows:,.0f} rows, triggerExecution {mean['triggerExecution']:.0f} ms, "
            f"addBatch {mean['addBatch']:.0f} ms on average"
        )
    print(
        f"  events {sent:,}, counted {counted:,}, dropped as later than the watermark "
        f"{dropped:,} (Spark's progress), duplicate counts "
        f"{counts.duplicates}  {load()}"
    )
    # a count above what was sent is wrong; a few late events dropped is the job's contract
    return 0 if 0.95 * sent <= counted <= sent else 1


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
    parser.add_argument("--job", choices=["archive", "aggregate"], default="archive")
    parser.add_argument("--window", default="2 seconds", help="aggregate: window (seconds)")
    parser.add_argument("--watermark", default="2 seconds", help="aggregate: watermark")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from nsqpy.pipeline.session import pipeline_session

    work = Path(tempfile.mkdtemp(prefix="bench-spark-latency-"))
    nsq = LocalNSQ(work).start()
    # every micro-batch's progress kept (default: the last 100), for the watermark's drops
    keep = {"spark.sql.streaming.numRecentProgressUpdates": "10000"}
    spark = pipeline_session(args.master, "bench_spark_latency", keep, log_level="ERROR")
    try:
        spark.range(1000).selectExpr("sum(id)").collect()
        if args.job == "aggregate":
            return run_aggregate(args, spark, nsq, work)
        make_topic(nsq, "latency", "archive")
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
