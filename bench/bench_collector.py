"""What CPython's cycle collector walks over a backlog queued in nsqd's channels.

    python bench/bench_collector.py --messages 1000000 --channels 100 --trials 3
    python bench/bench_collector.py --before-src /tmp/before/src     # an older tree beside

In one process: ``--messages`` messages published in MPUBs of ``--batch`` (each an MPUB's
run, as ``Topic.new_run`` makes it from the parser's lists of bodies), every run queued in
``--channels`` channel memory queues, then one young collection (the first one a queued run
meets in nsqd). Printed: the objects the collector still tracks beyond those before the
backlog, and how long a full collection takes (the event loop stops for all of it; nsqd
paces full collections by their cost, ``nsqd/collector.py``). ``--before-src`` runs the same
in a child process with that ``src`` first on the path, alternating with this tree's.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE_SRC = Path(__file__).resolve().parent.parent / "src"


def measure(messages: int, channels: int, batch: int) -> tuple[int, float]:
    """(objects tracked beyond the start, seconds of one full collection) for a backlog."""
    from nsqpy.nsqd.memory_queue import RunQueue
    from nsqpy.nsqd.message import MessageRun

    gc.collect()
    tracked_before = len(gc.get_objects())
    queues = [RunQueue() for _ in range(channels)]
    body = b"x" * 200
    for first in range(0, messages, batch):
        count = min(batch, messages - first)
        ids = [b"%016x" % n for n in range(first, first + count)]
        run = MessageRun(ids, [body[:-1] + b"%c" % (n % 256) for n in range(count)], 1)
        for queue in queues:
            queue.extend(run)
    gc.collect(0)
    tracked = len(gc.get_objects()) - tracked_before
    began = time.perf_counter()
    gc.collect()
    return tracked, time.perf_counter() - began


def child(src: Path, args: argparse.Namespace) -> tuple[int, float]:
    code = (
        "import bench_collector as b; "
        f"print(*b.measure({args.messages}, {args.channels}, {args.batch}))"
    )
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{Path(__file__).parent}"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    tracked, seconds = out.stdout.split()
    return int(tracked), float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--channels", type=int, default=100)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--before-src", type=Path, help="an older nsqpy's src, beside")
    args = parser.parse_args()
    trees = {"nsqpy": HERE_SRC}
    if args.before_src:
        trees["before"] = args.before_src.resolve()
    results: dict[str, list[tuple[int, float]]] = {name: [] for name in trees}
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for trial in range(args.trials):
        order = list(trees.items()) if trial % 2 == 0 else list(reversed(trees.items()))
        for name, src in order:
            tracked, seconds = child(src, args)
            results[name].append((tracked, seconds))
            full = f"full {seconds * 1000:,.1f} ms"
            print(f"  trial {trial + 1} {name:6}: {tracked:,} tracked, {full}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    backlog = f"{args.messages:,} messages in runs of {args.batch}"
    print(f"{backlog}, queued on {args.channels} channels:")
    for name, found in results.items():
        tracked = found[0][0]
        median = statistics.median(seconds for _, seconds in found)
        print(f"  {name:6}: {tracked:,} objects tracked, a full collection {median * 1000:,.1f} ms")


if __name__ == "__main__":
    main()
