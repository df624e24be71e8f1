"""What one read task of the nsq source costs in its Python worker, outside Spark.

    python bench/bench_spark_read_task.py --messages 200000 --size 1000

``fetch_task`` (exactly what a Spark read task runs) is called over and over on one nsqd
filled with ``--messages`` bodies of ``--size`` bytes, ``--per-task`` messages a task. Prints
messages/s, the worker's CPU and wall time per message, and the part of each spent building
the Arrow table and staging it (Arrow IPC write, fsync, link, directory fsync); the rest is
receiving (socket, frame boundaries), FIN and the task's connection set-up. With the
load average: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _spark_common import fill, load, make_topic
from nsqpy.pipeline.local import LocalNSQ
from nsqpy.spark import fetch
from nsqpy.spark.options import parse_source_options
from nsqpy.spark.plan import ReadTask
from nsqpy.spark.staging import Staging


class Timed:
    """Wall and CPU seconds spent inside one function, while it is patched in."""

    def __init__(self, owner: Any, name: str) -> None:
        self.wall = self.cpu = 0.0
        original: Callable[..., Any] = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.wall += time.perf_counter() - wall
                self.cpu += time.process_time() - cpu

        setattr(owner, name, timed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1000, help="body bytes (>= 10)")
    parser.add_argument("--per-task", type=int, default=10_000, help="messagesPerPartition")
    args = parser.parse_args()
    count = args.messages - args.messages % args.per_task
    work = Path(tempfile.mkdtemp(prefix="bench-read-task-"))
    # one nsqd holds every message: LocalNSQ starts two, fill() splits evenly, so fill twice
    nsq = LocalNSQ(work, extra_nsqd_flags=[f"--mem-queue-size={2 * count}"]).start()
    try:
        make_topic(nsq, "bench", "spark")
        asyncio.run(fill(nsq, "bench", 2 * count, max(10, args.size)))
        address = nsq.nsqd_tcp[0]
        raw = {"nsqd": address, "topic": "bench", "channel": "spark"}
        options = parse_source_options(
            {**raw, "stagingLocation": str(work / "staging")}, streaming=True
        )
        staging = Staging(options.staging_location)
        staging.claim(options.identity())
        table = Timed(fetch, "frames_table")
        stage = Timed(Staging, "publish")
        wall, cpu = time.perf_counter(), time.process_time()
        for n in range(count // args.per_task):
            task = ReadTask(f"{n}-bench-r0", 1, "bench", address, args.per_task)
            rows = fetch.fetch_task(task, options, staging).num_rows
            if rows != args.per_task:
                print(f"ERROR: task {n} read {rows} of {args.per_task}", file=sys.stderr)
                return 1
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        us = 1e6 / count
        print(f"read tasks of {args.per_task:,} x {args.size} B  {load()}")
        print(f"  {count / wall:10,.0f} msgs/s  ({count:,} in {wall:.2f} s)")
        print(f"  worker per message: CPU {cpu * us:.2f} us, wall {wall * us:.2f} us")
        for label, part in (("Arrow table", table), ("staging", stage)):
            print(f"    {label:12} CPU {part.cpu * us:.2f} us, wall {part.wall * us:.2f} us")
        rest = cpu - table.cpu - stage.cpu
        print(f"    {'the rest':12} CPU {rest * us:.2f} us (receive, FIN, connections)")
        return 0
    finally:
        nsq.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
