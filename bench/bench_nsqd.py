"""Go's bench.sh for nsqpy: a fresh nsqd, bench_writer, then bench_reader, then peak RSS.

    python bench/bench_nsqd.py --runfor 10s --size 200 --batch-size 200 --mem-queue-size 1000000

Prints the PUB and SUB lines of bench_writer and bench_reader and nsqd's peak resident memory
(VmHWM). ``--nsqd-args`` passes extra flags (e.g. ``--nsqd-args=--mem-queue-size=0``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from nsqpy.testing import start_nsqd

BENCH = Path(__file__).resolve().parent


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_tool(tool: str, args: list[str]) -> None:
    subprocess.run([sys.executable, str(BENCH / tool), *args], check=True, timeout=600)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runfor", default="10s")
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--mem-queue-size", type=int, default=1000000)
    parser.add_argument("--nsqd-args", default="")
    parser.add_argument("--skip-reader", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as data:
        flags = [f"--mem-queue-size={args.mem_queue_size}", *shlex.split(args.nsqd_args)]
        nsqd = start_nsqd(data, *flags)
        try:
            address = "{}:{}".format(*nsqd.tcp_address)
            common = ["--runfor", args.runfor, "--nsqd-tcp-address", address]
            common += ["--size", str(args.size)]
            print(f"nsqd pid {nsqd.pid} flags {' '.join(flags)}", file=sys.stderr, flush=True)
            run_tool("bench_writer.py", [*common, "--batch-size", str(args.batch_size)])
            if not args.skip_reader:
                run_tool("bench_reader.py", [*common, "--rdy", str(args.rdy)])
            print(f"nsqd peak RSS: {peak_rss_mb(nsqd.pid):.1f} MiB", file=sys.stderr, flush=True)
        finally:
            nsqd.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
