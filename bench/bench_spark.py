"""Throughput of the Spark connector beside what Spark itself does with the same rows.

    python bench/bench_spark.py --messages 1000000 --size 100 --master 'local[2]'

One run prints, each with the load average (the machine is shared: say so with the figure):

1. FLOOR: the same rows (the source's seven columns, ``--size`` byte bodies) pre-staged as
   Parquet files of ``--per-partition`` rows, read by Spark's own file source
   (``maxFilesPerTrigger`` = per-trigger / per-partition, so each micro-batch holds the same
   rows) and written to the same Parquet sink with Trigger.AvailableNow on the same master.
   PYTHON FLOOR: the same rows made in memory by a trivial Python streaming data source, the
   cost of the Python Data Source API alone (no NSQ).
2. OURS: topic ``bench`` on two nsqd, read with ``format("nsq")`` into Parquet: whole query
   (first micro-batch and Python worker start included) and steady state (the micro-batches
   after the first, from Spark's own ``durationMs.triggerExecution``); ratio to the floor.
3. SINK: the archived bodies written back with ``df.write.format("nsq")`` beside one process
   publishing the same rows with our Producer (MPUB, same batch size and window), in
   ``--sink-trials`` alternating trials (sink, Producer, sink, Producer...: one ~1 s run of
   each is at the mercy of the shared machine); every trial printed, ratio of the medians.

Each step checks its count (Parquet rows, nsqd depth) so a fast wrong run cannot pass.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _spark_common import (
    arrived_depth,
    cpu_seconds,
    cpu_spent,
    cpu_used,
    empty_channel,
    fill,
    format_cpu,
    load,
    make_topic,
    parquet_rows,
    rate,
)
from nsqpy.client import Producer
from nsqpy.pipeline.local import LocalNSQ

# ---------------------------------------------------------------------- the same rows


def floor_table(first: int, count: int, size: int) -> Any:
    """``count`` rows exactly as the source stages them (schema and body size), made with
    Arrow kernels: the Python floor should cost its worker as little as possible."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from nsqpy.spark.staging import STAGED_SCHEMA

    numbers = pa.array(range(first, first + count), pa.int64()).cast(pa.string())
    padding = pa.scalar(b"x" * (size - 10), pa.binary())
    bodies = pc.binary_join_element_wise(
        pc.utf8_lpad(numbers, 10, "0").cast(pa.binary()), padding, b""
    )
    now_us = pa.scalar(int(time.time() * 1e6), pa.timestamp("us", tz="UTC"))
    columns = [
        bodies,
        pc.utf8_lpad(numbers, 16, "0"),  # 16 characters, as nsqd's hex ids
        pa.repeat(pa.scalar(1, pa.int32()), count),
        pa.repeat(now_us, count),
        pa.repeat(pa.scalar("127.0.0.1:4150", pa.string()), count),
        pa.repeat(pa.scalar("bench", pa.string()), count),
        pa.repeat(pa.scalar("spark", pa.string()), count),
    ]
    return pa.Table.from_arrays(columns, schema=STAGED_SCHEMA)


def stage_parquet(directory: Path, count: int, size: int, per_file: int) -> None:
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    for n, first in enumerate(range(0, count, per_file)):
        table = floor_table(first, min(per_file, count - first), size)
        pq.write_table(table, directory / f"part-{n:05d}.parquet")


def python_floor_source(count: int, size: int, per_trigger: int, per_partition: int) -> type:
    """A Python streaming source that makes the rows in memory: the Data Source API's cost."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    from nsqpy.spark.fetch import record_batches
    from nsqpy.spark.source import FULL_SCHEMA

    target = to_arrow_schema(FULL_SCHEMA, timezone="UTC")

    class GenReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def initialOffset(self) -> dict[str, int]:
            return {"n": 0}

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
            return {"n": min(count, start["n"] + per_trigger)}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
            spans = range(start["n"], end["n"], per_partition)
            return [InputPartition((a, min(per_partition, end["n"] - a))) for a in spans]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            first, n = partition.value
            # the exact Arrow types Spark expects, as the nsq source hands them over
            yield from record_batches(floor_table(first, n, size), target)

        def commit(self, end: dict[str, int]) -> None:
            pass

    class GenSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "benchgen"

        def schema(self) -> Any:
            return FULL_SCHEMA

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return GenReader()

    return GenSource


def noop_writer_source() -> type:
    """A Python sink that takes the Arrow batches and drops them: what Spark's side costs."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class NoopWriter(DataSourceArrowWriter):
        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

    class NoopSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "benchnoop"

        def writer(self, schema: Any, overwrite: bool) -> NoopWriter:
            return NoopWriter()

    return NoopSink


