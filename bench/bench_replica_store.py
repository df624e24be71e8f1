"""A peer's replica store taking in an owner's stream, in-process: no sockets, no other load.

    python bench/bench_replica_store.py --messages 1000000 --trials 3

Each trial opens a fresh store in a temporary directory and applies what an owner streams for
Go's ``bench_writer`` (MPUBs of ``--batch`` messages of ``--size`` bytes, each one RUN event),
as a peer's link applies it (encoded bytes in, no fsync on the loop):

- ``held``: a topic without channels, so every message waits in the topic: the peer's backlog
  grows to ``--messages``;
- ``fanout``: the same, each MPUB then copied to one channel by a FANOUT (an owner whose topic
  reads its backlog back and pumps it to a channel without consumers: the replication
  benchmark's PUB case);
- ``channel``: a topic with one channel, then a FIN of every message in batches of
  ``--batch`` (a consumer keeping up: the backlog stays near one batch);
- ``fin1``: the same, each message finished by a FIN of its own (a consumer with RDY 1).

It prints, per scenario, the time per message (median of the trials) and the slowest single
apply in any trial: a peer's event loop is blocked for that long, its own clients with it;
apart from those, the time per message the link's frame parser takes to read the EVENTS
frames (``FrameParser.feed``); and the memory the store holds per message once they are all
applied (``held``'s is what a peer's backlog costs it), from a separate pass of up to
100,000 messages under ``tracemalloc`` (which slows every allocation).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

from nsqpy.nsqd.guid import GUIDFactory
from nsqpy.nsqd.replica.store import ReplicaStore
from nsqpy.protocol.replica import Event, Events, Fanout, Fin, FrameParser, Run
from nsqpy.protocol.replica import events as events_frame

TOPIC = "bench"
CHANNEL = "ch"
SCENARIOS = ("held", "fanout", "channel", "fin1")
#: messages of the pass that measures the memory held (tracemalloc slows it)
MEMORY_MESSAGES = 100_000


def runs(count: int, batch: int, size: int, channels: tuple[str, ...] | None) -> Iterator[Run]:
    guid = GUIDFactory(1)
    body = (size.to_bytes(4, "big") + b"m" * size) * batch
    for _ in range(count // batch):
        yield Run(TOPIC, time.time_ns(), tuple(guid.new_ids(batch)), body, channels)


class Applier:
    """Applies event batches to a store as the peer's link does, timing each: the EVENTS
    frame parsed (``decoding``), then applied."""

    def __init__(self, store: ReplicaStore) -> None:
        self.store = store
        self.parser = FrameParser()
        self.seq = 1
        self.decoding = 0.0
        self.spent = 0.0
        self.slowest = 0.0

    def apply(self, events: list[Event]) -> None:
        frame = events_frame(self.seq, events)
        start = time.perf_counter()
        (parsed,) = self.parser.feed(frame)
        self.decoding += time.perf_counter() - start
        assert isinstance(parsed, Events)
        start = time.perf_counter()
        self.store.apply(self.seq, parsed.events, parsed.encoded, sync=False)
        took = time.perf_counter() - start
        self.seq += len(parsed.events)
        self.spent += took
        self.slowest = max(self.slowest, took)


def whole_runs(count: int, batch: int) -> int:
    """The messages of ``count`` sent in MPUBs of ``batch``: whole MPUBs only."""
    return count // batch * batch


def open_store(directory: str) -> ReplicaStore:
    return ReplicaStore(Path(directory), "owner:4150", "1", sync_every=10**9, sync_timeout=1e9)


def feed(applier: Applier, scenario: str, count: int, args: argparse.Namespace) -> None:
    """``count`` messages through the scenario's events; checks the copies left."""
    channels = (CHANNEL,) if scenario in ("channel", "fin1") else None
    for run in runs(count, args.batch, args.size, channels):
        applier.apply([run])
        if scenario == "fanout":
            applier.apply([Fanout(TOPIC, (CHANNEL,), run.ids)])
        elif scenario == "channel":
            applier.apply([Fin(TOPIC, CHANNEL, run.ids)])
        elif scenario == "fin1":
            applier.apply([Fin(TOPIC, CHANNEL, (msg_id,)) for msg_id in run.ids])
    left = applier.store.live_count()
    if left != (0 if channels is not None else whole_runs(count, args.batch)):
        raise SystemExit(f"{scenario}: {left} copies left")


def trial(scenario: str, args: argparse.Namespace) -> tuple[float, float, float]:
    """Seconds per message applying and decoding, and the slowest apply, for one fresh
    store."""
    with tempfile.TemporaryDirectory(prefix="bench-replica-") as directory:
        applier = Applier(open_store(directory))
        feed(applier, scenario, args.messages, args)
        applier.store.close()
        count = whole_runs(args.messages, args.batch)
        return applier.spent / count, applier.decoding / count, applier.slowest


def held_per_message(scenario: str, args: argparse.Namespace) -> float:
    """Bytes of Python memory a fresh store holds a message once the scenario's messages
    are applied (tracemalloc)."""
    count = whole_runs(min(args.messages, MEMORY_MESSAGES), args.batch)
    with tempfile.TemporaryDirectory(prefix="bench-replica-") as directory:
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            applier = Applier(open_store(directory))
            feed(applier, scenario, count, args)
            held = tracemalloc.get_traced_memory()[0] - start
        finally:
            tracemalloc.stop()
        applier.store.close()
    return held / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args()
    if args.batch < 1 or args.messages < args.batch or args.trials < 1:
        parser.error("want --batch >= 1, --messages >= --batch and --trials >= 1")
    unknown = set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario {', '.join(sorted(unknown))}: choose from {SCENARIOS}")
    gc.freeze()  # as nsqd does after start-up: the collector walks only what the store adds
    print(f"{args.messages:,} messages of {args.size} B in MPUBs of {args.batch}")
    print(
        f"{'scenario':<10} {'µs/msg':>8} {'slowest apply':>14} {'decode µs/msg':>14} "
        f"{'held B/msg':>11}"
    )
    for scenario in args.scenarios.split(","):
        results = [trial(scenario, args) for _ in range(args.trials)]
        per_message = statistics.median(result[0] for result in results)
        decoding = statistics.median(result[1] for result in results)
        slowest = max(result[2] for result in results)
        held = held_per_message(scenario, args)
        print(
            f"{scenario:<10} {per_message * 1e6:>8.3f} {slowest * 1e3:>11.1f} ms "
            f"{decoding * 1e6:>14.3f} {held:>11.1f}"
        )


if __name__ == "__main__":
    main()
