"""The cost of nsqadmin's poller (``--poll-interval``) to the cluster it watches.

Starts nsqlookupd, ``--nsqd`` nsqd with ``--topics`` topics of 2 channels each, and nsqadmin
in lookupd mode with the given poll interval (default: nsqadmin's default, 5s); runs for
``--runfor`` with no browser attached, then counts from the daemons' own request logs how many
requests nsqadmin made, and reads nsqadmin's CPU time from /proc.

    python bench/bench_nsqadmin_poller.py [--runfor 60s] [--poll-interval 5s] [--nsqd 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _common import go_style_args, parse_duration
from nsqpy.testing import DaemonProcess, start_nsqadmin, start_nsqd, start_nsqlookupd


def post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST")) as r:
        r.read()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def count(log: str, needle: str) -> int:
    return sum(1 for line in log.splitlines() if needle in line)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runfor", default="60s")
    parser.add_argument("--poll-interval", default="5s")
    parser.add_argument("--nsqd", type=int, default=2)
    parser.add_argument("--topics", type=int, default=20)
    args = parser.parse_args(go_style_args(argv))
    runfor = parse_duration(args.runfor)
    with tempfile.TemporaryDirectory() as work:
        lookupd = start_nsqlookupd()
        nsqds: list[DaemonProcess] = []
        admin: DaemonProcess | None = None
        try:
            for i in range(args.nsqd):
                path = Path(work) / f"nsqd{i}"
                path.mkdir()
                nsqds.append(start_nsqd(path, f"--lookupd-tcp-address={lookupd.tcp}"))
            for nsqd in nsqds:
                for t in range(args.topics):
                    post(f"{nsqd.http_url}/topic/create?topic=bench{t}")
                    for c in ("a", "b"):
                        post(f"{nsqd.http_url}/channel/create?topic=bench{t}&channel={c}")
            admin = start_nsqadmin(
                f"--lookupd-http-address={lookupd.http}", f"--poll-interval={args.poll_interval}"
            )
            with urllib.request.urlopen(f"{nsqds[0].http_url}/stats?format=json") as r:
                stats_bytes = len(r.read())
            before_cpu = cpu_seconds(admin.pid)
            before = [count(n.log, "GET /stats") for n in nsqds]
            before_lookupd = count(lookupd.log, "GET /")
            started = time.monotonic()
            time.sleep(runfor)
            elapsed = time.monotonic() - started
            cpu = cpu_seconds(admin.pid) - before_cpu
            stats = [count(n.log, "GET /stats") - b for n, b in zip(nsqds, before, strict=True)]
            lookupd_requests = count(lookupd.log, "GET /") - before_lookupd
            with urllib.request.urlopen(f"{admin.http_url}/api/overview") as r:
                overview = json.loads(r.read())
        finally:
            if admin is not None:
                admin.stop()
            for nsqd in nsqds:
                nsqd.stop()
            lookupd.stop()
    print(
        f"nsqadmin poller: --poll-interval={args.poll_interval}, {args.nsqd} nsqd, "
        f"{args.topics} topics x 2 channels, {elapsed:.1f}s"
    )
    for i, n in enumerate(stats):
        print(f"  nsqd{i}: {n} /stats requests = {n / elapsed:.3f} req/s ({stats_bytes} B each)")
    print(f"  nsqlookupd: {lookupd_requests} requests = {lookupd_requests / elapsed:.3f} req/s")
    print(f"  nsqadmin CPU: {cpu:.2f}s = {100 * cpu / elapsed:.2f}% of one core")
    print(f"  overview: {len(overview['topics'])} topics, {overview['nodes']['reachable']} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
