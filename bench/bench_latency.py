"""Publish-to-deliver latency at fixed rates, nsqpy nsqd beside Go nsqd.

    python bench/bench_latency.py --go-nsqd "$GO_NSQ_BIN/nsqd" --rates 10000,100000 \
        --runfor 5s

For each rate and each server (a fresh nsqd each time, Go's and ours alternating), one producer
process sends PUBs paced in 1 ms ticks (each body carries the send time), and one consumer
process (SUB, RDY 2500, a FIN per message) records receive time minus send time. The first
0.5 s is warm-up. Prints p50 / p99 / max per run and a table. ``--channels N`` gives the topic
N channels (fan-out); the consumer reads one, the others fill up in memory. Both processes are
raw sockets in Python, the same for both servers; their own overhead is part of every figure.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from typing import Any

from bench_nsqd import Server, parse_seconds
from nsqpy.protocol import commands

_HEADER = struct.Struct(">ii")
_STAMP = struct.Struct(">q")
WARMUP = 0.5


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2")
    return sock


def producer(port: int, topic: str, rate: int, runfor: float, size: int, start: Any) -> None:
    sock = _connect(port)
    stop = threading.Event()

    def drain() -> None:  # OK responses: read and dropped
        sock.settimeout(0.5)
        while not stop.is_set():
            try:
                if not sock.recv(1 << 16):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    pad = b"p" * max(0, size - _STAMP.size)
    prefix = f"PUB {topic}\n".encode() + struct.pack(">i", _STAMP.size + len(pad))
    start.wait()
    began = time.perf_counter()
    sent = 0
    while True:
        now = time.perf_counter()
        elapsed = now - began
        if elapsed >= runfor:
            break
        due = int(elapsed * rate) - sent
        if due > 0:
            command = prefix + _STAMP.pack(time.time_ns()) + pad
            sock.sendall(command * due)
            sent += due
        time.sleep(0.001)
    stop.set()
    reader.join(2)
    sock.close()


def consumer(
    port: int, topic: str, runfor: float, rdy: int, ready: Any, start: Any, results: Any
) -> None:
    sock = _connect(port)
    sock.sendall(commands.sub(topic, "ch") + commands.rdy(rdy))
    ready.set()
    start.wait()
    sock.settimeout(0.5)
    buf = bytearray()
    latencies: list[int] = []
    began = time.perf_counter()
    deadline = began + runfor + 1.0  # the last messages are still on their way
    warm = time.time_ns() + int(WARMUP * 1e9)
    while time.perf_counter() < deadline:
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError:
            continue
        if not chunk:
            break
        now = time.time_ns()
        buf += chunk
        pos = 0
        end = len(buf)
        fins = []
        while end - pos >= 8:
            frame_size, frame_type = _HEADER.unpack_from(buf, pos)
            stop = pos + 4 + frame_size
            if stop > end:
                break
            if frame_type == 2:
                (sent_ns,) = _STAMP.unpack_from(buf, pos + 34)
                if sent_ns >= warm:
                    latencies.append(now - sent_ns)
                fins.append(b"FIN " + bytes(buf[pos + 18 : pos + 34]) + b"\n")
            elif frame_type == 0 and buf[pos + 8 : stop] == b"_heartbeat_":
                fins.append(b"NOP\n")
            pos = stop
        del buf[:pos]
        if fins:
            sock.sendall(b"".join(fins))
    results.put(latencies)
    sock.close()


def run_once(server: Server, rate: int, args: argparse.Namespace) -> dict[str, float]:
    server.start()
    try:
        topic = "latency"
        server.post(f"/topic/create?topic={topic}")
        for index in range(args.channels):  # the consumer reads "ch"; the others fill up
            name = "ch" if index == 0 else f"ch{index}"
            server.post(f"/channel/create?topic={topic}&channel={name}")
        ctx = mp.get_context("fork")
        ready, start, results = ctx.Event(), ctx.Event(), ctx.Queue()
        runfor = parse_seconds(args.runfor)
        cons = ctx.Process(
            target=consumer, args=(server.tcp, topic, runfor, args.rdy, ready, start, results)
        )
        prod = ctx.Process(
            target=producer, args=(server.tcp, topic, rate, runfor, args.size, start)
        )
        cons.start()
        prod.start()
        ready.wait(10)
        time.sleep(0.2)
        start.set()
        latencies: list[int] = results.get(timeout=runfor + 60)
        prod.join(10)
        cons.join(10)
    finally:
        server.stop()
    latencies.sort()
    count = len(latencies)
    if not count:
        return {"count": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}

    def pct(q: float) -> float:
        return latencies[min(count - 1, int(q * count))] / 1e6

    return {"count": count, "p50": pct(0.50), "p99": pct(0.99), "max": latencies[-1] / 1e6}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--go-nsqd", default=os.environ.get("GO_NSQ_BIN", "build/go-nsq") + "/nsqd")
    parser.add_argument("--rates", default="10000,100000")
    parser.add_argument("--runfor", default="5s")
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument(
        "--channels", type=int, default=1, help="channels on the topic (fan-out); one is read"
    )
    args = parser.parse_args(argv)
    commands_by_kind = {
        "go": [args.go_nsqd],
        "nsqpy": [sys.executable, "-m", "nsqpy.nsqd"],
    }
    table: dict[tuple[int, str], list[dict[str, float]]] = {}
    for rate in [int(r) for r in args.rates.split(",")]:
        for trial in range(args.trials):
            order = ["go", "nsqpy"] if trial % 2 == 0 else ["nsqpy", "go"]
            for kind in order:
                with tempfile.TemporaryDirectory() as data:
                    result = run_once(Server(kind, commands_by_kind[kind], data), rate, args)
                table.setdefault((rate, kind), []).append(result)
                print(
                    f"rate {rate:>7}/s {kind:5}: {result['count']:8,.0f} msgs  "
                    f"p50 {result['p50']:7.2f} ms  p99 {result['p99']:7.2f} ms  "
                    f"max {result['max']:7.2f} ms  load {os.getloadavg()[0]:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    print(
        f"\nPUB -> delivery latency, {args.size} B, RDY {args.rdy}, {args.channels} channel(s), "
        "one consumer (on channel ch), medians of "
    )
    print(f"{args.trials} runs of {args.runfor} (after {WARMUP} s warm-up)")
    print("| rate | Go p50 | Go p99 | nsqpy p50 | nsqpy p99 |")
    print("|---|---|---|---|---|")
    for rate in sorted({r for r, _ in table}):
        cells = []
        for kind in ("go", "nsqpy"):
            runs = table[(rate, kind)]
            cells.append(f"{statistics.median(r['p50'] for r in runs):.2f} ms")
            cells.append(f"{statistics.median(r['p99'] for r in runs):.2f} ms")
        print(f"| {rate:,} msgs/s | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
