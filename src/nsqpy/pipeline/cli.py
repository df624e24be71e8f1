"""``nsqpy-pipeline``: run the archive and aggregate jobs on any Spark master.

::

    nsqpy-pipeline --lookupd 127.0.0.1:4161 --topic clicks archive
    nsqpy-pipeline --lookupd 127.0.0.1:4161 --topic clicks aggregate --output-topic clicks_per_page
    nsqpy-pipeline --lookupd 127.0.0.1:4161 --topic clicks all          # both, one session
    nsqpy-pipeline --master spark://host:7077 --work-dir /shared/pipeline ... archive

Checkpoints, staging and the archive default to directories under ``--work-dir``
(``./nsqpy-pipeline``); on a cluster they must be on storage every node shares.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

__all__ = ["main"]

log = logging.getLogger("nsqpy.pipeline")


def _addresses(values: Sequence[str] | None) -> list[str]:
    result: list[str] = []
    for value in values or ():
        result.extend(v.strip() for v in value.split(",") if v.strip())
    return result


def _pairs(values: Sequence[str] | None, what: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for value in values or ():
        key, sep, val = value.partition("=")
        if not sep:
            raise SystemExit(f"nsqpy-pipeline: {what} {value!r} must be KEY=VALUE")
        result[key] = val
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nsqpy-pipeline",
        description="Spark jobs over NSQ: archive a topic to Parquet, aggregate it back to NSQ.",
    )
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master (default: what spark-submit set, else local[*])",
    )
    parser.add_argument("--lookupd", action="append", help="nsqlookupd HTTP address (repeatable)")
    parser.add_argument("--nsqd", action="append", help="nsqd TCP address (instead of lookupd)")
    parser.add_argument("--nsqd-http", action="append", help="nsqd HTTP addresses, as --nsqd")
    parser.add_argument("--topic", default="clicks", help="topic to read (default: clicks)")
    parser.add_argument(
        "--work-dir",
        default="nsqpy-pipeline",
        type=Path,
        help="base of the default checkpoint, staging and archive directories",
    )
    parser.add_argument("--checkpoint-dir", type=Path, help="default: WORK_DIR/checkpoints")
    parser.add_argument("--staging-dir", type=Path, help="default: WORK_DIR/staging")
    parser.add_argument("--trigger", default="5 seconds", help="micro-batch interval")
    parser.add_argument(
        "--available-now",
        action="store_true",
        help="read what the channels hold now, then stop (Trigger.AvailableNow)",
    )
    parser.add_argument(
        "--max-messages-per-trigger", type=int, help="cap on messages per micro-batch"
    )
    parser.add_argument(
        "--option", action="append", metavar="KEY=VALUE", help="extra nsq source option"
    )
    parser.add_argument("--conf", action="append", metavar="KEY=VALUE", help="Spark setting")
    jobs = parser.add_subparsers(dest="job", required=True)

    archive = jobs.add_parser("archive", help="the topic into partitioned Parquet")
    aggregate = jobs.add_parser("aggregate", help="windowed counts per key back to NSQ")
    both = jobs.add_parser("all", help="archive and aggregate in one Spark session")
    for sub in (archive, both):
        sub.add_argument(
            "--output", type=Path, help="Parquet directory (default: WORK_DIR/archive)"
        )
        sub.add_argument("--archive-channel", default="archive")
        sub.add_argument("--watermark", default="10 minutes", help="deduplication window")
    for sub in (aggregate, both):
        sub.add_argument("--output-topic", help="default: TOPIC_per_KEY")
        sub.add_argument("--aggregate-channel", default="aggregate")
        sub.add_argument("--key", default="page", help="JSON field to count by (default: page)")
        sub.add_argument("--window", default="10 seconds", help="tumbling window length")
        sub.add_argument("--late", default="30 seconds", help="watermark for late events")
    return parser


def run(args: argparse.Namespace) -> int:
    from pyspark.sql.streaming import StreamingQuery

    from .jobs import SourceConfig, Trigger, aggregate_query, archive_query
    from .session import pipeline_session, quiet_accumulator_hangups, stop_session

    lookupd, nsqd = _addresses(args.lookupd), _addresses(args.nsqd)
    if not lookupd and not nsqd:
        raise SystemExit("nsqpy-pipeline: give --lookupd (or --nsqd)")
    options = _pairs(args.option, "--option")
    if args.max_messages_per_trigger:
        options["maxMessagesPerTrigger"] = str(args.max_messages_per_trigger)
    source = SourceConfig(
        topic=args.topic,
        lookupd=lookupd,
        nsqd=nsqd,
        nsqd_http=_addresses(args.nsqd_http),
        options=options,
    )
    work: Path = args.work_dir
    checkpoints = args.checkpoint_dir or work / "checkpoints"
    staging = args.staging_dir or work / "staging"
    trigger = Trigger(args.trigger, args.available_now)
    master = args.master
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = "local[*]"  # not under spark-submit
    spark = pipeline_session(master, f"nsqpy-pipeline {args.job}", _pairs(args.conf, "--conf"))

    queries: list[StreamingQuery] = []
    if args.job in ("archive", "all"):
        output = args.output or work / "archive"
        queries.append(
            archive_query(
                spark,
                source,
                output=output.absolute(),
                checkpoint=(checkpoints / "archive").absolute(),
                staging=(staging / "archive").absolute(),
                channel=args.archive_channel,
                watermark=args.watermark,
                trigger=trigger,
            )
        )
        print(f"archive: {args.topic}/{args.archive_channel} -> {output}", flush=True)
    if args.job in ("aggregate", "all"):
        output_topic = args.output_topic or f"{args.topic}_per_{args.key}"
        queries.append(
            aggregate_query(
                spark,
                source,
                output_topic=output_topic,
                checkpoint=(checkpoints / "aggregate").absolute(),
                staging=(staging / "aggregate").absolute(),
                key=args.key,
                window=args.window,
                watermark=args.late,
                channel=args.aggregate_channel,
                trigger=trigger,
            )
        )
        print(f"aggregate: {args.topic}/{args.aggregate_channel} -> {output_topic}", flush=True)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    failed = False
    try:
        while any(q.isActive for q in queries):
            spark.streams.awaitAnyTermination()
            spark.streams.resetTerminated()
            for query in queries:
                if not query.isActive and query.exception() is not None:
                    print(f"query {query.name} failed: {query.exception()}", file=sys.stderr)
                    failed = True
            if failed:
                break
    except KeyboardInterrupt:
        print("stopping...", flush=True)
    finally:
        quiet_accumulator_hangups(spark)
        for query in queries:
            query.stop()
        stop_session(spark)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
