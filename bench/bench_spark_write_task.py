"""What one write task of the nsq sink costs in its Python worker, outside Spark.

    python bench/bench_spark_write_task.py --messages 1000000 --size 100

``publish_rows`` (exactly what a Spark write task runs) is given Arrow record batches of
``--batch-rows`` rows (Spark's ``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000 by
default) holding ``--size`` byte bodies, and publishes them to one nsqd. Prints rows/s and the
worker's CPU per row beside the load average (the machine is shared); ``--profile`` adds
cProfile's top functions. nsqd's own cost is not in these figures.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _spark_common import arrived_depth, bodies_for, load, make_topic
from nsqpy.pipeline.local import LocalNSQ
from nsqpy.spark.options import parse_sink_options
from nsqpy.spark.sink import publish_rows


def main() -> int:
    import pyarrow as pa

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes (>= 10)")
    parser.add_argument("--batch-rows", type=int, default=10_000, help="rows per Arrow batch")
    parser.add_argument("--sink-batch", type=int, default=500, help="batchSize (MPUB size)")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top 25")
    args = parser.parse_args()
    bodies = pa.array(bodies_for(0, args.messages, max(10, args.size)), pa.binary())
    batches = [
        pa.record_batch([bodies.slice(i, args.batch_rows)], names=["body"])
        for i in range(0, args.messages, args.batch_rows)
    ]
    work = Path(tempfile.mkdtemp(prefix="bench-write-task-"))
    nsq = LocalNSQ(work, extra_nsqd_flags=[f"--mem-queue-size={args.messages}"]).start()
    try:
        make_topic(nsq, "bench_out", "check")
        raw = {"nsqd": nsq.nsqd_tcp[0], "topic": "bench_out", "batchSize": str(args.sink_batch)}
        options = parse_sink_options(raw)
        profile = cProfile.Profile() if args.profile else None
        wall, cpu = time.perf_counter(), time.process_time()
        if profile is not None:
            profile.enable()
        result = publish_rows(iter(batches), options)
        if profile is not None:
            profile.disable()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        published = arrived_depth(nsq, "bench_out", "check", args.messages)
        us = 1e6 / args.messages
        print(f"write task of {args.messages:,} x {args.size} B  {load()}")
        print(f"  {args.messages / wall:10,.0f} rows/s  ({args.messages:,} in {wall:.2f} s)")
        print(f"  worker per row: CPU {cpu * us:.3f} us, wall {wall * us:.3f} us")
        if profile is not None:
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        if result.published != args.messages or published != args.messages:
            print(f"ERROR: {published} arrived, {args.messages} written", file=sys.stderr)
            return 1
        return 0
    finally:
        nsq.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
