"""A backlog on a topic with channels, nsqpy nsqd beside Go nsqd.

    python bench/bench_fanout.py rss --channels 10 --messages 1000000 --trials 2
    python bench/bench_fanout.py drain --channels 1 --messages 1000000 --trials 2

``rss``: with ``--mem-queue-size`` = ``--messages`` (everything fits in memory on both), publish
the messages (200 B, MPUB batches of 200, one connection), wait until every channel holds all of
them, then read nsqd's resident memory (VmRSS) and peak (VmHWM).

``drain``: with ``--mem-queue-size=0`` (everything on disk), publish the messages, wait until the
channels hold them, then run Go's ``bench_reader`` (RDY 2500, FIN each) on every channel at once
and time until every message has been delivered (channel depth 0; bench_reader holds back the
FINs of its last partial window, so in-flight never quite empties): the backlog's drain rate
from disk, in messages delivered per second across the channels.

Each trial starts a fresh Go nsqd and a fresh nsqpy nsqd in turn (alternating which goes first).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_nsqd import Server, channel_names

TOPIC = "fanout_bench"


def vm_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def publish(port: int, count: int, size: int, batch: int) -> float:
    """MPUB ``count`` messages of ``size`` bytes; seconds taken."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2")
    body = b"m" * size
    inner = struct.pack(">i", batch) + (struct.pack(">i", size) + body) * batch
    command = f"MPUB {TOPIC}\n".encode() + struct.pack(">i", len(inner)) + inner
    start = time.monotonic()
    for _ in range(count // batch):
        sock.sendall(command)
        response = b""
        while len(response) < 10:
            chunk = sock.recv(10 - len(response))
            if not chunk:
                raise RuntimeError("nsqd closed the connection")
            response += chunk
        if not response.endswith(b"OK"):
            raise RuntimeError(f"MPUB failed: {response!r}")
    sock.close()
    return time.monotonic() - start


def depths(server: Server) -> dict[str, int]:
    stats = json.loads(server.post(f"/stats?format=json&topic={TOPIC}&include_clients=false"))
    stats = stats.get("data", stats)
    out: dict[str, int] = {}
    for topic in stats.get("topics") or []:
        out[""] = int(topic["depth"])
        for channel in topic.get("channels") or []:
            out[channel["channel_name"]] = int(channel["depth"])  # not yet delivered
    return out


def wait_depths(server: Server, names: list[str], want: int, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        now = depths(server)
        if now.get("", 0) == 0 and all(now.get(name) == want for name in names):
            return time.monotonic() - start
        time.sleep(0.05)
    raise RuntimeError(f"{server.kind}: channels did not reach {want}: {depths(server)}")


def rss_trial(server: Server, args: argparse.Namespace) -> dict[str, float]:
    names = channel_names(args.channels)
    server.start()
    try:
        server.post(f"/topic/create?topic={TOPIC}")
        for name in names:
            server.post(f"/channel/create?topic={TOPIC}&channel={name}")
        publish(server.tcp, args.messages, args.size, args.batch_size)
        fan_out = wait_depths(server, names, args.messages, 300)
        time.sleep(1.0)  # let the runtime settle (Go's GC, our freed batches)
        return {
            "rss": vm_kib(server.pid, "VmRSS") / 1024,
            "hwm": vm_kib(server.pid, "VmHWM") / 1024,
            "settle": fan_out,
        }
    finally:
        server.stop()


def drain_trial(server: Server, args: argparse.Namespace) -> dict[str, float]:
    names = channel_names(args.channels)
    server.start()
    try:
        server.post(f"/topic/create?topic={TOPIC}")
        for name in names:
            server.post(f"/channel/create?topic={TOPIC}&channel={name}")
        publish(server.tcp, args.messages, args.size, args.batch_size)
        wait_depths(server, names, args.messages, 300)
        reader = [
            str(Path(args.go_bench_dir) / "bench_reader"),
            f"--nsqd-tcp-address=127.0.0.1:{server.tcp}",
            f"--topic={TOPIC}",
            f"--size={args.size}",
            "--rdy=2500",
            "--runfor=600s",
        ]
        env = dict(os.environ, GOMAXPROCS="1")
        start = time.monotonic()
        procs = [
            subprocess.Popen(
                [*reader, f"--channel={name}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # killed at the end: its own report is cut off
                env=env,
            )
            for name in names
        ]
        try:
            seconds = wait_depths(server, names, 0, 300)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait(10)
        elapsed = time.monotonic() - start
        return {"rate": args.messages * len(names) / elapsed, "seconds": elapsed, "poll": seconds}
    finally:
        server.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["rss", "drain"])
    parser.add_argument("--channels", type=int, default=10)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--go-bench-dir", default=os.environ.get("GO_NSQ_BIN", "build/go-nsq"))
    parser.add_argument("--nsqpy-python", default=sys.executable, help="python running nsqpy")
    args = parser.parse_args(argv)
    queue = args.messages if args.mode == "rss" else 0
    flags = [f"--mem-queue-size={queue}"]
    commands = {
        "go": [str(Path(args.go_bench_dir) / "nsqd"), *flags],
        "nsqpy": [args.nsqpy_python, "-m", "nsqpy.nsqd", *flags],
    }
    trial_fn = rss_trial if args.mode == "rss" else drain_trial
    results: dict[str, list[dict[str, float]]] = {"go": [], "nsqpy": []}
    for trial in range(args.trials):
        for kind in ["go", "nsqpy"] if trial % 2 == 0 else ["nsqpy", "go"]:
            with tempfile.TemporaryDirectory() as data:
                result = trial_fn(Server(kind, commands[kind], data), args)
            results[kind].append(result)
            figures = "  ".join(f"{key} {value:,.1f}" for key, value in result.items())
            print(f"trial {trial + 1} {kind:5}: {figures}  load {os.getloadavg()}", flush=True)
    key = "rss" if args.mode == "rss" else "rate"
    go = statistics.median(r[key] for r in results["go"])
    ours = statistics.median(r[key] for r in results["nsqpy"])
    unit = "MiB RSS" if args.mode == "rss" else "msgs/s drained"
    print(
        f"{args.mode}: {args.messages:,} x {args.size} B on {args.channels} channel(s), "
        f"--mem-queue-size={queue}: Go {go:,.1f} {unit}, nsqpy {ours:,.1f} {unit}, "
        f"ratio {ours / go:.2f}x (medians of {args.trials})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
