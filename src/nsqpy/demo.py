"""``make run``: the whole pipeline on this machine, with data flowing within a minute.

It starts nsqlookupd, two nsqd and nsqadmin, a producer of click-like JSON events, the Spark jobs
(``archive`` into Parquet and ``aggregate`` back into NSQ) in one local SparkSession, and a
consumer that prints the aggregates as they arrive, with a progress line every few seconds.
Ctrl-C stops everything in order: producer, Spark queries, consumer, nsqadmin, nsqd, nsqlookupd.

    python -m nsqpy.demo [--rate 200] [--work-dir nsqpy-demo] [--master local[*]]
    python -m nsqpy.demo consume TOPIC [--nsqd 127.0.0.1:4150]   # print a topic's messages
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from .client import Consumer, Message, Producer
from .pipeline.local import LocalNSQ

TOPIC = "clicks"
OUTPUT_TOPIC = "clicks_per_page"
PAGES = ["/", "/pricing", "/docs", "/blog", "/signup", "/login", "/about"]
ACTIONS = ["view", "view", "view", "click", "scroll"]


def _post(http: str, path: str, **params: str) -> None:
    url = f"http://{http}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=5):
        pass


def _channel_depths(nsq: LocalNSQ, topic: str) -> dict[str, int]:
    depths: dict[str, int] = {}
    for http in nsq.nsqd_http:
        url = (
            f"http://{http}/stats?format=json&include_clients=false&include_mem=false&topic={topic}"
        )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                stats = json.loads(resp.read())
        except OSError:
            continue
        for t in stats.get("topics") or ():
            for c in t.get("channels") or ():
                name = c["channel_name"]
                depths[name] = depths.get(name, 0) + int(c["depth"]) + int(c["in_flight_count"])
    return depths


class EventProducer(threading.Thread):
    """Publishes ``rate`` click events per second, spread over every nsqd."""

    def __init__(self, nsqd: Sequence[str], rate: int) -> None:
        super().__init__(name="demo-producer", daemon=True)
        self.nsqd = list(nsqd)
        self.rate = rate
        self.published = 0
        self.stopping = threading.Event()
        self.rng = random.Random(7)

    def event(self) -> bytes:
        self.published += 1
        return json.dumps(
            {
                "ts": round(time.time(), 3),
                "user": f"u{self.rng.randrange(1000)}",
                "page": self.rng.choice(PAGES),
                "action": self.rng.choice(ACTIONS),
                "seq": self.published,
            }
        ).encode()

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        tick = 0.1
        async with Producer(self.nsqd) as producer:
            started = time.monotonic()
            sent = 0
            while not self.stopping.is_set():
                due = int((time.monotonic() - started) * self.rate)
                if due > sent:
                    batch = [self.event() for _ in range(due - sent)]
                    try:
                        await producer.multi_publish(TOPIC, batch)
                    except Exception as exc:  # keep going: nsqd may be restarting
                        print(f"producer: {exc}", file=sys.stderr)
                    sent = due
                await asyncio.sleep(tick)


class AggregatePrinter(threading.Thread):
    """Consumes the aggregate topic and prints each count as it arrives."""

    def __init__(self, nsqd: Sequence[str]) -> None:
        super().__init__(name="demo-printer", daemon=True)
        self.nsqd = list(nsqd)
        self.received = 0
        self.loop = asyncio.new_event_loop()
        self.done = threading.Event()
        self._quit: asyncio.Event | None = None

    def handle(self, message: Message) -> None:
        self.received += 1
        try:
            agg: dict[str, Any] = json.loads(message.body)
            start = str(agg["window_start"])[11:19]
            end = str(agg["window_end"])[11:19]
            print(
                f"  aggregate  {start}-{end}  {agg.get('page')!s:<10} {agg['count']:>6}", flush=True
            )
        except (ValueError, KeyError):
            print(f"  aggregate  {message.body!r}", flush=True)

    def run(self) -> None:
        self.loop.run_until_complete(self._run())
        self.done.set()

    async def _run(self) -> None:
        self._quit = asyncio.Event()
        consumer = Consumer(
            OUTPUT_TOPIC, "printer", self.handle, nsqd_tcp_addresses=self.nsqd, max_in_flight=100
        )
        await consumer.start()
        await self._quit.wait()
        await consumer.close(timeout=5)

    def stop(self) -> None:
        if self._quit is not None:
            self.loop.call_soon_threadsafe(self._quit.set)
        self.done.wait(10)


class ArchiveCounter:
    """Rows in the archive, from Parquet footers (each file is read once: they never change)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: dict[Path, int] = {}

    def count(self) -> int:
        import pyarrow.parquet as pq

        if self.path.exists():
            for f in self.path.rglob("*.parquet"):
                if f not in self.seen and "_spark_metadata" not in f.parts:
                    with contextlib.suppress(OSError, ValueError):
                        self.seen[f] = pq.ParquetFile(f).metadata.num_rows
        return sum(self.seen.values())


def progress(
    started: float, producer: EventProducer, archive: ArchiveCounter, nsq: LocalNSQ, printer: Any
) -> str:
    depths = _channel_depths(nsq, TOPIC)
    lag = "  ".join(f"{TOPIC}/{c} {d:,}" for c, d in sorted(depths.items()))
    return (
        f"[{time.monotonic() - started:5.0f}s] published {producer.published:,}  "
        f"archived {archive.count():,}  aggregates received {printer.received:,}  "
        f"depth: {lag or '-'}"
    )


