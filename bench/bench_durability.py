"""Write-through throughput: every published message goes to disk before nsqd answers OK.

    .venv/bin/python bench/bench_durability.py --runfor 10s --size 200 --batch-size 200
    .venv/bin/python bench/bench_durability.py --nsqd-args=--sync-every=1 --crash-check

A fresh nsqd with ``--mem-queue-size=0`` (plus ``--nsqd-args``) in a temporary data directory;
bench_writer publishes MPUB batches to a topic without channels, so every message is written to
the topic's disk queue. Prints bench_writer's line, then checks that the figure is real: the
topic's depth and backend depth (from /stats) equal the messages published and the data files
hold that many bytes. ``--crash-check`` also SIGKILLs nsqd, restarts it on the same directory
and reports the depth it finds. Finally nsqd's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from nsqpy.testing import DaemonProcess, start_nsqd

BENCH = Path(__file__).resolve().parent
TOPIC = "durability_bench"
RECORD_OVERHEAD = 4 + 26  # diskqueue length prefix + message header


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def topic_stats(nsqd: DaemonProcess) -> dict[str, Any]:
    url = f"{nsqd.http_url}/stats?format=json&topic={TOPIC}"
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.loads(response.read())
    topics = body.get("topics") or []
    return dict(topics[0]) if topics else {}


def data_files(directory: str) -> list[Path]:
    return sorted(Path(directory).glob(f"{TOPIC}.diskqueue.[0-9]*.dat"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runfor", default="10s")
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--nsqd-args", default="", help="extra nsqd flags, shell-quoted")
    parser.add_argument("--crash-check", action="store_true", help="SIGKILL, restart, recount")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as data:
        flags = ["--mem-queue-size=0", *shlex.split(args.nsqd_args)]
        nsqd = start_nsqd(data, *flags)
        try:
            print(f"nsqd pid {nsqd.pid} flags {' '.join(flags)}", file=sys.stderr, flush=True)
            address = "{}:{}".format(*nsqd.tcp_address)
            writer = [sys.executable, str(BENCH / "bench_writer.py"), "--runfor", args.runfor]
            writer += ["--nsqd-tcp-address", address, "--topic", TOPIC, "--size", str(args.size)]
            writer += ["--batch-size", str(args.batch_size)]
            subprocess.run(writer, check=True, timeout=600)

            stats = topic_stats(nsqd)
            published = stats.get("message_count", 0)
            on_disk = sum(p.stat().st_size for p in data_files(data))
            expected_bytes = published * (RECORD_OVERHEAD + args.size)
            ok = stats.get("depth") == stats.get("backend_depth") == published
            ok = ok and on_disk == expected_bytes
            print(
                f"[bench_durability] {published} messages published; depth "
                f"{stats.get('depth')}, backend_depth {stats.get('backend_depth')}; "
                f"{on_disk / 2**20:.1f} MiB in {len(data_files(data))} data files "
                f"(expected {expected_bytes / 2**20:.1f} MiB, {on_disk - expected_bytes:+d} B) - "
                f"{'all on disk' if ok else 'MISMATCH'}",
                file=sys.stderr,
                flush=True,
            )
            print(f"nsqd peak RSS: {peak_rss_mb(nsqd.pid):.1f} MiB", file=sys.stderr, flush=True)
            if args.crash_check:
                nsqd.kill()
                began = time.perf_counter()
                nsqd.start(timeout=300)
                restart = time.perf_counter() - began
                depth = topic_stats(nsqd).get("depth")
                print(
                    f"[bench_durability] after SIGKILL and restart ({restart:.1f}s): depth "
                    f"{depth} of {published} - {'none lost' if depth == published else 'LOST'}",
                    file=sys.stderr,
                    flush=True,
                )
                ok = ok and depth == published
        finally:
            nsqd.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