# ---------------------------------------------------------------------- streaming runs


def run_to_parquet(df: Any, work: Path, name: str) -> tuple[float, list[Any], int, str]:
    """Run ``df`` into Parquet with AvailableNow; (seconds, non-empty progress, rows out,
    CPU seconds by process)."""
    out = work / f"{name}-out"
    cpu_before = cpu_seconds()
    started = time.perf_counter()
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(work / f"{name}-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    cpu = cpu_used(cpu_before, cpu_seconds())
    if query.exception() is not None:
        raise RuntimeError(f"{name}: query failed: {query.exception()}")
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    return elapsed, batches, parquet_rows(out), cpu


def steady_state(batches: list[Any]) -> tuple[int, float]:
    """Rows and seconds of the micro-batches after the first (Spark's triggerExecution)."""
    later = batches[1:]
    rows = sum(p["numInputRows"] for p in later)
    return rows, sum(p["durationMs"]["triggerExecution"] for p in later) / 1000


def durations(batches: list[Any]) -> str:
    """Where the steady micro-batches' time went, per Spark's durationMs (ms, averaged)."""
    later = batches[1:] or batches
    keys = ["latestOffset", "queryPlanning", "addBatch", "commitOffsets", "walCommit"]
    parts = []
    for key in keys:
        values = [p["durationMs"].get(key, 0) for p in later]
        parts.append(f"{key} {sum(values) / len(values):.0f}")
    total = sum(p["durationMs"]["triggerExecution"] for p in later) / len(later)
    return f"per batch: triggerExecution {total:.0f} ms = " + ", ".join(parts)


def report_stream(label: str, elapsed: float, batches: list[Any], rows: int, cpu: str) -> float:
    steady_rows, steady_s = steady_state(batches)
    print(f"{label} ({len(batches)} micro-batches)  {load()}", flush=True)
    print(f"  whole query          {rate(rows, elapsed, 'msgs')}", flush=True)
    print(f"  after the 1st batch  {rate(steady_rows, steady_s, 'msgs')}", flush=True)
    print(f"  {durations(batches)}", flush=True)
    print(f"  whole query's {cpu}", flush=True)
    return steady_rows / steady_s if steady_s else 0.0


@contextlib.contextmanager
def profiled(directory: str | None, name: str) -> Iterator[None]:
    """py-spy (``pip install py-spy``) over this process and its Python workers, if asked."""
    if directory is None:
        yield
        return
    out = Path(directory) / f"{name}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    spy_bin = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    command = [spy_bin, "record", "--idle", "-r", "100", "-f", "raw"]
    # py-spy's --subprocesses missed the driver -> JVM -> pyspark.daemon chain: every Python
    # process below this one (nsqd, the daemon with its forked workers) gets its own py-spy
    targets = {
        os.getpid(): out,
        **{pid: out.with_name(f"{name}-{pid}.txt") for pid in _python_descendants()},
    }
    follow = ["--subprocesses"]  # a pyspark.daemon forks its workers
    spies = [
        subprocess.Popen(
            [*command, *(follow if pid != os.getpid() else []), "-o", str(path), "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for pid, path in targets.items()
    ]
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for spy in spies:
            spy.wait(30)


def _python_descendants() -> list[int]:
    """Python processes below this one, outermost first (a forked child is not listed
    when its parent is, as ``--subprocesses`` covers it)."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(stat.parent.name)
            parents[pid] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            commands[pid] = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
    found: list[int] = []

    def walk(pid: int, covered: bool) -> None:
        for child in sorted(p for p, parent in parents.items() if parent == pid):
            is_python = "python" in commands.get(child, "") and "py-spy" not in commands[child]
            if is_python and not covered:
                found.append(child)
            walk(child, covered or is_python)

    walk(os.getpid(), False)
    return found


# ---------------------------------------------------------------------- the benchmark


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes (>= 10)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--per-trigger", type=int, default=100_000, help="maxMessagesPerTrigger")
    parser.add_argument("--per-partition", type=int, default=10_000, help="messagesPerPartition")
    parser.add_argument("--readers", type=int, default=1, help="readersPerNsqd")
    parser.add_argument("--sink-batch", type=int, default=500, help="batchSize (MPUB size)")
    parser.add_argument(
        "--sink-trials", type=int, default=3, help="alternating sink / Producer runs (medians)"
    )
    parser.add_argument("--profile", help="directory: py-spy the driver and Python workers")
    parser.add_argument("--skip", default="", help="comma list of: floor,pyfloor,sink")
    parser.add_argument(
        "--conf", action="append", default=[], help="KEY=VALUE Spark setting (repeatable)"
    )
    parser.add_argument(
        "--option", action="append", default=[], help="KEY=VALUE nsq source option (repeatable)"
    )
    args = parser.parse_args()
    args.size = max(10, args.size)
    args.skip = set(filter(None, args.skip.split(",")))
    count = args.messages - args.messages % 2

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    nsq = LocalNSQ(work, extra_nsqd_flags=[f"--mem-queue-size={count}"]).start()
    try:
        make_topic(nsq, "bench", "spark")
        make_topic(nsq, "bench_out", "check")
        make_topic(nsq, "bench_prod", "check")
        filled = asyncio.run(fill(nsq, "bench", count, args.size))
        print(f"nsqd x2: filled {count:,} messages of {args.size} B in {filled:.2f} s", flush=True)
        if "floor" not in args.skip:
            stage_parquet(work / "floor-in", count, args.size, args.per_partition)
        return run_spark(args, nsq, work, count)
    finally:
        nsq.stop()
        shutil.rmtree(work, ignore_errors=True)


def run_spark(args: argparse.Namespace, nsq: LocalNSQ, work: Path, count: int) -> int:
    from nsqpy.pipeline.session import pipeline_session
    from nsqpy.spark.source import FULL_SCHEMA

    conf = dict(item.split("=", 1) for item in args.conf)
    spark = pipeline_session(args.master, "bench_spark", conf, log_level="ERROR")
    try:
        spark.range(1000).selectExpr("sum(id)").collect()  # JVM warm-up, outside the timing
        if "floor" not in args.skip:
            # the Parquet reader and writer's code compiled before any timed query, so the
            # first timed query is not also the JIT's warm-up
            warm = spark.read.schema(FULL_SCHEMA).parquet(str(work / "floor-in"))
            warm.write.parquet(str(work / "warm-up"))
        print(f"master {args.master}, {args.per_trigger:,} rows per micro-batch", flush=True)
        floor = pyfloor = 0.0
        if "floor" not in args.skip:
            files = max(1, args.per_trigger // args.per_partition)
            reader = spark.readStream.schema(FULL_SCHEMA).option("maxFilesPerTrigger", files)
            result = run_to_parquet(reader.parquet(str(work / "floor-in")), work, "floor")
            floor = report_stream("FLOOR: Spark's Parquet file source -> Parquet", *result)
        if "pyfloor" not in args.skip:
            spark.dataSource.register(
                python_floor_source(count, args.size, args.per_trigger, args.per_partition)
            )
            result = run_to_parquet(spark.readStream.format("benchgen").load(), work, "pyfloor")
            pyfloor = report_stream(
                "PYTHON FLOOR: in-memory Python data source -> Parquet", *result
            )

        options = {
            "lookupd": nsq.lookupd_http,
            "topic": "bench",
            "channel": "spark",
            "stagingLocation": str(work / "staging"),
            "maxMessagesPerTrigger": str(args.per_trigger),
            "messagesPerPartition": str(args.per_partition),
            "readersPerNsqd": str(args.readers),
            **dict(item.split("=", 1) for item in args.option),
        }
        df = spark.readStream.format("nsq").options(**options).load()
        with profiled(args.profile, "source"):
            elapsed, batches, archived, cpu = run_to_parquet(df, work, "ours")
        ours = report_stream("OURS: format('nsq') -> Parquet", elapsed, batches, archived, cpu)
        for name, value in (("floor", floor), ("python floor", pyfloor)):
            if value:
                print(f"  steady state / {name}: {ours / value:.2f}x", flush=True)
        if archived != count:
            print(f"ERROR: {archived} rows archived, {count} published", file=sys.stderr)
            return 1
        if "sink" not in args.skip:
            return run_sink(spark, args, nsq, work / "ours-out", count)
        return 0
    finally:
        spark.stop()


def run_sink(spark: Any, args: argparse.Namespace, nsq: LocalNSQ, out: Path, count: int) -> int:
    import pyarrow.dataset as ds

    cores = spark.sparkContext.defaultParallelism
    bodies = spark.read.parquet(str(out)).select("body").repartition(cores).cache()
    assert bodies.count() == count
    # the write path's Python workers and imports ready before the timing, as the Producer's are
    warm = bodies.limit(1000).write.format("nsq").option("lookupd", nsq.lookupd_http)
    warm.option("topic", "bench_warm").mode("append").save()
    # and the JVM's side (cached rows -> Arrow -> Python worker) compiled by the JIT over all
    # the rows, as the floor's warm-up write does for the Parquet path
    spark.dataSource.register(noop_writer_source())
    bodies.write.format("benchnoop").mode("append").save()
    rows = ds.dataset(str(out), format="parquet").to_table(columns=["body"])["body"].to_pylist()

    def sink() -> None:
        writer = bodies.write.format("nsq").option("lookupd", nsq.lookupd_http)
        writer = writer.option("topic", "bench_out").option("batchSize", str(args.sink_batch))
        writer.mode("append").save()

    def producer() -> None:
        asyncio.run(publish_with_producer(nsq.nsqd_tcp, rows, args.sink_batch))

    print(
        f"SINK: df.write.format('nsq') ({cores} partitions) beside one Producer process, "
        f"{args.sink_trials} alternating trials of {count:,} rows",
        flush=True,
    )
    # alternating trials: one ~1 s run of each is at the mercy of the shared machine
    trials: dict[str, list[tuple[float, dict[str, float]]]] = {"sink": [], "Producer": []}
    for n in range(1, args.sink_trials + 1):
        for label, topic, run in (
            ("sink", "bench_out", sink),
            ("Producer", "bench_prod", producer),
        ):
            with profiled(args.profile if n == 1 else None, label.lower()):
                seconds, cpu = timed_trial(run)
            arrived = arrived_depth(nsq, topic, "check", count)
            print(f"  {n} {label:9} {rate(arrived, seconds, 'rows')}  {load()}", flush=True)
            print(f"      {format_cpu(cpu)}", flush=True)
            if arrived != count:
                print(f"ERROR: {arrived} arrived, {count} written", file=sys.stderr)
                return 1
            empty_channel(nsq, topic, "check")
            trials[label].append((seconds, cpu))

    noop_s, noop_cpu = timed_trial(lambda: bodies.write.format("benchnoop").mode("append").save())
    print(f"  Spark's Python writer, discarding rows  {rate(count, noop_s, 'rows')}", flush=True)
    print(f"      {format_cpu(noop_cpu)}", flush=True)
    sink_s, producer_s = (statistics.median(s for s, _ in trials[k]) for k in ("sink", "Producer"))
    for label, runs in trials.items():
        median_cpu = {k: statistics.median(c.get(k, 0.0) for _, c in runs) for k in runs[0][1]}
        seconds = sink_s if label == "sink" else producer_s
        print(f"  median {label:9} {rate(count, seconds, 'rows')}", flush=True)
        print(f"      median {format_cpu(median_cpu)}", flush=True)
    print(f"  sink / Producer (medians): {producer_s / sink_s:.2f}x", flush=True)
    print(f"  Python writer (no NSQ) / Producer: {producer_s / noop_s:.2f}x", flush=True)
    return 0


def timed_trial(run: Callable[[], None]) -> tuple[float, dict[str, float]]:
    """Wall seconds and CPU seconds by kind of process of one ``run()``."""
    cpu_before = cpu_seconds()
    started = time.perf_counter()
    run()
    elapsed = time.perf_counter() - started
    return elapsed, cpu_spent(cpu_before, cpu_seconds())


async def publish_with_producer(nsqd: list[str], rows: list[bytes], batch: int) -> float:
    """What one process does with our Producer: MPUB of ``batch`` rows, 16 outstanding (as
    the sink's default ``inFlightBatches``)."""
    started = time.perf_counter()
    async with Producer(nsqd) as producer:
        window = asyncio.Semaphore(16)

        async def send(bodies: list[bytes]) -> None:
            try:
                await producer.multi_publish("bench_prod", bodies)
            finally:
                window.release()

        tasks = []
        for i in range(0, len(rows), batch):
            await window.acquire()
            tasks.append(asyncio.create_task(send(rows[i : i + batch])))
        await asyncio.gather(*tasks)
    return time.perf_counter() - started


if __name__ == "__main__":
    sys.exit(main())
