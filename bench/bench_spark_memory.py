"""Memory of the nsq source's read tasks: bounded by messagesPerPartition x body size, not
by the channel's depth.

    python bench/bench_spark_memory.py --messages 1000000 --size 100 --per-partition 10000

Fills a backlog of ``--messages`` bodies over two nsqd, then drains it into Parquet with
Trigger.AvailableNow, once per ``--per-partition`` value (each run on its own channel). A
sampler reads the resident set size (``VmRSS``) of every Python worker running our read
tasks (``pyspark.daemon pyspark.worker`` processes) every 50 ms and prints the largest seen,
beside the load average (the machine is shared with other work).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _spark_common import fill, load, make_topic, parquet_rows
from nsqpy.pipeline.local import LocalNSQ


def worker_rss() -> dict[int, int]:
    """RSS in bytes of each PySpark Python worker on this machine started by us."""
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            if b"pyspark.worker" not in cmdline or sys.executable.encode() not in cmdline:
                continue
            for line in Path(f"/proc/{entry}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    found[int(entry)] = int(line.split()[1]) * 1024
        except OSError:
            continue
    return found


class Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.05):
            self.peak = max([self.peak, *worker_rss().values()])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--per-partition", default="1000,10000,50000")
    parser.add_argument("--per-trigger", type=int, default=100_000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    sizes = [int(x) for x in args.per_partition.split(",")]
    count = args.messages - args.messages % 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = Path(tempfile.mkdtemp(prefix="bench-spark-memory-"))
    nsq = LocalNSQ(work, extra_nsqd_flags=[f"--mem-queue-size={count}"]).start()
    try:
        make_topic(nsq, "mem", *(f"p{n}" for n in sizes))
        filled = asyncio.run(fill(nsq, "mem", count, args.size))
        print(f"backlog: {count:,} messages of {args.size} B on 2 nsqd ({filled:.1f} s)")
        return run(args, nsq, work, sizes, count)
    finally:
        nsq.stop()
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, nsq: LocalNSQ, work: Path, sizes: list[int], count: int) -> int:
    from nsqpy.pipeline.session import pipeline_session

    spark = pipeline_session(args.master, "bench_spark_memory", log_level="ERROR")
    try:
        spark.range(1000).selectExpr("sum(id)").collect()
        baseline = max(worker_rss().values(), default=0)
        print(f"Python worker RSS before reading: {baseline / 2**20:.0f} MiB")
        for per_partition in sizes:
            sampler = Sampler()
            sampler.start()
            started = time.perf_counter()
            query = (
                spark.readStream.format("nsq")
                .option("lookupd", nsq.lookupd_http)
                .option("topic", "mem")
                .option("channel", f"p{per_partition}")
                .option("stagingLocation", str(work / f"staging-{per_partition}"))
                .option("maxMessagesPerTrigger", str(args.per_trigger))
                .option("messagesPerPartition", str(per_partition))
                .load()
                .writeStream.format("parquet")
                .option("path", str(work / f"out-{per_partition}"))
                .option("checkpointLocation", str(work / f"ckpt-{per_partition}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            elapsed = time.perf_counter() - started
            sampler.stopping.set()
            sampler.join(2)
            rows = parquet_rows(work / f"out-{per_partition}")
            bound = per_partition * args.size / 2**20
            print(
                f"messagesPerPartition {per_partition:>6,} (x {args.size} B = {bound:6.1f} MiB): "
                f"peak worker RSS {sampler.peak / 2**20:6.0f} MiB; {rows:,} rows in "
                f"{elapsed:.0f} s; channel depth was {count:,}  {load()}",
                flush=True,
            )
            if rows != count:
                print(f"ERROR: {rows} rows, {count} published", file=sys.stderr)
                return 1
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
