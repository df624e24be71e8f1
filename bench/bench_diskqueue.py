"""DiskQueue throughput: put, put_many and get of fixed-size records, with nsqd's settings.

    .venv/bin/python bench/bench_diskqueue.py                      # 200-byte records
    .venv/bin/python bench/bench_diskqueue.py --size 226 --batch 200

Each phase runs inside an asyncio loop with the owner's syncer task (run_syncer) active, as
nsqd would run it, so the fsyncs (every --sync-every operations, in a worker thread) and the
file rolls are part of the figures. Every phase is bounded by --records and --seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable

from nsqpy.nsqd.diskqueue import DiskQueue


def quiet(level: str, message: str) -> None:
    if level in ("WARN", "ERROR"):
        print(f"{level}: {message}")


def report(label: str, records: int, size: int, seconds: float) -> None:
    rate = records / seconds
    print(
        f"{label:<28} {records:>9} records in {seconds:6.2f} s  "
        f"{rate:>12,.0f} records/s  {rate * size / 1e6:8.1f} MB/s"
    )


async def timed(
    queue: DiskQueue, work: Callable[[], int], limit: int, seconds: float
) -> tuple[int, float]:
    """Call ``work`` (which returns how many records it handled) until ``limit`` records or
    ``seconds`` passed, yielding to the loop between calls so the syncer can run."""
    syncer = asyncio.create_task(queue.run_syncer())
    done = 0
    start = time.perf_counter()
    deadline = start + seconds
    while done < limit and time.perf_counter() < deadline:
        handled = work()
        if handled == 0:
            break
        done += handled
        await asyncio.sleep(0)
    elapsed = time.perf_counter() - start
    syncer.cancel()
    await queue.sync()
    return done, elapsed


async def run(args: argparse.Namespace) -> None:
    directory = tempfile.mkdtemp(prefix="bench-diskqueue-", dir=args.dir)
    record = b"x" * args.size
    try:
        print(
            f"record {args.size} B, batch {args.batch}, max-bytes-per-file "
            f"{args.max_bytes_per_file}, sync-every {args.sync_every}, data in {directory}"
        )
        queue = DiskQueue(
            "bench",
            directory,
            args.max_bytes_per_file,
            26,
            1024 * 1024 + 26,
            args.sync_every,
            2.0,
            quiet,
        )

        def put_one_by_one() -> int:
            for _ in range(args.batch):
                queue.put(record)
            return args.batch

        batch = [record] * args.batch

        def put_batch() -> int:
            queue.put_many(batch)
            return args.batch

        def get_batch() -> int:
            got = 0
            for _ in range(args.batch):
                if queue.get() is None:
                    break
                got += 1
            return got

        count, seconds = await timed(queue, put_one_by_one, args.records, args.seconds)
        report("put (one record per call)", count, args.size, seconds)
        count, seconds = await timed(queue, put_batch, args.records, args.seconds)
        report(f"put_many (batches of {args.batch})", count, args.size, seconds)
        total = queue.depth()
        count, seconds = await timed(queue, get_batch, total, args.seconds)
        report("get", count, args.size, seconds)
        queue.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=500_000, help="records per phase")
    parser.add_argument("--size", type=int, default=200, help="record size in bytes")
    parser.add_argument("--batch", type=int, default=100, help="records per put_many/yield")
    parser.add_argument("--seconds", type=float, default=20.0, help="time limit per phase")
    parser.add_argument("--sync-every", type=int, default=2500)
    parser.add_argument("--max-bytes-per-file", type=int, default=100 * 1024 * 1024)
    parser.add_argument("--dir", default=None, help="parent directory for the data files")
    args = parser.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
