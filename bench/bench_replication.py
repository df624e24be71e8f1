"""The cost of replication: PUB, SUB and nsqd CPU of a replicated group beside one plain nsqd.

    python bench/bench_replication.py --go-bin "$GO_NSQ_BIN" --runfor 4s --trials 3
    python bench/bench_replication.py --go-bin "$GO_NSQ_BIN" \
        --nsqd-args="--mem-queue-size=0 --sync-every=1"          # the durable setting

Scenarios, each on a fresh group of nsqpy nsqd on loopback (free ports, ``--node-id`` 1..R,
``--replica-timeout=10s``, every node naming the others as ``--replica-peer``):

- R=1: a single nsqd, no replication (the reference);
- R=2: two nodes, ``--replica-acks=2``;
- R=3: three nodes, ``--replica-acks=2``.

The topic and channel are created on node 0 (group-wide, so on every node), Go's
``bench_writer`` publishes to node 0 for ``--runfor``, then Go's ``bench_reader`` reads node 0
for ``--runfor``: node 0 owns every message, its peers hold copies and drop them on its FINs.
CPU is user + system time summed over every nsqd of the group: PUB's includes the time the
peers take to catch up after the writer stops (the lag every node reports, waited to 0), so a
peer that falls behind is not billed to SUB. While the writer runs, a client of the last
peer sends HTTP /ping one at a time (5 ms apart): its p99 is how long that node's own clients
wait while it takes in the owner's stream. ``--latency-rate`` then measures publish ->
deliver p50/p99 at that fixed rate on another fresh group (bench_latency.py's paced producer
and consumer; 0 skips it). Each PUB's OK waits for its peers' ACK and a connection reads
no further command meanwhile, so one connection's single PUBs run at most one replication
round trip each: a rate the group cannot keep up with is marked ``*`` (a backlog's figures).
``--pipelined N`` then publishes N single PUBs to node 0 with nsqpy's Producer, 200 of them
outstanding at once on its one connection (bench_client.py's pipelined PUB): a replicated OK
waits for the peers, and this shows how far one connection's publishes overlap that wait.
Trials rotate the scenarios' order; the table gives medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_client import bench_pub
from bench_latency import WARMUP, consumer, producer
from bench_nsqd import Server, cpu_seconds, go_tool, parse_seconds

TOPIC = "sub_bench"
CHANNEL = "ch"
LATENCY_TOPIC = "latency"
PIPELINED_TOPIC = "pipelined"
#: single PUBs outstanding at once on the Producer's connection (--pipelined)
PIPELINED_CONCURRENCY = 200
CATCH_UP_LIMIT = 60.0  # seconds the peers get to acknowledge everything after the writer
PING_GAP = 0.005  # seconds between a Pinger's requests


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: int
    acks: int  # 0: no replication flags at all


SCENARIOS = [Scenario("R=1", 1, 0), Scenario("R=2", 2, 2), Scenario("R=3", 3, 2)]


@dataclass
class Trial:
    pub: float
    sub: float
    pub_cpu_us: float
    sub_cpu_us: float
    pub_cpu_by_node: tuple[float, ...]  # PUB's us/msg of each nsqd: node 0 (the owner) first
    catch_up: float  # seconds after the writer until every peer had acknowledged
    drained: bool  # the reader emptied the channel: SUB is a lower bound
    peer_ping_p99: float | None  # ms, a peer's /ping while the writer runs (None: no peer)


@dataclass
class Latency:
    count: int  # delivered after the warm-up, within --runfor + 1 s
    expected: int  # published after the warm-up at --latency-rate
    p50: float
    p99: float

    @property
    def kept_up(self) -> bool:
        """Nearly all delivered: otherwise the figures are a backlog's, not the rate's."""
        return self.count >= 0.9 * self.expected


class Group:
    """R nsqpy nsqd on loopback, each naming the others as --replica-peer."""

    def __init__(self, scenario: Scenario, base: str, extra: list[str]) -> None:
        nsqd = [sys.executable, "-m", "nsqpy.nsqd"]
        self.servers = [
            Server("nsqpy", nsqd, str(Path(base) / f"node{i}")) for i in range(scenario.nodes)
        ]
        for index, server in enumerate(self.servers):
            Path(server.data).mkdir()
            peers = [f"--replica-peer=127.0.0.1:{s.tcp}" for s in self.servers if s is not server]
            replication = []
            if scenario.acks:
                replication = [
                    *peers,
                    f"--replica-acks={scenario.acks}",
                    "--replica-timeout=10s",
                ]
            server.command = [*nsqd, f"--node-id={index + 1}", *replication, *extra]
        self.replicated = bool(scenario.acks)

    @property
    def head(self) -> Server:
        return self.servers[0]

    def start(self) -> None:
        for server in self.servers:
            server.start()
        if self.replicated:
            wait_until(self.connected, 20, "every replication link connected")

    def stop(self) -> None:
        for server in self.servers:
            try:
                server.stop()
            except Exception as error:  # stop the others whatever one of them does
                print(f"stopping nsqd pid {server.proc and server.proc.pid}: {error}")

    def cpu(self) -> float:
        return sum(self.cpu_by_node())

    def cpu_by_node(self) -> list[float]:
        return [cpu_seconds(server.pid) for server in self.servers]

    def peers(self, server: Server) -> list[dict[str, Any]]:
        stats = json.loads(server.post("/stats?format=json"))
        stats = stats.get("data", stats)
        peers: list[dict[str, Any]] = stats["replication"]["peers"]
        return peers

    def connected(self) -> bool:
        return all(p["state"] == "connected" for s in self.servers for p in self.peers(s))

    def caught_up(self) -> bool:
        return all(p["lag"] == 0 for s in self.servers for p in self.peers(s))

    def create(self, topic: str) -> None:
        self.head.post(f"/topic/create?topic={topic}")
        self.head.post(f"/channel/create?topic={topic}&channel={CHANNEL}")


def wait_until(check: Any, limit: float, what: str) -> float:
    """Poll ``check`` until true; the seconds it took. Raises after ``limit`` seconds."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > limit:
            raise RuntimeError(f"not within {limit:.0f} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - began


class Pinger:
    """HTTP /ping on one nsqd, one at a time on a kept-alive connection with PING_GAP between,
    while a load runs: how long a client of that node waits (its event loop's stalls)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.latencies: list[float] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Pinger:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join(10)

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.http, timeout=10)
        try:
            while not self.done.is_set():
                began = time.perf_counter()
                conn.request("GET", "/ping")
                conn.getresponse().read()
                self.latencies.append(time.perf_counter() - began)
                self.done.wait(PING_GAP)
        finally:
            conn.close()

    def p99_ms(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[int(0.99 * (len(ordered) - 1))] * 1000 if ordered else 0.0


def throughput(group: Group, args: argparse.Namespace) -> Trial:
    group.create(TOPIC)
    shared = [f"--nsqd-tcp-address=127.0.0.1:{group.head.tcp}", f"--size={args.size}"]
    shared += [f"--topic={TOPIC}", f"--runfor={args.runfor}"]
    before = group.cpu_by_node()
    # a peer's clients while it takes in the owner's stream (R=1 has no peer: not pinged)
    pinger = Pinger(group.servers[-1]) if group.replicated else None
    with pinger or contextlib.nullcontext():
        pub = go_tool(args.go_bin, "bench_writer", [*shared, f"--batch-size={args.batch_size}"])
    catch_up = 0.0
    if group.replicated:
        catch_up = wait_until(group.caught_up, CATCH_UP_LIMIT, "the peers caught up")
    middle = group.cpu_by_node()
    reader = [*shared, f"--rdy={args.rdy}", f"--channel={CHANNEL}"]
    sub = go_tool(args.go_bin, "bench_reader", reader)
    after = group.cpu()
    seconds = parse_seconds(args.runfor)
    by_node = tuple((m - b) * 1e6 / (pub * seconds) for b, m in zip(before, middle, strict=True))
    return Trial(
        pub,
        sub,
        sum(by_node),
        (after - sum(middle)) * 1e6 / (sub * seconds),
        by_node,
        catch_up,
        group.head.channel_depth(TOPIC, CHANNEL) == 0,
        pinger.p99_ms() if pinger is not None else None,
    )


def latency(group: Group, args: argparse.Namespace) -> Latency:
    """bench_latency.py's paced PUB producer and FINning consumer, against node 0."""
    group.create(LATENCY_TOPIC)
    ctx = mp.get_context("fork")
    ready, start, results = ctx.Event(), ctx.Event(), ctx.Queue()
    runfor = parse_seconds(args.runfor)
    port = group.head.tcp
    procs = [
        ctx.Process(
            target=consumer, args=(port, LATENCY_TOPIC, runfor, args.rdy, ready, start, results)
        ),
        ctx.Process(
            target=producer,
            args=(port, LATENCY_TOPIC, args.latency_rate, runfor, args.size, start),
        ),
    ]
    try:
        for proc in procs:
            proc.start()
        if not ready.wait(10):
            raise RuntimeError("the latency consumer did not subscribe")
        time.sleep(0.2)
        start.set()
        latencies: list[int] = sorted(results.get(timeout=runfor + 60))
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    expected = int(args.latency_rate * max(0.0, runfor - WARMUP))
    if not latencies:
        return Latency(0, expected, 0.0, 0.0)

    def percentile(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] / 1e6

    return Latency(len(latencies), expected, percentile(0.50), percentile(0.99))


def pipelined(group: Group, args: argparse.Namespace) -> float:
    """msgs/s of --pipelined single PUBs from one Producer connection to node 0."""
    group.create(PIPELINED_TOPIC)
    address = f"127.0.0.1:{group.head.tcp}"
    body = b"x" * args.size
    seconds = asyncio.run(
        bench_pub(address, PIPELINED_TOPIC, args.pipelined, body, PIPELINED_CONCURRENCY)
    )
    return args.pipelined / seconds


def on_fresh_group(scenario: Scenario, args: argparse.Namespace, measure: Any) -> Any:
    with tempfile.TemporaryDirectory(prefix="bench-replication-") as base:
        group = Group(scenario, base, shlex.split(args.nsqd_args))
        try:
            group.start()
            return measure(group, args)
        finally:
            group.stop()


def run(args: argparse.Namespace) -> int:
    print(
        f"load average before: {format_load()}  cores {os.cpu_count()}  "
        f"Python {platform.python_version()}  commit {git_commit()}  nsqpy from {nsqpy_source()}",
        flush=True,
    )
    trials: dict[str, list[Trial]] = {s.name: [] for s in SCENARIOS}
    latencies: dict[str, list[Latency]] = {s.name: [] for s in SCENARIOS}
    pipelines: dict[str, list[float]] = {s.name: [] for s in SCENARIOS}
    for trial in range(args.trials):
        shift = trial % len(SCENARIOS)
        for scenario in SCENARIOS[shift:] + SCENARIOS[:shift]:
            result: Trial = on_fresh_group(scenario, args, throughput)
            trials[scenario.name].append(result)
            line = (
                f"trial {trial + 1} {scenario.name}: PUB {result.pub:10,.0f}/s "
                f"({result.pub_cpu_us:.2f} us cpu/msg: {by_node(result)}, peers caught up in "
                f"{result.catch_up:.1f} s)  SUB {result.sub:10,.0f}/s "
                f"({result.sub_cpu_us:.2f} us cpu/msg){' DRAINED' if result.drained else ''}"
            )
            if result.peer_ping_p99 is not None:
                line += f"  peer /ping p99 {result.peer_ping_p99:.2f} ms"
            if args.latency_rate:
                lat: Latency = on_fresh_group(scenario, args, latency)
                latencies[scenario.name].append(lat)
                line += (
                    f"  latency p50 {lat.p50:.2f} ms p99 {lat.p99:.2f} ms "
                    f"({lat.count:,} of {lat.expected:,} delivered)"
                )
            if args.pipelined:
                rate: float = on_fresh_group(scenario, args, pipelined)
                pipelines[scenario.name].append(rate)
                line += f"  pipelined PUB {rate:,.0f}/s"
            print(f"{line}  load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    print_table(trials, latencies, pipelines, args)
    print(f"load average after: {format_load()}", flush=True)
    return 0


def print_table(
    trials: dict[str, list[Trial]],
    latencies: dict[str, list[Latency]],
    pipelines: dict[str, list[float]],
    args: argparse.Namespace,
) -> None:
    def median(name: str, pick: str) -> float:
        return statistics.median(getattr(t, pick) for t in trials[name])

    print(
        f"\nGo's bench_writer/bench_reader against node 0, {args.size} B, MPUB "
        f"{args.batch_size}, RDY {args.rdy}, medians of {args.trials} x {args.runfor}, "
        f"nsqd args: {args.nsqd_args or '(defaults)'}; CPU summed over the group's nsqd"
    )
    heads = ["PUB msgs/s", "SUB msgs/s", "CPU us/msg PUB", "CPU us/msg SUB"]
    picks = ["pub", "sub", "pub_cpu_us", "sub_cpu_us"]
    lat_heads = ["CPU us/msg PUB by node: owner / peers", "peer /ping p99 ms during PUB"]
    lat_heads += [f"p50 ms @{args.latency_rate:,}/s", "p99 ms"] if args.latency_rate else []
    if args.pipelined:
        lat_heads.append("pipelined PUB msgs/s (x R=1)")
    print("| | " + " | ".join(f"{h} (x R=1)" for h in heads) + " | " + " | ".join(lat_heads) + " |")
    print("|---" * (1 + len(heads) + len(lat_heads)) + "|")
    for scenario in SCENARIOS:
        cells = []
        for pick in picks:
            value, base = median(scenario.name, pick), median("R=1", pick)
            fmt = ",.0f" if pick in ("pub", "sub") else ".2f"
            cells.append(f"{value:{fmt}} ({value / base if base else 0:.2f}x)")
        nodes = zip(*(t.pub_cpu_by_node for t in trials[scenario.name]), strict=True)
        cells.append(" / ".join(f"{statistics.median(node):.2f}" for node in nodes))
        pings = [t.peer_ping_p99 for t in trials[scenario.name] if t.peer_ping_p99 is not None]
        cells.append(f"{statistics.median(pings):.2f}" if pings else "-")
        runs = latencies[scenario.name]
        if runs:
            mark = "" if all(r.kept_up for r in runs) else " *"
            cells.append(f"{statistics.median(r.p50 for r in runs):.2f}{mark}")
            cells.append(f"{statistics.median(r.p99 for r in runs):.2f}{mark}")
        if pipelines[scenario.name]:
            value = statistics.median(pipelines[scenario.name])
            base = statistics.median(pipelines["R=1"])
            cells.append(f"{value:,.0f} ({value / base if base else 0:.2f}x)")
        label = scenario.name + (f", acks {scenario.acks}" if scenario.acks else ", no replication")
        print(f"| {label} | " + " | ".join(cells) + " |")
    if any(t.drained for runs in trials.values() for t in runs):
        print("(a SUB run that emptied the channel is a lower bound)")
    if any(not r.kept_up for runs in latencies.values() for r in runs):
        print(
            "(* fewer than 90% of the paced PUBs were delivered within --runfor + 1 s: the "
            "group did not keep up with one connection's PUBs at this rate; try a lower "
            "--latency-rate)"
        )


def by_node(trial: Trial) -> str:
    return " / ".join(f"{cpu:.2f}" for cpu in trial.pub_cpu_by_node)


def format_load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def nsqpy_source() -> str:
    """Where the nsqd under test is imported from (PYTHONPATH may name an older tree)."""
    spec = importlib.util.find_spec("nsqpy")
    origin = spec.origin if spec is not None else None
    return str(Path(origin).parent.parent) if origin else "unknown"


def git_commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() or "unknown"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runfor", default="4s", help="bench_writer's and bench_reader's time")
    parser.add_argument("--trials", type=int, default=3, help="runs of each scenario (median)")
    parser.add_argument("--nsqd-args", default="", help="flags for every nsqd of every group")
    parser.add_argument(
        "--go-bin",
        default=os.environ.get("GO_NSQ_BIN", "build/go-nsq"),
        help="directory with Go's bench_writer and bench_reader (default $GO_NSQ_BIN)",
    )
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument(
        "--pipelined",
        type=int,
        default=0,
        help="single PUBs for the pipelined Producer measurement (0: skip it)",
    )
    parser.add_argument(
        "--latency-rate",
        type=int,
        default=10000,
        help="PUBs/s of the publish -> deliver latency run (0: skip it)",
    )
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    for tool in ("bench_writer", "bench_reader"):
        if not (Path(args.go_bin) / tool).is_file():
            parser.error(f"no {tool} in {args.go_bin} (--go-bin or $GO_NSQ_BIN)")
    return run(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
