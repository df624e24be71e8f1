"""Throughput of ``to_nsq``: N lines piped in, msgs/s until the process exits.

::

    .venv/bin/python bench/bench_utilities.py --messages 200000 --size 100
    .venv/bin/python bench/bench_utilities.py --messages 200000 --nsqd go   # Go's nsqd receives

Starts one nsqpy nsqd (in-memory queue large enough for every message), writes the input file
once, and runs our ``to_nsq`` with it on stdin; when Go's ``to_nsq`` is in ``--go-bin``
(default ``$GO_NSQ_BIN``, else ``build/go-nsq``, which ``make go-nsq`` builds) it runs it with
the same input against the same nsqd, each into its own topic. Every run checks that nsqd
counted all N messages, and prints the CPU time the tool's own process used (the rest of the
wall time is nsqd, the round trips and the machine's other load).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Protocol

from nsqpy.testing import start_nsqd


class Nsqd(Protocol):
    @property
    def tcp_address(self) -> tuple[str, int]: ...

    @property
    def http_url(self) -> str: ...

    def stop(self, timeout: float = 10.0) -> int | None: ...


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GoNsqd:
    """Go's nsqd binary on free loopback ports (``--nsqd go``)."""

    def __init__(self, binary: Path, data_path: Path, mem_queue_size: int) -> None:
        data_path.mkdir(parents=True, exist_ok=True)
        self.tcp_address = ("127.0.0.1", _free_port())
        http_port = _free_port()
        self.http_url = f"http://127.0.0.1:{http_port}"
        self.proc = subprocess.Popen(
            [
                str(binary),
                f"--tcp-address=127.0.0.1:{self.tcp_address[1]}",
                f"--http-address=127.0.0.1:{http_port}",
                f"--data-path={data_path}",
                f"--mem-queue-size={mem_queue_size}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(f"{self.http_url}/ping", timeout=1).read()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    sys.exit("Go nsqd did not start")
                time.sleep(0.1)

    def stop(self, timeout: float = 10.0) -> int | None:
        self.proc.terminate()
        return self.proc.wait(timeout)


def message_count(nsqd: Nsqd, topic: str) -> int:
    url = f"{nsqd.http_url}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        topics = json.loads(resp.read())["topics"]
    return int(topics[0]["message_count"]) if topics else 0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(
    command: list[str], nsqd: Nsqd, topic: str, input_path: Path, expected: int
) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the tool's process)."""
    host, port = nsqd.tcp_address
    args = [*command, f"--topic={topic}", f"--nsqd-tcp-address={host}:{port}"]
    with open(input_path, "rb") as stdin:
        cpu_before = _children_cpu()
        started = time.perf_counter()
        result = subprocess.run(args, stdin=stdin, capture_output=True, timeout=600)
        elapsed = time.perf_counter() - started
        cpu = _children_cpu() - cpu_before
    if result.returncode != 0:
        sys.exit(f"{command[0]} failed ({result.returncode}): {result.stderr.decode()[-500:]}")
    counted = message_count(nsqd, topic)
    if counted != expected:
        sys.exit(f"{command[0]}: nsqd counted {counted} of {expected} messages")
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="bytes per line, newline excluded")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--go-bin", default=os.environ.get("GO_NSQ_BIN", "build/go-nsq"))
    parser.add_argument(
        "--nsqd", choices=("nsqpy", "go"), default="nsqpy", help="whose nsqd receives"
    )
    args = parser.parse_args()

    ours = [str(Path(sys.executable).parent / "to_nsq")]
    if not Path(ours[0]).exists():
        ours = [sys.executable, "-m", "nsqpy.apps.to_nsq"]
    tools = {"nsqpy to_nsq": ours}
    go_tool = Path(args.go_bin) / "to_nsq"
    if go_tool.exists():
        tools["Go to_nsq"] = [str(go_tool)]

    with tempfile.TemporaryDirectory() as folder:
        input_path = Path(folder) / "input.txt"
        line = b"x" * args.size + b"\n"
        input_path.write_bytes(line * args.messages)
        nsqd: Nsqd
        if args.nsqd == "go":
            nsqd = GoNsqd(Path(args.go_bin) / "nsqd", Path(folder) / "go", args.messages * 2)
        else:
            nsqd = start_nsqd(folder, f"--mem-queue-size={args.messages * 2}")
        try:
            print(f"to_nsq: {args.messages} lines of {args.size} B on stdin, one {args.nsqd} nsqd")
            print(f"load average before: {os.getloadavg()[0]:.2f}")
            for run in range(args.runs):
                for name, command in tools.items():
                    topic = f"bench_{name.split()[0].lower()}_{run}"
                    elapsed, cpu = run_once(command, nsqd, topic, input_path, args.messages)
                    rate = args.messages / elapsed
                    print(
                        f"[{name}] run {run + 1}: {elapsed:.3f}s - {rate:,.0f} msgs/s - "
                        f"tool CPU {cpu:.2f}s"
                    )
            print(f"load average after: {os.getloadavg()[0]:.2f}")
        finally:
            nsqd.stop()


if __name__ == "__main__":
    main()
