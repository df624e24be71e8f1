"""Cost of a Prometheus scrape of nsqd's /metrics next to /stats, and the stall it causes.

Starts a real nsqd, creates ``--topics`` topics with ``--channels`` channels each, then for each
route times ``--scrapes`` GETs (mean per request, response size). With ``--stall`` a separate
process meanwhile publishes one message at a time (PUB, wait for OK) to its own topic and
records every round trip: their p50/p99/max while the scrapes run, next to a phase without
scrapes, show how long a scrape holds nsqd's event loop.

    .venv/bin/python bench/bench_metrics.py --topics 100 --channels 3 --scrapes 20
    .venv/bin/python bench/bench_metrics.py --topics 1 --channels 1000 --scrapes 20 --stall
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import socket
import statistics
import struct
import tempfile
import time
import urllib.parse
from typing import Any

from nsqpy.testing import start_nsqd


def get(address: tuple[str, int], path: str) -> bytes:
    conn = http.client.HTTPConnection(*address, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200, (path, resp.status)
        return body
    finally:
        conn.close()


def post(address: tuple[str, int], path: str, **params: str) -> None:
    conn = http.client.HTTPConnection(*address, timeout=30)
    try:
        conn.request("POST", f"{path}?{urllib.parse.urlencode(params)}")
        conn.getresponse().read()
    finally:
        conn.close()


def publisher(address: tuple[str, int], stop: Any, results: Any) -> None:
    """PUB one 200-byte message at a time; (send time, round trip) for each."""
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2")
    command = b"PUB stall_probe\n" + struct.pack(">I", 200) + b"x" * 200
    samples: list[tuple[float, float]] = []
    while not stop.is_set():
        start = time.monotonic()
        sock.sendall(command)
        response = b""
        while len(response) < 10:  # size, frame type, "OK"
            chunk = sock.recv(10 - len(response))
            assert chunk, "nsqd closed the connection"
            response += chunk
        samples.append((start, time.monotonic() - start))
        time.sleep(0.001)  # about 1,000 probes a second
    sock.close()
    results.put(samples)


def percentiles(rtts: list[float]) -> str:
    if not rtts:
        return "no samples"
    rtts = sorted(rtts)
    p99 = rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))]
    return (
        f"PUB round trip p50 {statistics.median(rtts) * 1000:6.2f} ms  "
        f"p99 {p99 * 1000:6.2f} ms  max {rtts[-1] * 1000:6.2f} ms  ({len(rtts)} PUBs)"
    )


def scrape_routes(args: argparse.Namespace, address: tuple[str, int]) -> dict[str, tuple]:
    windows: dict[str, tuple[float, float]] = {}
    for path in ("/metrics", "/stats?format=json", "/stats"):
        get(address, path)  # warm up
        start = time.perf_counter()
        began = time.monotonic()
        for _ in range(args.scrapes):
            size = len(get(address, path))
        windows[path] = (began, time.monotonic())
        mean = (time.perf_counter() - start) / args.scrapes
        print(
            f"{path:<20} {args.topics} topics x {args.channels} channels: "
            f"{mean * 1000:8.2f} ms/request  {size:>9,} bytes  load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    return windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--stall", action="store_true", help="measure PUB round trips meanwhile")
    parser.add_argument("--nsqd-args", default="", help="extra nsqd flags, space separated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data, start_nsqd(data, *args.nsqd_args.split()) as nsqd:
        address = nsqd.http_address
        for t in range(args.topics):
            for c in range(args.channels):
                if c == 0:
                    post(address, "/topic/create", topic=f"t{t}")
                post(address, "/channel/create", topic=f"t{t}", channel=f"c{c}")
        if not args.stall:
            scrape_routes(args, address)
            return
        ctx = mp.get_context("fork")
        stop = ctx.Event()
        results: Any = ctx.Queue()
        probe = ctx.Process(target=publisher, args=(nsqd.tcp_address, stop, results))
        probe.start()
        time.sleep(1.0)
        quiet = (time.monotonic(), 0.0)
        time.sleep(2.0)
        quiet = (quiet[0], time.monotonic())
        windows = scrape_routes(args, address)
        stop.set()
        samples: list[tuple[float, float]] = results.get(timeout=30)
        probe.join(10)
        print(
            f"{'no scrape':<20} {percentiles([r for s, r in samples if quiet[0] <= s < quiet[1]])}"
        )
        for path, (began, ended) in windows.items():
            during = [r for s, r in samples if began <= s < ended]
            print(f"{path:<20} {percentiles(during)}")
        print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
