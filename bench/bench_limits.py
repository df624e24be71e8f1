"""nsqd at scale in connections: memory per idle consumer, a reconnect storm, RSS at 10,000.

For each daemon (ours, and Go's nsqd 1.3 when ``--go-nsqd`` is there) this starts a fresh nsqd
with the descriptor limit raised to the hard limit, creates a topic and a channel, then:

1. storm: ``--storm`` consumers connect and SUBscribe all at once (what every consumer of a
   restarted nsqd does), timed from the first connect to the last ``OK``: connections/s;
2. idle: more consumers join until ``--consumers`` are connected, subscribed with RDY 1 and
   idle; nsqd's RSS before and after gives the memory per idle consumer connection.

Bounded: every phase has a deadline (``--timeout``), and the consumers answer heartbeats.

    .venv/bin/python bench/bench_limits.py                       # 10,000 consumers, storm 5,000
    .venv/bin/python bench/bench_limits.py --consumers 2000 --storm 1000 --daemon nsqpy
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from typing import cast

from bench_nsqd import free_port

TOPIC = "limits"
CHANNEL = "idle"
HEARTBEAT = b"_heartbeat_"


def raise_own_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def http_post(port: int, path: str) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    tcp_port: int
    http_port: int

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def start_daemon(name: str, data_path: str, go_nsqd: str) -> Daemon:
    tcp, http = free_port(), free_port()
    flags = [
        f"--tcp-address=127.0.0.1:{tcp}",
        f"--http-address=127.0.0.1:{http}",
        f"--data-path={data_path}",
        "--log-level=warn",
    ]
    command = [go_nsqd, *flags] if name == "go" else [sys.executable, "-m", "nsqpy.nsqd", *flags]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/ping", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError(f"{name} nsqd did not start")
        time.sleep(0.05)
    http_post(http, f"/topic/create?topic={TOPIC}")
    http_post(http, f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
    return Daemon(name, proc, tcp, http)


class Consumer(asyncio.Protocol):
    """A subscribed consumer with RDY 1 that answers heartbeats and otherwise idles."""

    def __init__(self, subscribed: asyncio.Future[None]) -> None:
        self.subscribed = subscribed
        self.transport: asyncio.Transport | None = None
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.write(b"  V2" + f"SUB {TOPIC} {CHANNEL}\n".encode() + b"RDY 1\n")

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 4:
            size = int.from_bytes(self.buffer[:4], "big")
            if len(self.buffer) < 4 + size:
                return
            frame, self.buffer = self.buffer[4 : 4 + size], self.buffer[4 + size :]
            body = frame[4:]
            if body == HEARTBEAT and self.transport is not None:
                self.transport.write(b"NOP\n")
            elif body == b"OK" and not self.subscribed.done():
                self.subscribed.set_result(None)
            elif frame[:4] == b"\x00\x00\x00\x01" and not self.subscribed.done():
                self.subscribed.set_exception(RuntimeError(body.decode(errors="replace")))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.subscribed.done():
            self.subscribed.set_exception(ConnectionError("closed before SUB was answered"))


async def connect_consumers(
    port: int, count: int, deadline: float, transports: list[asyncio.Transport]
) -> tuple[int, int]:
    """Connect ``count`` consumers at once (retrying refused connects until ``deadline``);
    returns how many are subscribed and how many attempts failed and were retried."""
    loop = asyncio.get_running_loop()
    retries = [0]

    async def one() -> bool:
        while time.monotonic() < deadline:
            subscribed: asyncio.Future[None] = loop.create_future()
            consumer = Consumer(subscribed)
            try:
                transport, _ = await loop.create_connection(
                    lambda: consumer,  # noqa: B023 - awaited before the next iteration
                    "127.0.0.1",
                    port,
                )
                await asyncio.wait_for(subscribed, max(0.1, deadline - time.monotonic()))
            except (OSError, RuntimeError, TimeoutError):
                retries[0] += 1
                await asyncio.sleep(0.05)
                continue
            transports.append(transport)
            return True
        return False

    results = await asyncio.gather(*(one() for _ in range(count)))
    return sum(results), retries[0]


async def measure(daemon: Daemon, consumers: int, storm: int, timeout: float) -> None:
    transports: list[asyncio.Transport] = []
    await asyncio.sleep(1.0)
    rss_before = rss_kib(daemon.proc.pid)
    try:
        started = time.monotonic()
        stormed, retried = await connect_consumers(
            daemon.tcp_port, storm, started + timeout, transports
        )
        storm_seconds = time.monotonic() - started
        print(
            f"[{daemon.name}] storm: {stormed}/{storm} consumers connected+subscribed in "
            f"{storm_seconds:.2f}s - {stormed / storm_seconds:.0f} conn/s "
            f"({retried} attempts failed and were retried)",
            flush=True,
        )
        rest = consumers - stormed
        joined, _ = await connect_consumers(
            daemon.tcp_port, rest, time.monotonic() + timeout, transports
        )
        await asyncio.sleep(2.0)  # let nsqd settle (buffers, GC)
        rss_after = rss_kib(daemon.proc.pid)
        total = stormed + joined
        per_conn = (rss_after - rss_before) * 1024 / max(total, 1)
        print(
            f"[{daemon.name}] idle: {total}/{consumers} subscribed consumers - RSS "
            f"{rss_before / 1024:.1f} MiB -> {rss_after / 1024:.1f} MiB - "
            f"{per_conn / 1024:.1f} KiB per idle consumer connection",
            flush=True,
        )
    finally:
        for transport in transports:
            transport.abort()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--consumers", type=int, default=10_000)
    parser.add_argument("--storm", type=int, default=5_000)
    parser.add_argument("--daemon", choices=["nsqpy", "go", "both"], default="both")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per phase")
    parser.add_argument(
        "--go-nsqd",
        default=os.environ.get("GO_NSQ_BIN", "build/go-nsq") + "/nsqd",
        help="Go's nsqd binary (default: $GO_NSQ_BIN/nsqd, else build/go-nsq/nsqd)",
    )
    args = parser.parse_args()
    limit = raise_own_limit()
    if limit < args.consumers + 100:
        parser.error(f"this process may open {limit} descriptors: fewer than --consumers")
    names = ["nsqpy", "go"] if args.daemon == "both" else [args.daemon]
    if "go" in names and not os.path.exists(args.go_nsqd):
        print(f"{args.go_nsqd} not found: Go skipped", file=sys.stderr)
        names.remove("go")
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    for name in names:
        with tempfile.TemporaryDirectory() as data_path:
            daemon = start_daemon(name, data_path, args.go_nsqd)
            try:
                asyncio.run(measure(daemon, args.consumers, args.storm, args.timeout))
            finally:
                daemon.stop()
        print(f"load average after {name}: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
