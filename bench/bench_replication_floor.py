"""The floor under replicated PUB on this machine: our group beside the least relay that can do it.

    python bench/bench_replication_floor.py --go-bin "$GO_NSQ_BIN" --trials 5
    python bench/bench_replication_floor.py --go-bin "$GO_NSQ_BIN" --before-src /tmp/before/src

Replication's cost goal is PUB at R=3 (``--replica-acks=2``) >= 0.6x of R=1 under Go's
``bench_writer`` (two connections, one MPUB of 200 x 200 B outstanding on each;
bench_replication.py). On one machine every node and the load share its cores, so how far
the ratio can go depends on the machine as much as on nsqd. This benchmark measures that
bound: beside our nsqd at R=1 and R=3 (bench_replication.py's groups, PUB only) it runs the
*floor relay*, the least a replicating server can do, in Python on uvloop as nsqd is:

- it speaks just enough V2 for ``bench_writer`` (IDENTIFY and MPUB, each answered OK);
- its owner spends ``work`` µs of CPU on each MPUB, appends the MPUB's body to a file, and
  with peers sends the body to each (BE32 size, then the bytes), answering OK once one peer
  acknowledged (acks 2). By default ``work`` makes its event loop's thread as busy per MPUB
  as our nsqd's at R=1 in the same trial (our main thread's CPU per MPUB, less the floor
  relay's own without work, measured once first): its R=1 then runs about as fast as ours;
- a peer appends each body to its file and answers 4 bytes. No IDs, no index, no queue, no
  fsync, no takeover state.

So the floor relay's R=3 / R=1 is what a replication path that cost nothing beyond moving
the bytes to two peers and one acknowledgement back would get here, at our R=1's speed: a
ratio our nsqd cannot beat on this machine.

One more run splits our gap between the owner and its peers: our nsqd as the owner, its two
peers *logging peers* that speak our replication protocol but only append each EVENTS frame
to a file and acknowledge it (no decoding, no index, no takeover state; a peer that could
never take over). Its ratio is what our owner allows with peers that cost next to nothing.

``--before-src DIR`` adds our groups at R=1 and R=3 with the nsqpy whose ``src`` is DIR
(``git archive <commit> src``), in the same trials: a change's effect beside the bound.

The table gives PUB msgs/s, the ratio to the same owner's R=1, and CPU µs per message by
process (owner first). Trials rotate the order of the runs after ours at R=1; medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO, cast

from bench_nsqd import Server, cpu_seconds, free_port, go_tool
from bench_replication import CHANNEL, SCENARIOS, TOPIC, Group, format_load, git_commit
from nsqpy.protocol import replica as r1

_SIZE = struct.Struct(">I")
_OK = struct.pack(">II", 6, 0) + b"OK"  # a V2 response frame: size, type 0, "OK"
_ACK = _SIZE.pack(0)
_EVENTS_HEAD = struct.Struct(">QI")


# ---------------------------------------------------------------------------- the floor relay


class _Connection(asyncio.Protocol):
    """A connection's input buffer and its transport; ``magic`` False while a 4-byte magic
    (a client's first bytes) is still to be taken off the input."""

    def __init__(self, magic: bool = True) -> None:
        self.buffer = bytearray()
        self.magic = magic
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def take_magic(self) -> bool:
        """Whether the magic is behind (taken off the buffer now, if it has arrived)."""
        if not self.magic:
            if len(self.buffer) < 4:
                return False
            del self.buffer[:4]
            self.magic = True
        return True


class _Framed(_Connection):
    """BE32-sized frames in, each handed to ``on_frame`` with this protocol."""

    def __init__(self, on_frame: Callable[[_Framed, bytes], None], magic: bool = True) -> None:
        super().__init__(magic)
        self.on_frame = on_frame

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while len(buffer) >= 4:
            (size,) = _SIZE.unpack_from(buffer)
            if len(buffer) < 4 + size:
                return
            frame = bytes(buffer[4 : 4 + size])
            del buffer[: 4 + size]
            self.on_frame(self, frame)


class _V2(_Framed):
    """Just enough of nsqd's V2 for bench_writer: the magic, then commands ``VERB ...\\n``
    with a BE32-sized body (IDENTIFY, MPUB); an MPUB's body goes to ``on_frame``, anything
    else is answered OK."""

    def __init__(self, on_frame: Callable[[_Framed, bytes], None]) -> None:
        super().__init__(on_frame, magic=False)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if not self.take_magic():
            return
        while True:
            newline = buffer.find(b"\n")
            if newline < 0 or len(buffer) < newline + 5:
                return
            (size,) = _SIZE.unpack_from(buffer, newline + 1)
            end = newline + 5 + size
            if len(buffer) < end:
                return
            verb = bytes(buffer[:4])
            body = bytes(buffer[newline + 5 : end])
            del buffer[:end]
            if verb == b"MPUB":
                self.on_frame(self, body)
            else:
                self.write(_OK)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def _owner(port: int, peers: list[int], work: float, log: BinaryIO) -> None:
    loop = asyncio.get_running_loop()
    links: list[asyncio.Transport] = []
    acked = [0] * len(peers)
    waiting: deque[tuple[int, _Framed]] = deque()
    sent = 0

    def acknowledged(index: int) -> Callable[[_Framed, bytes], None]:
        def on_ack(_: _Framed, __: bytes) -> None:
            acked[index] += 1
            done = max(acked)  # acks 2: this node and the fastest peer
            while waiting and waiting[0][0] <= done:
                waiting.popleft()[1].write(_OK)

        return on_ack

    for index, peer in enumerate(peers):
        transport, _ = await loop.create_connection(
            partial(_Framed, acknowledged(index)), "127.0.0.1", peer
        )
        links.append(transport)

    def on_mpub(client: _Framed, body: bytes) -> None:
        nonlocal sent
        if work:
            _spin(work)
        log.write(body)
        if not links:
            client.write(_OK)
            return
        head = _SIZE.pack(len(body))
        for link in links:
            link.writelines((head, body))
        sent += 1
        waiting.append((sent, client))

    await loop.create_server(lambda: _V2(on_mpub), "127.0.0.1", port)


async def _peer(port: int, log: BinaryIO) -> None:
    def on_frame(owner: _Framed, frame: bytes) -> None:
        log.write(frame)
        owner.write(_ACK)

    await asyncio.get_running_loop().create_server(lambda: _Framed(on_frame), "127.0.0.1", port)


class _LoggingPeer(_Connection):
    """A replica peer in name only: the ``  R1`` magic, HELLO answered with a WELCOME that
    stored nothing, each EVENTS frame appended to the log and acknowledged, PING answered."""

    def __init__(self, log: BinaryIO) -> None:
        super().__init__(magic=False)
        self.log = log

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if not self.take_magic():
            return
        pos, end, last = 0, len(buffer), None
        while end - pos >= 5:
            size, kind = r1.FRAME_HEAD.unpack_from(buffer, pos)
            stop = pos + 4 + size
            if stop > end:
                break
            if kind == r1.FRAME_EVENTS:  # BE64 first sequence number, BE32 event count, ...
                first, count = _EVENTS_HEAD.unpack_from(buffer, pos + 5)
                self.log.write(memoryview(buffer)[pos:stop])
                last = first + count - 1
            elif kind == r1.FRAME_HELLO:
                self.write(r1.welcome({"incarnation": "logging", "stored": 0}))
            elif kind == r1.FRAME_PING:
                self.write(r1.pong())
            pos = stop
        del buffer[:pos]
        if last is not None:
            self.write(r1.ack(last))


async def _logging_peer(port: int, log: BinaryIO) -> None:
    await asyncio.get_running_loop().create_server(lambda: _LoggingPeer(log), "127.0.0.1", port)


def serve(role: str, port: int, peers: list[int], work_us: float, path: str) -> None:
    import uvloop

    async def main() -> None:
        with open(path, "ab", buffering=0) as log:
            if role == "peer":
                await _peer(port, log)
            elif role == "logging-peer":
                await _logging_peer(port, log)
            else:
                await _owner(port, peers, work_us / 1e6, log)
            print("ready", flush=True)
            await asyncio.Event().wait()

    uvloop.install()
    asyncio.run(main())


def spawn(args: list[str]) -> subprocess.Popen[str]:
    """This script as a server (``--serve role port peers work path``), once it is ready."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", *args], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"a {args[0]} process did not start")
    return proc


class FloorGroup:
    """The floor relay: an owner and ``nodes - 1`` peers, each its own process."""

    def __init__(self, nodes: int, work_us: float, base: str) -> None:
        self.base = base
        self.peer_ports = [free_port() for _ in range(nodes - 1)]
        self.port = free_port()
        self.work_us = work_us
        self.procs: list[subprocess.Popen[str]] = []

    def start(self) -> None:
        for index, port in enumerate(self.peer_ports):
            self._spawn(["peer", str(port), "", "0", f"{self.base}/peer{index}"])
        peers = ",".join(map(str, self.peer_ports))
        self._spawn(["owner", str(self.port), peers, str(self.work_us), f"{self.base}/owner"])

    def _spawn(self, args: list[str]) -> None:
        self.procs.append(spawn(args))

    def pids(self) -> list[int]:  # the owner first, as bench_replication's groups
        return [self.procs[-1].pid, *(proc.pid for proc in self.procs[:-1])]

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(10)


# ---------------------------------------------------------------------------- the benchmark


@dataclass
class Run:
    pub: float
    cpu_by_process: list[float]  # µs per message, the owner first
    owner_loop_cpu: float  # µs per message of the owner's main thread (its event loop)


def loop_cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid``'s main thread (the event loop's)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def publish(go_bin: str, port: int, pids: list[int], args: argparse.Namespace) -> Run:
    before = [cpu_seconds(pid) for pid in pids]
    loop_before = loop_cpu_seconds(pids[0])
    flags = [f"--nsqd-tcp-address=127.0.0.1:{port}", f"--topic={TOPIC}", f"--runfor={args.runfor}"]
    flags += [f"--size={args.size}", f"--batch-size={args.batch_size}"]
    rate = go_tool(go_bin, "bench_writer", flags)
    loop_after = loop_cpu_seconds(pids[0])
    after = [cpu_seconds(pid) for pid in pids]
    messages = rate * float(args.runfor.rstrip("s"))
    by_process = [(a - b) * 1e6 / messages for a, b in zip(after, before, strict=True)]
    return Run(rate, by_process, (loop_after - loop_before) * 1e6 / messages)


def ours(nodes: int, args: argparse.Namespace, src: Path | None = None) -> Run:
    """Our group of ``nodes`` (nsqpy from ``src`` if given, else this one)."""
    scenario = next(s for s in SCENARIOS if s.nodes == nodes)
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as base:
        group = Group(scenario, base, [])
        if src is not None:
            for server in group.servers:
                server.env = {**os.environ, "PYTHONPATH": str(src)}
        try:
            group.start()
            group.create(TOPIC)
            pids = [server.pid for server in group.servers]
            return publish(args.go_bin, group.head.tcp, pids, args)
        finally:
            group.stop()


def ours_with_logging_peers(args: argparse.Namespace) -> Run:
    """Our nsqd as the owner of a group of three, its peers logging peers (acks 2)."""
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as base:
        ports = [free_port(), free_port()]
        Path(f"{base}/owner").mkdir()
        replication = [f"--replica-peer=127.0.0.1:{port}" for port in ports]
        replication += ["--replica-acks=2", "--replica-timeout=10s", "--node-id=1"]
        owner = Server("nsqpy", [sys.executable, "-m", "nsqpy.nsqd", *replication], f"{base}/owner")
        peers: list[subprocess.Popen[str]] = []
        try:
            for port in ports:
                peers.append(spawn(["logging-peer", str(port), "", "0", f"{base}/peer{port}"]))
            owner.start()
            owner.post(f"/topic/create?topic={TOPIC}")
            owner.post(f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
            return publish(args.go_bin, owner.tcp, [owner.pid, *(p.pid for p in peers)], args)
        finally:
            owner.stop()
            for peer in peers:
                peer.kill()
                peer.wait(10)


def floor(nodes: int, work_us: float, args: argparse.Namespace) -> Run:
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as base:
        group = FloorGroup(nodes, work_us, base)
        try:
            group.start()
            return publish(args.go_bin, group.port, group.pids(), args)
        finally:
            group.stop()


def run(args: argparse.Namespace) -> int:
    print(
        f"load average before: {format_load()}  cores {os.cpu_count()}  commit {git_commit()}",
        flush=True,
    )
    names = ["ours R=1", "ours R=3", "ours R=3, logging peers", "floor R=1", "floor R=3"]
    if args.before_src is not None:
        names += ["before R=1", "before R=3"]
    runs: dict[str, list[Run]] = {name: [] for name in names}
    works: list[float] = []
    idle = floor(1, 0.0, args).owner_loop_cpu * args.batch_size  # the relay's own cost
    for trial in range(args.trials):
        # ours R=1 first: its event loop's CPU per MPUB sets the floor relay's work
        r1 = ours(1, args)
        runs["ours R=1"].append(r1)
        work = args.work_us
        if work is None:
            work = max(0.0, r1.owner_loop_cpu * args.batch_size - idle)
        works.append(work)
        rest = [
            ("ours R=3", partial(ours, 3, args)),
            ("ours R=3, logging peers", partial(ours_with_logging_peers, args)),
            ("floor R=1", partial(floor, 1, work, args)),
            ("floor R=3", partial(floor, 3, work, args)),
        ]
        if args.before_src is not None:
            rest += [
                ("before R=1", partial(ours, 1, args, args.before_src)),
                ("before R=3", partial(ours, 3, args, args.before_src)),
            ]
        shift = trial % len(rest)
        for name, measure in rest[shift:] + rest[:shift]:
            runs[name].append(measure())
        line = "  ".join(f"{name} {runs[name][-1].pub:10,.0f}/s" for name in names)
        print(f"trial {trial + 1} (work {work:.0f} us/MPUB): {line}", file=sys.stderr, flush=True)
    print(
        f"\nGo's bench_writer, {args.size} B, MPUB {args.batch_size}, medians of {args.trials} "
        f"x {args.runfor}; the floor relay's owner spends {statistics.median(works):.0f} us "
        "per MPUB (median)"
    )
    print("| | PUB msgs/s | x its owner's R=1 | CPU us/msg by process: owner / peers |")
    print("|---|---|---|---|")
    for name in names:
        pub = statistics.median(r.pub for r in runs[name])
        base = statistics.median(r.pub for r in runs[name.split()[0] + " R=1"])  # same owner
        by_process = zip(*(r.cpu_by_process for r in runs[name]), strict=True)
        cpu = " / ".join(f"{statistics.median(values):.2f}" for values in by_process)
        print(f"| {name} | {pub:,.0f} | {pub / base:.2f}x | {cpu} |")
    print(f"load average after: {format_load()}", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--serve"]:
        role, port, peers, work_us, path = argv[1:6]
        serve(role, int(port), [int(p) for p in peers.split(",") if p], float(work_us), path)
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runfor", default="4s", help="bench_writer's time, in seconds")
    parser.add_argument("--trials", type=int, default=3, help="rounds of the runs")
    parser.add_argument(
        "--before-src", type=Path, default=None, help="an older nsqpy's src: its R=1 and R=3 too"
    )
    parser.add_argument(
        "--go-bin",
        default=os.environ.get("GO_NSQ_BIN", "build/go-nsq"),
        help="directory with Go's bench_writer (default $GO_NSQ_BIN)",
    )
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument(
        "--work-us",
        type=float,
        default=None,
        help="the floor relay owner's CPU per MPUB (default: our R=1's in each trial)",
    )
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    if not args.runfor.endswith("s") or not args.runfor[:-1].replace(".", "", 1).isdigit():
        parser.error("--runfor takes seconds, e.g. 4s")
    if args.before_src is not None:
        args.before_src = args.before_src.resolve()
        if not (args.before_src / "nsqpy" / "nsqd").is_dir():
            parser.error(f"--before-src {args.before_src} holds no nsqpy (want a tree's src/)")
    if not (Path(args.go_bin) / "bench_writer").is_file():
        parser.error(f"no bench_writer in {args.go_bin} (--go-bin or $GO_NSQ_BIN)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
