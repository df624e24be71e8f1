"""SUB from a settled backlog: the delivery path alone, whatever the publish phase left behind.

    python bench/bench_settled_sub.py --go-bin DIR --before-src /tmp/before/src --trials 3

Go's bench.sh (and ``bench_table.py``) reads for ``--runfor`` right after the writer's
``--runfor``: a SUB figure then also carries what the PUB phase left undone or spilled. A
server that publishes more in the same time starts SUB from another state: a larger backlog in
the topic, copies still to be made, or copies that overflowed ``--mem-queue-size`` into the
channels' disk queues. Here every server gets the same work instead:

1. a fresh nsqd with ``--mem-queue-size`` (default 1000000) and ``--channels`` channels;
2. exactly ``--messages`` messages published (MPUBs of 200 messages of 200 bytes, two
   connections, each MPUB waiting for its OK);
3. a wait until the topic is empty (every copy is in its channel) and one second more;
4. one Go ``bench_reader`` per channel for ``--runfor`` (RDY 2500, a FIN per message), as
   ``bench_nsqd.py --readers all``.

With ``--messages`` at most ``--mem-queue-size`` every copy is in memory: SUB measures the
delivery path. Servers alternate within a trial (Go's nsqd with ``--go-bin``, this tree's,
and the tree at ``--before-src``); the cells are medians: ``msgs/s (µs of nsqd CPU per
message)``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_nsqd import Server, cpu_seconds, create_channels, parse_seconds, read_channels
from nsqpy.protocol.commands import mpub

TOPIC = "sub_bench"
BATCH = 200
SIZE = 200
SETTLE_LIMIT = 120.0  # seconds for the topic's pump to empty the topic
OK_FRAME = (6).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"OK"


def publish(port: int, count: int) -> None:
    """``count`` messages (a multiple of BATCH) in MPUBs, each waiting for its OK."""
    command = mpub(TOPIC, [b"m" * SIZE] * BATCH)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"  V2")
        for _ in range(count // BATCH):
            sock.sendall(command)
            reply = b""
            while len(reply) < len(OK_FRAME):
                chunk = sock.recv(len(OK_FRAME) - len(reply))
                if not chunk:
                    raise ConnectionError("nsqd closed the connection")
                reply += chunk
            if reply != OK_FRAME:
                raise RuntimeError(f"MPUB answered {reply!r}")


def topic_stats(server: Server) -> dict[str, Any]:
    stats = json.loads(server.post(f"/stats?format=json&topic={TOPIC}"))
    stats = stats.get("data", stats)
    topics: list[dict[str, Any]] = stats.get("topics") or []
    return topics[0] if topics else {"depth": 0, "channels": []}


def topic_depth(server: Server) -> int:
    return int(topic_stats(server)["depth"])


def drained(server: Server) -> bool:
    """Whether a reader emptied its channel: its rate is then a lower bound."""
    return any(int(channel["depth"]) == 0 for channel in topic_stats(server)["channels"])


def settle(server: Server) -> None:
    deadline = time.monotonic() + SETTLE_LIMIT
    while topic_depth(server) > 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server.kind}: the topic did not empty in {SETTLE_LIMIT:.0f}s")
        time.sleep(0.1)
    time.sleep(1.0)


def trial(server: Server, args: argparse.Namespace) -> tuple[float, float, bool]:
    """One fresh nsqd: the backlog published and settled, then the readers; msgs/s, µs of
    nsqd CPU per message, and whether a reader ran dry."""
    server.start()
    try:
        names = create_channels(server, TOPIC, args.channels)
        share = args.messages // 2
        writers = [threading.Thread(target=publish, args=(server.tcp, share)) for _ in range(2)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        settle(server)
        reader = [
            f"--nsqd-tcp-address=127.0.0.1:{server.tcp}",
            f"--size={SIZE}",
            f"--topic={TOPIC}",
            f"--runfor={args.runfor}",
            "--rdy=2500",
        ]
        before = cpu_seconds(server.pid)
        rate = read_channels(str(args.go_bin), reader, names)
        spent = cpu_seconds(server.pid) - before
        dry = drained(server)
    finally:
        server.stop()
    return rate, spent * 1e6 / (rate * parse_seconds(args.runfor)), dry


def fresh_server(kind: str, args: argparse.Namespace, data: str) -> Server:
    """A new nsqd of ``kind`` (nsqpy, before, go) on new ports over the empty ``data``."""
    flags = [f"--mem-queue-size={args.mem_queue_size}"]
    if kind == "go":
        return Server(kind, [str(args.go_bin / "nsqd"), *flags], data)
    env = None
    if kind == "before":
        env = {**os.environ, "PYTHONPATH": str(Path(args.before_src).resolve())}
    return Server(kind, [sys.executable, "-m", "nsqpy.nsqd", *flags], data, env=env)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--go-bin", required=True, type=Path, help="Go's bench_reader (and nsqd)")
    parser.add_argument("--before-src", default="", help="an older nsqpy's src, as a column")
    parser.add_argument("--no-go-nsqd", dest="go_nsqd", action="store_false")
    parser.add_argument("--channels", type=int, default=100)
    parser.add_argument("--messages", type=int, default=900_000)
    parser.add_argument("--mem-queue-size", type=int, default=1_000_000)
    parser.add_argument("--runfor", default="4s", help="the readers' duration")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args(argv)
    if args.messages < 2 * BATCH or args.messages % (2 * BATCH):
        parser.error(f"--messages must be a positive multiple of {2 * BATCH}")
    if args.channels < 1 or args.trials < 1:
        parser.error("--channels and --trials must be at least 1")
    if not (args.go_bin / "bench_reader").is_file():
        parser.error(f"{args.go_bin} has no bench_reader")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results: dict[str, list[tuple[float, float]]] = {}
    kinds = ["nsqpy"] + ["before"] * bool(args.before_src) + ["go"] * args.go_nsqd
    for turn in range(args.trials):
        shift = turn % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            with tempfile.TemporaryDirectory() as data:
                rate, cpu, dry = trial(fresh_server(kind, args, data), args)
            results.setdefault(kind, []).append((rate, cpu))
            load = os.getloadavg()[0]
            mark = "  (a reader ran dry: a lower bound; raise --messages)" if dry else ""
            print(
                f"  trial {turn + 1} {kind:6}: SUB {rate:,.0f}/s ({cpu:.2f} µs) "
                f"load {load:.2f}{mark}"
            )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"\n{args.channels} channels, --mem-queue-size={args.mem_queue_size}, "
        f"{args.messages:,} messages settled, readers {args.runfor}, medians of {args.trials}:"
    )
    base = statistics.median(rate for rate, _ in results["nsqpy"])
    for kind, figures in results.items():
        rate = statistics.median(r for r, _ in figures)
        cpu = statistics.median(c for _, c in figures)
        print(f"  {kind:6}: SUB {rate:,.0f}/s ({cpu:.2f} µs)  nsqpy / this: {base / rate:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
