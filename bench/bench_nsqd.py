"""Go's bench.sh for nsqpy: a fresh nsqd, bench_writer, then bench_reader, then peak RSS.

    python bench/bench_nsqd.py --runfor 10s --size 200 --batch-size 200 --mem-queue-size 1000000

Prints the PUB and SUB lines of bench_writer and bench_reader and nsqd's peak resident memory
(VmHWM). ``--nsqd-args`` passes extra flags (e.g. ``--nsqd-args=--mem-queue-size=0``).

Side by side with Go nsqd, Go's own bench tools as the load (the figures to compare;
``$GO_NSQ_BIN`` holds Go's nsqd, bench_writer and bench_reader, e.g. from ``make go-nsq``):

    python bench/bench_nsqd.py --go-bench-dir $GO_NSQ_BIN --runfor 8s --trials 3

Each trial starts a fresh Go nsqd and a fresh nsqpy nsqd in turn (alternating which goes
first), pre-creates the topic and channel over HTTP, runs Go's ``bench_writer`` then Go's
``bench_reader`` against it, and records msgs/s, nsqd CPU per message and peak RSS; the table
gives every trial and the ratio of the medians. ``--loop asyncio`` runs our nsqd on asyncio's
own loop instead of uvloop.

``--channels N`` pre-creates N channels (fan-out); the reader reads channel ``ch``, or with
``--readers all`` one ``bench_reader`` per channel runs at once (``GOMAXPROCS=1`` each) and SUB
is the sum of their rates: messages delivered across all channels per second.

``--connections N`` runs Go's ``bench_reader`` with ``GOMAXPROCS=N``: it opens one consumer
connection per GOMAXPROCS (Go 1.19's runtime takes any positive value), so N connections share
the channel. Without ``--rdy`` each gets RDY ``max(5, 2500 // N)``: the total in flight stays
near 2500, and 5 is the least RDY with which bench_reader ever flushes its FINs (it flushes when
``count % rdy > 0.75 * rdy``). Without ``--connections`` bench_reader opens one per core.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from nsqpy.testing import start_nsqd

BENCH = Path(__file__).resolve().parent
_OPS = re.compile(r"([0-9.]+)ops/s")
#: Runs our nsqd without installing uvloop's policy: asyncio's own loop.
_ASYNCIO_NSQD = (
    "import sys; from nsqpy.nsqd import __main__ as m; "
    "m.install_event_loop_policy = lambda: None; sys.exit(m.main())"
)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_tool(tool: str, args: list[str]) -> None:
    subprocess.run([sys.executable, str(BENCH / tool), *args], check=True, timeout=600)


# ---------------------------------------------------------------------- side by side with Go


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free loopback port, never one handed out before in this process: bind(0) may give a
    port again once its socket is closed, and two servers of one group must not share one."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


@dataclass
class Server:
    """One nsqd process (Go's or ours) on fixed loopback ports."""

    kind: str
    command: list[str]
    data: str
    tcp: int = field(default_factory=free_port)
    http: int = field(default_factory=free_port)
    env: dict[str, str] | None = None  # e.g. PYTHONPATH for an older nsqpy's src
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        flags = [
            f"--tcp-address=127.0.0.1:{self.tcp}",
            f"--http-address=127.0.0.1:{self.http}",
            f"--data-path={self.data}",
            "--broadcast-address=127.0.0.1",
        ]
        self.proc = subprocess.Popen(
            [*self.command, *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.post("/ping")
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.kind} nsqd did not start")

    def post(self, path: str) -> bytes:
        request = urllib.request.Request(f"http://127.0.0.1:{self.http}{path}", method="POST")
        if path == "/ping" or path.startswith("/stats"):
            request.method = "GET"
        with urllib.request.urlopen(request, timeout=5) as response:
            data: bytes = response.read()
            return data

    def channel_depth(self, topic: str, channel: str) -> int:
        stats = json.loads(self.post(f"/stats?format=json&topic={topic}&channel={channel}"))
        stats = stats.get("data", stats)  # Go wraps it for V1 clients only
        for entry in stats.get("topics") or []:
            for chan in entry.get("channels") or []:
                if chan["channel_name"] == channel:
                    return int(chan["depth"])
        return 0

    def longest_pause_ms(self) -> float:
        """``gc_pause_usec_100`` of /stats (0 where an nsqd reports none)."""
        stats = json.loads(self.post("/stats?format=json&include_clients=false&topic=-"))
        memory = stats.get("data", stats).get("memory") or {}
        return int(memory.get("gc_pause_usec_100", 0)) / 1000

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


@dataclass
class Trial:
    pub: float
    sub: float
    pub_cpu_us: float
    sub_cpu_us: float
    rss: float
    drained: bool  # the reader emptied the channel: SUB is a lower bound
    #: the longest collector pause /stats reports (Go's GC, our cycle collector), 0 if none
    pause_ms: float = 0.0


@dataclass
class Load:
    """What bench_writer and then bench_reader do to one nsqd (Go's bench.sh settings)."""

    bench_dir: str | None  # Go's bench_writer/bench_reader; None: ours (bench/bench_*.py)
    runfor: str = "10s"  # the reader's duration
    writer_runfor: str = "10s"
    size: int = 200
    batch_size: int = 200
    rdy: int = 2500
    topic: str = "sub_bench"
    channels: int = 1
    readers: str = "one"  # "one": channel ch only; "all": one reader per channel at once
    connections: int | None = None  # the single reader's GOMAXPROCS

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Load:
        return cls(
            args.go_bench_dir,
            args.runfor,
            args.writer_runfor,
            args.size,
            args.batch_size,
            args.rdy,
            args.topic,
            args.channels,
            args.readers,
            args.connections,
        )


def tool_command(bench_dir: str | None, name: str) -> list[str]:
    """Go's bench tool ``name`` from ``bench_dir``, or without one our Python twin of it."""
    if bench_dir is None:
        return [sys.executable, str(BENCH / f"{name}.py")]
    return [str(Path(bench_dir) / name)]


def go_tool(bench_dir: str | None, name: str, args: list[str], procs: int | None = None) -> float:
    """Run one of the bench tools (with ``GOMAXPROCS=procs`` if given); its ops/s figure."""
    env = dict(os.environ)
    if procs is not None:
        env["GOMAXPROCS"] = str(procs)
    done = subprocess.run(
        [*tool_command(bench_dir, name), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    output = done.stdout + done.stderr
    match = _OPS.search(output)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"{name} failed:\n{output}")
    return float(match.group(1))


def channel_names(count: int) -> list[str]:
    """The bench's channels: the single reader reads "ch"; the others are ch1, ch2, ..."""
    return ["ch" if index == 0 else f"ch{index}" for index in range(count)]


def read_channels(bench_dir: str | None, reader: list[str], names: list[str]) -> float:
    """``--readers all``: one bench_reader (GOMAXPROCS=1: one connection) per channel, all at
    once; the sum of their rates is the messages delivered across all channels per second."""
    env = dict(os.environ, GOMAXPROCS="1")
    procs = [
        subprocess.Popen(
            [*tool_command(bench_dir, "bench_reader"), *reader, f"--channel={name}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for name in names
    ]
    total = 0.0
    for proc in procs:
        output, _ = proc.communicate(timeout=600)
        match = _OPS.search(output)
        if proc.returncode != 0 or match is None:
            raise RuntimeError(f"bench_reader failed:\n{output}")
        total += float(match.group(1))
    return total


def create_channels(server: Server, topic: str, count: int) -> list[str]:
    """The topic and its ``count`` bench channels created over HTTP; the channels' names."""
    server.post(f"/topic/create?topic={topic}")
    names = channel_names(count)
    for name in names:
        server.post(f"/channel/create?topic={topic}&channel={name}")
    return names


def go_trial(server: Server, load: Load) -> Trial:
    """One fresh nsqd: topic and channels created, the writer, then the reader(s)."""
    server.start()
    try:
        names = create_channels(server, load.topic, load.channels)
        shared = [f"--nsqd-tcp-address=127.0.0.1:{server.tcp}", f"--size={load.size}"]
        shared.append(f"--topic={load.topic}")
        writer = [*shared, f"--runfor={load.writer_runfor}", f"--batch-size={load.batch_size}"]
        reader = [*shared, f"--runfor={load.runfor}", f"--rdy={load.rdy}"]
        before = cpu_seconds(server.pid)
        pub = go_tool(load.bench_dir, "bench_writer", writer)
        middle = cpu_seconds(server.pid)
        if load.readers == "all":
            sub = read_channels(load.bench_dir, reader, names)
        else:
            reader.append("--channel=ch")
            sub = go_tool(load.bench_dir, "bench_reader", reader, load.connections)
        after = cpu_seconds(server.pid)
        read = names if load.readers == "all" else ["ch"]
        drained = any(server.channel_depth(load.topic, name) == 0 for name in read)
        rss = peak_rss_mb(server.pid)
        pause_ms = server.longest_pause_ms()
    finally:
        server.stop()
    return Trial(
        pub,
        sub,
        (middle - before) * 1e6 / (pub * parse_seconds(load.writer_runfor)),
        (after - middle) * 1e6 / (sub * parse_seconds(load.runfor)),
        rss,
        drained,
        pause_ms,
    )


def parse_seconds(text: str) -> float:
    from nsqpy.internal.durations import parse_duration

    return parse_duration(text)


def side_by_side(args: argparse.Namespace) -> int:
    flags = [f"--mem-queue-size={args.mem_queue_size}", *shlex.split(args.nsqd_args)]
    ours = [sys.executable, "-m", "nsqpy.nsqd"]
    if args.loop == "asyncio":
        ours = [sys.executable, "-c", _ASYNCIO_NSQD]
    commands = {"go": [args.go_nsqd, *flags], "nsqpy": [*ours, *flags]}
    results: dict[str, list[Trial]] = {"go": [], "nsqpy": []}
    for trial in range(args.trials):
        order = ["go", "nsqpy"] if trial % 2 == 0 else ["nsqpy", "go"]
        for kind in order:
            with tempfile.TemporaryDirectory() as data:
                result = go_trial(Server(kind, commands[kind], data), Load.from_args(args))
            results[kind].append(result)
            load = os.getloadavg()[0]
            print(
                f"trial {trial + 1} {kind:5}: PUB {result.pub:10,.0f}/s "
                f"({result.pub_cpu_us:.2f} us cpu/msg)  SUB {result.sub:10,.0f}/s "
                f"({result.sub_cpu_us:.2f} us cpu/msg){' DRAINED' if result.drained else ''}"
                f"  peak RSS {result.rss:7.1f} MiB  "
                f"load {load:.1f}",
                file=sys.stderr,
                flush=True,
            )
    print_table(results, args)
    return 0


def print_table(results: dict[str, list[Trial]], args: argparse.Namespace) -> None:
    go, ours = results["go"], results["nsqpy"]

    def row(name: str, pick: str, fmt: str, better_low: bool = False) -> str:
        gv = [getattr(t, pick) for t in go]
        ov = [getattr(t, pick) for t in ours]
        ratio = statistics.median(ov) / statistics.median(gv)
        note = " (lower is better)" if better_low else ""
        return (
            f"| {name} | {' / '.join(format(v, fmt) for v in gv)} | "
            f"{' / '.join(format(v, fmt) for v in ov)} | **{ratio:.2f}x**{note} |"
        )

    print(
        f"\nGo's bench_writer/bench_reader, {args.size} B, MPUB {args.batch_size}, "
        f"RDY {args.rdy}, {args.trials} x {args.runfor}, {args.channels} channel(s) "
        f"(SUB read from {'every channel' if args.readers == 'all' else 'channel ch'}), "
        f"--mem-queue-size={args.mem_queue_size}, nsqpy on {args.loop}, "
        f"{args.connections or 'one per core'} consumer connection(s)"
    )
    print("| | Go nsqd 1.3 | nsqpy nsqd | ratio (medians) |")
    print("|---|---|---|---|")
    if any(t.drained for t in go + ours):
        print("(a SUB run that emptied the channel is a lower bound: raise --writer-runfor)")
    print(row("PUB msgs/s", "pub", ",.0f"))
    print(row("SUB msgs/s", "sub", ",.0f"))
    print(row("nsqd CPU µs/msg, PUB", "pub_cpu_us", ".2f", True))
    print(row("nsqd CPU µs/msg, SUB", "sub_cpu_us", ".2f", True))
    print(row("peak RSS MiB", "rss", ".0f", True))


# ---------------------------------------------------------------------- our own tools


def own_tools(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as data:
        flags = [f"--mem-queue-size={args.mem_queue_size}", *shlex.split(args.nsqd_args)]
        nsqd = start_nsqd(data, *flags)
        try:
            address = "{}:{}".format(*nsqd.tcp_address)
            common = ["--runfor", args.runfor, "--nsqd-tcp-address", address]
            common += ["--size", str(args.size)]
            print(f"nsqd pid {nsqd.pid} flags {' '.join(flags)}", file=sys.stderr, flush=True)
            run_tool("bench_writer.py", [*common, "--batch-size", str(args.batch_size)])
            if not args.skip_reader:
                run_tool("bench_reader.py", [*common, "--rdy", str(args.rdy)])
            print(f"nsqd peak RSS: {peak_rss_mb(nsqd.pid):.1f} MiB", file=sys.stderr, flush=True)
        finally:
            nsqd.stop()
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runfor", default="10s")
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument(
        "--rdy", type=int, help="RDY per connection (default 2500, or max(5, 2500 // N))"
    )
    parser.add_argument("--mem-queue-size", type=int, default=1000000)
    parser.add_argument("--nsqd-args", default="")
    parser.add_argument("--skip-reader", action="store_true")
    parser.add_argument("--go-bench-dir", help="directory with Go's bench_writer/bench_reader")
    parser.add_argument("--go-nsqd", help="Go's nsqd binary, to compare side by side")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--writer-runfor",
        default="",
        help="bench_writer's duration (default --runfor); longer leaves the reader a backlog",
    )
    parser.add_argument("--topic", default="sub_bench")
    parser.add_argument("--channels", type=int, default=1, help="channels pre-created (fan-out)")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument(
        "--readers",
        choices=["one", "all"],
        default="one",
        help="bench_reader on channel ch only, or one per channel at once (SUB = their sum)",
    )
    parser.add_argument(
        "--connections",
        type=int,
        help="consumer connections of Go's bench_reader (its GOMAXPROCS; default one per core)",
    )
    args = parser.parse_args(argv)
    if args.connections is not None and args.connections < 1:
        parser.error("--connections must be at least 1")
    if args.rdy is None:
        args.rdy = 2500 if args.connections is None else max(5, 2500 // args.connections)
    if args.go_bench_dir:
        args.writer_runfor = args.writer_runfor or args.runfor
        if not args.go_nsqd:
            args.go_nsqd = str(Path(args.go_bench_dir) / "nsqd")
        return side_by_side(args)
    return own_tools(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
