"""Shared plumbing of the Spark benchmarks: filling nsqd, counting Parquet rows, load lines."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.parse
import urllib.request
from pathlib import Path

from nsqpy.client import Producer
from nsqpy.pipeline.local import LocalNSQ


def load() -> str:
    """The load average as the figures' companion: the machine is shared with other work."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f} {five:.1f} {fifteen:.1f} ({os.cpu_count()} cores, shared)"


def post(http: str, path: str, **params: str) -> None:
    url = f"http://{http}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10):
        pass


def make_topic(nsq: LocalNSQ, topic: str, *channels: str) -> None:
    for http in nsq.nsqd_http:
        post(http, "/topic/create", topic=topic)
        for channel in channels:
            post(http, "/channel/create", topic=topic, channel=channel)


def channel_depth(nsq: LocalNSQ, topic: str, channel: str) -> int:
    total = 0
    for http in nsq.nsqd_http:
        url = f"http://{http}/stats?format=json&include_clients=false&topic={topic}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            for t in json.loads(resp.read()).get("topics") or ():
                for c in t.get("channels") or ():
                    if c["channel_name"] == channel:
                        total += int(c["depth"])
    return total


def arrived_depth(nsq: LocalNSQ, topic: str, channel: str, expected: int) -> int:
    """The channel's depth once every acknowledged message reached it: nsqd's topic pump
    moves messages to the channels a batch per loop turn, so right after the last OK the
    channel can still be short (one sink trial counted 900,000 of 1,000,000 that way)."""
    depth, last_change = channel_depth(nsq, topic, channel), time.monotonic()
    while depth < expected and time.monotonic() - last_change < 2.0:
        time.sleep(0.05)
        now = channel_depth(nsq, topic, channel)
        if now != depth:
            depth, last_change = now, time.monotonic()
    return depth


def bodies_for(start: int, count: int, size: int) -> list[bytes]:
    """Numbered bodies of ``size`` bytes (>= 10), so a count check can trust the rows."""
    return [b"%010d" % (start + i) + b"x" * (size - 10) for i in range(count)]


async def fill(nsq: LocalNSQ, topic: str, count: int, size: int) -> float:
    """Publish ``count`` bodies split evenly over every nsqd; returns the seconds taken."""
    started = time.perf_counter()
    per_nsqd = count // len(nsq.nsqd_tcp)
    for n, address in enumerate(nsq.nsqd_tcp):
        async with Producer(address) as producer:
            pending = []
            for start in range(0, per_nsqd, 1000):
                bodies = bodies_for(n * per_nsqd + start, min(1000, per_nsqd - start), size)
                pending.append(producer.multi_publish(topic, bodies))
                if len(pending) >= 8:
                    await asyncio.gather(*pending)
                    pending = []
            await asyncio.gather(*pending)
    return time.perf_counter() - started


def parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    files = [f for f in path.rglob("*.parquet") if "_spark_metadata" not in f.parts]
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def rate(count: int, seconds: float, unit: str) -> str:
    per_second = count / seconds if seconds else 0.0
    return f"{per_second:10,.0f} {unit}/s  ({count:,} in {seconds:.2f} s)"


def _process_kind(command: str) -> str:
    if "java" in command.split(" ", 1)[0]:
        return "JVM"
    for kind in ("nsqlookupd", "nsqd", "pyspark"):
        if kind in command:
            return "Python workers" if kind == "pyspark" else kind
    return "other"


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process and everything below it,
    by kind: where a phase's time went on a shared machine (Linux /proc only)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    usage: dict[int, tuple[str, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])
        # utime, stime, and the children's that were waited for (forked workers that ended)
        used = sum(int(f) for f in fields[11:15]) / tick
        usage[pid] = (_process_kind(command), used)
    mine = os.getpid()
    totals: dict[str, float] = {"driver": 0.0}
    for pid, (kind, used) in usage.items():
        ancestor = pid
        while ancestor not in (mine, 0, 1) and ancestor in parents:
            ancestor = parents[ancestor]
        if ancestor != mine:
            continue
        name = "driver" if pid == mine else kind
        totals[name] = totals.get(name, 0.0) + used
    return totals


def cpu_spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds by kind of process between two ``cpu_seconds()`` readings."""
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def format_cpu(spent: dict[str, float]) -> str:
    """CPU seconds by kind, largest first, and the total."""
    parts = [f"{k} {v:.2f}" for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if v > 0.005]
    return f"CPU s: {', '.join(parts)} (total {sum(spent.values()):.2f})"


def cpu_used(before: dict[str, float], after: dict[str, float]) -> str:
    """``after - before`` by kind, largest first, and the total."""
    return format_cpu(cpu_spent(before, after))


def empty_channel(nsq: LocalNSQ, topic: str, channel: str) -> None:
    """Drop a channel's messages on every nsqd (between benchmark trials)."""
    for http in nsq.nsqd_http:
        post(http, "/channel/empty", topic=topic, channel=channel)
