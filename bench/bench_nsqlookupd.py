"""nsqlookupd load: how fast nsqds can register, and how fast consumers can look topics up.

    python bench/bench_nsqlookupd.py --peers 50 --topics 100 --channels 2 --runfor 5s

Starts its own ``python -m nsqpy.nsqlookupd`` on free loopback ports (or uses ``--lookupd
host:tcp_port,host:http_port``), then:

1. ``--peers`` connections IDENTIFY and pipeline REGISTER for ``--topics`` x ``--channels``;
2. ``--concurrency`` HTTP clients GET ``/lookup?topic=`` for ``--runfor`` (bounded by
   ``--max-requests``);
3. a few ``/nodes`` and ``/debug`` requests (each lists every peer and topic).

Prints one line per phase with totals, rates and latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import struct
import sys
import time

import aiohttp

from nsqpy.internal.durations import parse_duration
from nsqpy.protocol import lookup as L
from nsqpy.testing import start_nsqlookupd


async def register_peer(
    host: str, port: int, index: int, topics: int, channels: int
) -> tuple[asyncio.StreamWriter, int]:
    reader, writer = await asyncio.open_connection(host, port)
    identity = {
        "broadcast_address": f"10.0.{index // 250}.{index % 250}",
        "hostname": f"nsqd{index}",
        "http_port": 4151,
        "tcp_port": 4150,
        "version": "1.3.0",
    }
    lines = [L.register(f"topic{t}", f"ch{c}") for t in range(topics) for c in range(channels)]
    if channels == 0:
        lines = [L.register(f"topic{t}") for t in range(topics)]
    writer.write(b"  V1" + L.identify(identity) + b"".join(lines))
    await writer.drain()
    for _ in range(len(lines) + 1):
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        reply = await reader.readexactly(size)
        if reply.startswith(b"E_"):
            raise RuntimeError(reply.decode())
    return writer, len(lines)


async def lookup_client(
    session: aiohttp.ClientSession,
    url: str,
    topics: int,
    stop_at: float,
    budget: list[int],
    latencies: list[float],
) -> None:
    rng = random.Random()
    while time.monotonic() < stop_at and budget[0] > 0:
        budget[0] -= 1
        started = time.perf_counter()
        async with session.get(url, params={"topic": f"topic{rng.randrange(topics)}"}) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"/lookup answered {resp.status}")
        latencies.append(time.perf_counter() - started)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] if ordered else 0.0


async def run(args: argparse.Namespace, tcp: tuple[str, int], http_url: str) -> None:
    started = time.perf_counter()
    peers = await asyncio.gather(
        *(register_peer(*tcp, i, args.topics, args.channels) for i in range(args.peers))
    )
    elapsed = time.perf_counter() - started
    registers = sum(count for _, count in peers)
    print(
        f"[register] peers: {args.peers} - registrations: {registers} - {elapsed:.3f}s - "
        f"{registers / elapsed:.0f} REGISTER/s",
        flush=True,
    )

    latencies: list[float] = []
    budget = [args.max_requests]
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        stop_at = time.monotonic() + args.runfor
        await asyncio.gather(
            *(
                lookup_client(
                    session, f"{http_url}/lookup", args.topics, stop_at, budget, latencies
                )
                for _ in range(args.concurrency)
            )
        )
        elapsed = time.perf_counter() - started
        print(
            f"[lookup] requests: {len(latencies)} - {elapsed:.3f}s - "
            f"{len(latencies) / elapsed:.0f} req/s - p50 {percentile(latencies, 0.5) * 1e3:.2f}ms"
            f" - p99 {percentile(latencies, 0.99) * 1e3:.2f}ms (concurrency {args.concurrency})",
            flush=True,
        )
        for path in ("/nodes", "/debug", "/topics"):
            timings = []
            size = 0
            for _ in range(5):
                t0 = time.perf_counter()
                async with session.get(f"{http_url}{path}") as resp:
                    body = await resp.read()
                timings.append(time.perf_counter() - t0)
                size = len(body)
            json.loads(body)
            print(f"[{path[1:]}] {size} bytes - best {min(timings) * 1e3:.2f}ms of 5", flush=True)
    for writer, _ in peers:
        writer.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", type=int, default=50)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--runfor", default="5s")
    parser.add_argument("--max-requests", type=int, default=200_000)
    parser.add_argument("--lookupd", default="", help="tcp_host:port,http_host:port to use")
    args = parser.parse_args(argv)
    args.runfor = parse_duration(args.runfor)
    if args.lookupd:
        tcp_text, http_text = args.lookupd.split(",")
        host, port = tcp_text.rsplit(":", 1)
        asyncio.run(run(args, (host, int(port)), f"http://{http_text}"))
        return 0
    with start_nsqlookupd() as proc:  # INFO: the listening lines tell us the ports
        asyncio.run(run(args, proc.tcp_address, proc.http_url))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