def consume(argv: Sequence[str]) -> int:
    """Print the messages of a topic as they arrive (an ephemeral channel), until Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m nsqpy.demo consume")
    parser.add_argument("topic")
    parser.add_argument("--nsqd", action="append", help="nsqd TCP address (default :4150)")
    args = parser.parse_args(argv)

    def show(message: Message) -> None:
        print(message.body.decode(errors="replace"), flush=True)

    async def run() -> None:
        addresses = args.nsqd or ["127.0.0.1:4150"]
        consumer = Consumer(
            args.topic,
            "demo-consume#ephemeral",
            show,
            nsqd_tcp_addresses=addresses,
            max_in_flight=100,
        )
        await consumer.start()
        try:
            await asyncio.Event().wait()
        finally:
            await consumer.close(timeout=5)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["consume"]:
        return consume(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m nsqpy.demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rate", type=int, default=200, help="events per second (default 200)")
    parser.add_argument("--work-dir", type=Path, default=Path("nsqpy-demo"))
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between progress lines")
    parser.add_argument("--keep", action="store_true", help="keep the previous run's data")
    args = parser.parse_args(argv)

    work: Path = args.work_dir.absolute()
    if work.exists() and not args.keep:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    started = time.monotonic()
    nsq = LocalNSQ(work, admin=True).start()
    producer = EventProducer(nsq.nsqd_tcp, args.rate)
    printer = AggregatePrinter(nsq.nsqd_tcp)
    archive = ArchiveCounter(work / "archive")
    spark = None
    queries: list[Any] = []
    try:
        # topics and channels first: events published before Spark is up wait for the jobs
        for http in nsq.nsqd_http:
            for topic, channels in (
                (TOPIC, ("archive", "aggregate")),
                (OUTPUT_TOPIC, ("printer",)),
            ):
                _post(http, "/topic/create", topic=topic)
                for name in channels:
                    _post(http, "/channel/create", topic=topic, channel=name)
        nsqds = ", ".join(
            f"{t} (http {h})" for t, h in zip(nsq.nsqd_tcp, nsq.nsqd_http, strict=True)
        )
        print(
            "nsqpy demo: NSQ -> Spark -> Parquet, and back to NSQ   (Ctrl-C stops everything)\n"
            f"  nsqadmin    {nsq.admin_url}   (watch topics, rates and depths live)\n"
            f"  nsqlookupd  http://{nsq.lookupd_http}\n"
            f"  nsqd        {nsqds}\n"
            f"  producer    {args.rate} click events/s -> topic '{TOPIC}' on both nsqd\n"
            f"  archive     {TOPIC}/archive -> {work / 'archive'} (Parquet by date/hour)\n"
            f"  aggregate   {TOPIC}/aggregate -> events per page per 10 s window "
            f"-> topic '{OUTPUT_TOPIC}'\n"
            f"  printer     prints '{OUTPUT_TOPIC}' below as windows close\n"
            f"  logs        {work / 'logs'}\n",
            flush=True,
        )
        producer.start()
        printer.start()
        reporter = threading.Thread(
            target=_report,
            args=(stopping, args.every, started, producer, archive, nsq, printer),
            daemon=True,
        )
        reporter.start()
        print(f"starting Spark ({args.master}); the first results follow in ~30 s", flush=True)
        spark, queries = _start_jobs(args.master, nsq, work)
        deadline = started + args.duration if args.duration else None
        while not stopping.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            for query in queries:
                if not query.isActive and query.exception() is not None:
                    print(f"query {query.name} failed: {query.exception()}", file=sys.stderr)
                    return 1
            stopping.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stopping.set()
        print(
            "\nstopping: producer, Spark queries, printer, nsqadmin, nsqd, nsqlookupd ...",
            flush=True,
        )
        producer.stopping.set()
        producer.join(5)
        if spark is not None:
            from .pipeline.session import quiet_accumulator_hangups

            # stopping a query interrupts its running batch, which Spark logs as errors
            with contextlib.suppress(Exception):
                spark.sparkContext.setLogLevel("OFF")
                quiet_accumulator_hangups(spark)
        for query in queries:
            with contextlib.suppress(Exception):
                query.stop()
        if spark is not None:
            from .pipeline.session import stop_session

            with contextlib.suppress(Exception):
                stop_session(spark)
        printer.stop()
        nsq.stop()
        print(progress(started, producer, archive, nsq, printer).split(" depth")[0], flush=True)
        print(f"archive: {work / 'archive'}", flush=True)
    return 0


def _report(
    stopping: threading.Event,
    every: float,
    started: float,
    producer: EventProducer,
    archive: ArchiveCounter,
    nsq: LocalNSQ,
    printer: AggregatePrinter,
) -> None:
    while not stopping.wait(every):
        with contextlib.suppress(Exception):
            print(progress(started, producer, archive, nsq, printer), flush=True)


def _start_jobs(master: str, nsq: LocalNSQ, work: Path) -> tuple[Any, list[Any]]:
    from .pipeline.jobs import SourceConfig, Trigger, aggregate_query, archive_query
    from .pipeline.session import pipeline_session

    spark = pipeline_session(
        master, "nsqpy demo", {"spark.sql.shuffle.partitions": "2"}, log_level="ERROR"
    )
    source = SourceConfig(topic=TOPIC, lookupd=[nsq.lookupd_http])
    archive = archive_query(
        spark,
        source,
        output=work / "archive",
        checkpoint=work / "checkpoints" / "archive",
        staging=work / "staging" / "archive",
        trigger=Trigger("5 seconds"),
    )
    aggregate = aggregate_query(
        spark,
        source,
        output_topic=OUTPUT_TOPIC,
        checkpoint=work / "checkpoints" / "aggregate",
        staging=work / "staging" / "aggregate",
        window="10 seconds",
        watermark="5 seconds",
        trigger=Trigger("2 seconds"),
    )
    return spark, [archive, aggregate]


if __name__ == "__main__":
    sys.exit(main())
