"""Kill nsqd at random moments under load and count the acknowledged messages that never
come back.

    .venv/bin/python bench/bench_crash_inflight.py --runs 10
    .venv/bin/python bench/bench_crash_inflight.py --runs 10 --nsqd-bin "$GO_NSQ_BIN/nsqd"

Each run starts a fresh nsqd with ``--mem-queue-size=0 --sync-every=1 --msg-timeout=2s`` (plus
``--nsqd-args``) on a new data directory. Publishers send numbered messages over PUB (one in
``--dpub-every`` as DPUB deferred 0.5-3 s) and note each one nsqd answered OK; consumers with
RDY ``--rdy`` finish most messages after a short "processing" delay, requeue some at once,
requeue some with a delay and leave some to time out. At a random moment in ``--kill-window``
nsqd gets SIGKILL, is started again on the same directory, and a consumer drains the channel
until every acknowledged message is accounted for or nothing arrives for ``--quiet`` seconds.

A message counts as delivered when a consumer sent FIN for it before the kill or received it
after the restart; *lost* = acknowledged - delivered. *again* counts deliveries after the
restart of messages finished before it (at-least-once duplicates). ``--nsqd-bin`` runs another
nsqd binary (Go's) the same way. Bounded: ``--runs`` runs and at most ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field

from bench_nsqd import free_port
from nsqpy.protocol import commands
from nsqpy.protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    HEARTBEAT,
    MAGIC_V2,
    FrameDecoder,
)
from nsqpy.protocol.message import decode_message

TOPIC = "crash_bench"
CHANNEL = "c"
DURABLE_FLAGS = ["--mem-queue-size=0", "--sync-every=1", "--msg-timeout=2s"]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f} {five:.1f} {fifteen:.1f}"


class Nsqd:
    """One nsqd process on fixed loopback ports and a data directory kept across restarts."""

    def __init__(self, command: list[str], data: str, extra: list[str], log: str | None) -> None:
        self.command = command
        self.data = data
        self.extra = extra
        self.log = log
        self.tcp = free_port()
        self.http = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.log, "ab") if self.log else None  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [
                *self.command,
                f"--tcp-address=127.0.0.1:{self.tcp}",
                f"--http-address=127.0.0.1:{self.http}",
                f"--data-path={self.data}",
                "--broadcast-address=127.0.0.1",
                *DURABLE_FLAGS,
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=log if log is not None else subprocess.DEVNULL,
        )
        if log is not None:
            log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.request("GET", "/ping")
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nsqd did not start")

    def request(self, method: str, path: str) -> bytes:
        url = f"http://127.0.0.1:{self.http}{path}"
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5) as r:
            data: bytes = r.read()
            return data

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


class Conn:
    """A bare V2 connection: commands out, frames in (heartbeats answered)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self.frames: list[tuple[int, bytes]] = []

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(MAGIC_V2)
        return cls(reader, writer)

    async def frame(self) -> tuple[int, bytes]:
        while not self.frames:
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionError("closed")
            for frame_type, payload in self.decoder.feed(data):
                if frame_type != FRAME_TYPE_MESSAGE and payload == HEARTBEAT:
                    self.writer.write(commands.nop())
                    continue
                self.frames.append((frame_type, payload))
        return self.frames.pop(0)

    async def command(self, data: bytes) -> None:
        """Send a command that nsqd answers with a response (OK) or an error."""
        self.writer.write(data)
        frame_type, payload = await self.frame()
        if frame_type == FRAME_TYPE_ERROR:
            raise ConnectionError(payload.decode(errors="replace"))

    def close(self) -> None:
        self.writer.close()


@dataclass
class Run:
    acknowledged: set[bytes] = field(default_factory=set)
    finished: set[bytes] = field(default_factory=set)
    after: set[bytes] = field(default_factory=set)
    again: int = 0


async def publish(
    port: int, run: Run, serial: list[int], dpub_every: int, stop: asyncio.Event
) -> None:
    try:
        conn = await Conn.open(port)
    except OSError:
        return
    try:
        while not stop.is_set():
            serial[0] += 1
            body = b"m%09d" % serial[0]
            if dpub_every and serial[0] % dpub_every == 0:
                command = commands.dpub(TOPIC, random.randint(500, 3000), body)
            else:
                command = commands.pub(TOPIC, body)
            await conn.command(command)
            run.acknowledged.add(body)
    except (ConnectionError, OSError):
        pass
    finally:
        conn.close()


async def consume(port: int, run: Run, rdy: int, stop: asyncio.Event) -> None:
    """Finish most messages after 0-50 ms, requeue 5 % at once and 5 % with a delay, and leave
    2 % to time out; stops at the kill (the connection drops)."""
    loop = asyncio.get_running_loop()
    try:
        conn = await Conn.open(port)
        await conn.command(commands.identify({"msg_timeout": 2000}))
        await conn.command(commands.sub(TOPIC, CHANNEL))
    except (ConnectionError, OSError):
        return
    conn.writer.write(commands.rdy(rdy))

    def finish(msg_id: bytes, body: bytes) -> None:
        if not stop.is_set() and not conn.writer.is_closing():
            conn.writer.write(commands.fin(msg_id))
            run.finished.add(body)

    try:
        while not stop.is_set():
            frame_type, payload = await conn.frame()
            if frame_type != FRAME_TYPE_MESSAGE:
                continue
            msg = decode_message(payload)
            roll = random.random()
            if roll < 0.05:
                conn.writer.write(commands.req(msg.id, 0))
            elif roll < 0.10:
                conn.writer.write(commands.req(msg.id, random.randint(500, 3000)))
            elif roll < 0.12:
                pass  # times out after --msg-timeout
            else:
                loop.call_later(random.uniform(0, 0.05), finish, msg.id, msg.body)
    except (ConnectionError, OSError):
        pass
    finally:
        conn.close()


