"""Throughput of ``nsq_to_file``: N messages waiting in nsqd, msgs/s until all are archived.

::

    .venv/bin/python bench/bench_nsq_to_file.py --messages 100000 --size 100

Starts one nsqpy nsqd (in-memory queue large enough for every message), creates one channel
per run, pre-publishes N unique messages (MPUB batches of 500) so that every channel holds all
of them, then runs our ``nsq_to_file`` on one channel at a time, plain and ``--gzip``, timing
from the process start until nsqd shows the channel empty with nothing in flight (every
message written, fsynced and FINished). When Go's ``nsq_to_file`` is in ``--go-bin`` it runs
on its own channels of the same nsqd with the same input. Each run checks that its files hold
all N messages.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from nsqpy.testing import DaemonProcess, start_nsqd

TOPIC = "bench_archive"


def post(nsqd: DaemonProcess, path: str, body: bytes = b"", **params: str) -> None:
    url = f"{nsqd.http_url}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=60) as resp:
        resp.read()


def channel(nsqd: DaemonProcess, name: str) -> dict[str, int]:
    url = f"{nsqd.http_url}/stats?format=json&topic={TOPIC}&channel={name}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        for topic in json.loads(resp.read())["topics"]:
            for found in topic["channels"]:
                if found["channel_name"] == name:
                    return dict(found)
    raise SystemExit(f"channel {name} is gone")


def archived_lines(directory: Path) -> int:
    total = 0
    for path in directory.rglob("*"):
        data = path.read_bytes()
        total += (gzip.decompress(data) if path.name.endswith(".gz") else data).count(b"\n")
    return total


def run_once(
    command: list[str],
    nsqd: DaemonProcess,
    name: str,
    out: Path,
    gzip_on: bool,
    count: int,
    extra: list[str],
) -> float:
    host, port = nsqd.tcp_address
    args = [
        *command,
        f"--topic={TOPIC}",
        f"--channel={name}",
        f"--nsqd-tcp-address={host}:{port}",
        f"--output-dir={out}",
        "--sync-interval=100ms",  # the last (< 170) messages wait for this tick
        *(["--gzip"] if gzip_on else []),
        *extra,
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            stats = channel(nsqd, name)
            if stats["depth"] == 0 and stats["in_flight_count"] == 0:
                break
            if proc.poll() is not None:
                raise SystemExit(f"{command[0]} exited with {proc.returncode}")
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
    finally:
        proc.terminate()
        proc.wait(60)
    lines = archived_lines(out)
    if lines < count:
        raise SystemExit(f"{command[0]} archived {lines} of {count} messages")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100, help="bytes per message")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--go-bin", default=os.environ.get("GO_NSQ_BIN", "build/go-nsq"))
    parser.add_argument(
        "--arg",
        action="append",
        default=[],
        help="an extra flag for every archiver (--arg=--consumer-opt=output_buffer_timeout,5ms)",
    )
    args = parser.parse_args()

    tools = {"nsqpy": [str(Path(sys.executable).parent / "nsq_to_file")]}
    go_tool = Path(args.go_bin) / "nsq_to_file"
    if go_tool.exists():
        tools["go"] = [str(go_tool)]
    runs = [
        (tool, mode, run)
        for run in range(args.runs)
        for tool in tools
        for mode in ("plain", "gzip")
    ]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "nsqd"
        data.mkdir()
        queue = str(args.messages + 1000)
        with start_nsqd(data, f"--mem-queue-size={queue}") as nsqd:
            post(nsqd, "/topic/create", topic=TOPIC)
            for tool, mode, run in runs:
                post(nsqd, "/channel/create", topic=TOPIC, channel=f"{tool}_{mode}_{run}")
            pad = b"x" * max(0, args.size - 12)
            for start in range(0, args.messages, 500):
                end = min(start + 500, args.messages)
                batch = b"\n".join(b"%010d" % i + b"-" + pad for i in range(start, end))
                post(nsqd, "/mpub", batch, topic=TOPIC)
            print(f"{args.messages} messages of {args.size} B waiting in nsqd")
            for tool, mode, run in runs:
                name = f"{tool}_{mode}_{run}"
                out = Path(tmp) / name
                gz = mode == "gzip"
                elapsed = run_once(tools[tool], nsqd, name, out, gz, args.messages, args.arg)
                rate = args.messages / elapsed
                print(f"{tool:6s} {mode:6s} run {run}: {elapsed:6.2f} s  {rate:9,.0f} msgs/s")


if __name__ == "__main__":
    main()
