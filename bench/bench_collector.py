"""What CPython's cycle collector walks over a backlog queued in nsqd's channels, and over
the messages in flight.

    python bench/bench_collector.py --messages 1000000 --channels 100 --trials 3
    python bench/bench_collector.py --before-src /tmp/before/src     # an older tree beside

In one process: ``--messages`` messages published in MPUBs of ``--batch`` (each an MPUB's
run, as ``Topic.new_run`` makes it from the parser's lists of bodies), every run queued in
``--channels`` channel memory queues, then one young collection (the first one a queued run
meets in nsqd). Printed: the objects the collector still tracks beyond those before the
backlog, and how long a full collection takes (the event loop stops for all of it; nsqd
paces full collections by their cost, ``nsqd/collector.py``). Then ``--in-flight`` messages
(100 readers at RDY 2500 keep 250,000) are put in flight from such runs as a channel's SUB
puts them (``frame_runs_in_flight``), and one young collection that finds them all is timed:
in nsqd the messages in flight are most of what a young collection walks during SUB.
``--before-src`` runs the same in a child process with that ``src`` first on the path,
alternating with this tree's.
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


class Reader:
    """The consumer the messages are in flight to (a channel's ``Consumer``, as far as a
    message refers to it)."""

    client_id = "reader"

    def timed_out_message(self) -> None:
        """Not called here."""


def measure_in_flight(messages: int, batch: int) -> float:
    """Seconds of one young collection that finds ``messages`` in flight, put there from
    MPUBs' runs as a channel's SUB puts them."""
    from nsqpy.nsqd.message import Message, MessageRun, frame_runs_in_flight

    body = b"x" * 200
    runs = []
    for first in range(0, messages, batch):
        count = min(batch, messages - first)
        ids = [b"%016x" % n for n in range(first, first + count)]
        runs.append(MessageRun(ids, [body[:-1] + b"%c" % (n % 256) for n in range(count)], 1))
    gc.collect()  # the runs are old by the time their messages go out
    in_flight: dict[bytes, Message] = {}
    reader = Reader()
    gc.disable()  # every message still young when the collection below comes
    try:
        for run in runs:
            frame_runs_in_flight([run], in_flight, in_flight, reader, 1.0, 61.0, [])
        began = time.perf_counter()
        gc.collect(0)
        return time.perf_counter() - began
    finally:
        gc.enable()


def child(src: Path, args: argparse.Namespace) -> tuple[int, float, float]:
    code = (
        "import bench_collector as b; "
        f"print(*b.measure({args.messages}, {args.channels}, {args.batch}), "
        f"b.measure_in_flight({args.in_flight}, {args.batch}))"
    )
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{Path(__file__).parent}"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    tracked, seconds, young = out.stdout.split()
    return int(tracked), float(seconds), float(young)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--channels", type=int, default=100)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--in-flight", type=int, default=250_000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--before-src", type=Path, help="an older nsqpy's src, beside")
    args = parser.parse_args()
    trees = {"nsqpy": HERE_SRC}
    if args.before_src:
        trees["before"] = args.before_src.resolve()
    results: dict[str, list[tuple[int, float, float]]] = {name: [] for name in trees}
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for trial in range(args.trials):
        order = list(trees.items()) if trial % 2 == 0 else list(reversed(trees.items()))
        for name, src in order:
            tracked, seconds, young = child(src, args)
            results[name].append((tracked, seconds, young))
            full = f"full {seconds * 1000:,.1f} ms"
            print(
                f"  trial {trial + 1} {name:6}: {tracked:,} tracked, {full}, in flight: young"
                f" {young * 1000:,.1f} ms"
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    backlog = f"{args.messages:,} messages in runs of {args.batch}"
    print(f"{backlog}, queued on {args.channels} channels:")
    for name, found in results.items():
        tracked = found[0][0]
        median = statistics.median(seconds for _, seconds, _ in found)
        print(f"  {name:6}: {tracked:,} objects tracked, a full collection {median * 1000:,.1f} ms")
    print(f"{args.in_flight:,} messages in flight from those runs, one young collection:")
    for name, found in results.items():
        median = statistics.median(young for _, _, young in found)
        per_message = median / args.in_flight * 1e9
        print(f"  {name:6}: {median * 1000:,.1f} ms ({per_message:,.0f} ns a message)")


if __name__ == "__main__":
    main()