async def drain(port: int, run: Run, quiet: float, limit: float) -> None:
    """After the restart: take and finish everything until all is accounted for or quiet."""
    conn = await Conn.open(port)
    await conn.command(commands.sub(TOPIC, CHANNEL))
    conn.writer.write(commands.rdy(500))
    deadline = time.monotonic() + limit
    try:
        while time.monotonic() < deadline:
            if not run.acknowledged - run.finished - run.after:
                break
            try:
                frame_type, payload = await asyncio.wait_for(conn.frame(), quiet)
            except TimeoutError:
                break
            if frame_type != FRAME_TYPE_MESSAGE:
                continue
            msg = decode_message(payload)
            conn.writer.write(commands.fin(msg.id))
            if msg.body in run.finished:
                run.again += 1
            run.after.add(msg.body)
    finally:
        conn.close()


async def one_run(nsqd: Nsqd, args: argparse.Namespace, kill_at: float) -> Run:
    run = Run()
    stop = asyncio.Event()
    serial = [0]
    tasks = [
        asyncio.create_task(consume(nsqd.tcp, run, args.rdy, stop)) for _ in range(args.consumers)
    ]
    tasks += [
        asyncio.create_task(publish(nsqd.tcp, run, serial, args.dpub_every, stop))
        for _ in range(args.publishers)
    ]
    await asyncio.sleep(kill_at)
    nsqd.kill()  # SIGKILL first: nothing may be finished or written after this moment
    stop.set()
    await asyncio.wait(tasks, timeout=10)
    nsqd.start()
    await drain(nsqd.tcp, run, args.quiet, args.drain_limit)
    return run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--max-seconds", type=float, default=600, help="stop starting runs after")
    parser.add_argument("--nsqd-bin", help="an nsqd binary to run instead of ours (Go's)")
    parser.add_argument("--nsqd-args", default="", help="extra nsqd flags, space separated")
    parser.add_argument("--kill-window", default="1.0,4.0", help="seconds: earliest,latest")
    parser.add_argument("--publishers", type=int, default=8)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--rdy", type=int, default=50)
    parser.add_argument("--dpub-every", type=int, default=10)
    parser.add_argument("--quiet", type=float, default=5.0, help="drain ends after this silence")
    parser.add_argument("--drain-limit", type=float, default=30.0)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--log-dir", help="keep each run's nsqd log here (run-N.log)")
    args = parser.parse_args(argv)
    earliest, latest = (float(x) for x in args.kill_window.split(","))
    rng = random.Random(args.seed)
    random.seed(args.seed)
    command = [args.nsqd_bin] if args.nsqd_bin else [sys.executable, "-m", "nsqpy.nsqd"]
    name = args.nsqd_bin or "nsqpy nsqd"
    print(f"{name} {' '.join(DURABLE_FLAGS)} {args.nsqd_args}".rstrip(), flush=True)
    started = time.monotonic()
    totals = [0, 0, 0, 0]
    runs = 0
    for index in range(1, args.runs + 1):
        if time.monotonic() - started > args.max_seconds:
            print(f"stopping after {index - 1} runs: --max-seconds reached")
            break
        data = tempfile.mkdtemp(prefix="crash_inflight_")
        log = os.path.join(args.log_dir, f"run-{index}.log") if args.log_dir else None
        nsqd = Nsqd(command, data, args.nsqd_args.split(), log)
        try:
            nsqd.start()
            nsqd.request("POST", f"/topic/create?topic={TOPIC}")
            nsqd.request("POST", f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
            time.sleep(0.3)  # nsqd.dat is written in the background: the restart must find it
            kill_at = rng.uniform(earliest, latest)
            run = asyncio.run(one_run(nsqd, args, kill_at))
        finally:
            nsqd.kill()
            shutil.rmtree(data, ignore_errors=True)
        in_air = len(run.acknowledged - run.finished)
        lost = len(run.acknowledged - run.finished - run.after)
        print(
            f"run {index:2d} kill at {kill_at:.2f}s: acknowledged {len(run.acknowledged)}, "
            f"unfinished at the kill {in_air}, delivered after restart {len(run.after)}, "
            f"lost {lost}, finished ones delivered again {run.again} | {load()}",
            flush=True,
        )
        for slot, value in enumerate((len(run.acknowledged), in_air, lost, run.again)):
            totals[slot] += value
        runs += 1
    print(
        f"total over {runs} runs: acknowledged {totals[0]}, unfinished at the kill {totals[1]}, "
        f"lost {totals[2]}, finished ones delivered again {totals[3]} | {load()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
