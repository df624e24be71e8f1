"""``python -m nsqpy.chaos``: run the chaos harness (see :mod:`nsqpy.chaos`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from .daemons import ClusterOptions
from .faults import FAULT_CLASSES, KNOWN_FAULT_CLASSES, NODE_LOST
from .netns import NAME_PREFIX, cleanup_prefix

EXIT_NOT_POSSIBLE = 2


def run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nsqpy.chaos",
        description=(
            "Build a 3-nsqd, 2-nsqlookupd cluster in private network namespaces, run producers "
            "and a consumer through it while injecting seeded faults (kill -9, SIGSTOP, "
            "partition, link loss/delay, nsqlookupd kill, full disk; with --replicated also "
            "a node lost with its disk), then check the history: "
            "lost (acknowledged, never delivered), duplicated, unexpected. Needs root. "
            "'python -m nsqpy.chaos cleanup' removes what a crashed run left behind; "
            "'python -m nsqpy.chaos report DIR' checks a finished run's histories again."
        ),
    )
    parser.add_argument("--seed", type=int, default=1, help="fault schedule seed (default 1)")
    parser.add_argument(
        "--duration", type=float, default=90.0, help="seconds of workload and faults (default 90)"
    )
    parser.add_argument("--out", type=Path, help="report/history directory (default chaos-out/…)")
    parser.add_argument("--rate", type=float, default=100.0, help="PUBs per second (default 100)")
    parser.add_argument("--publishers", type=int, default=3, help="concurrent publishers")
    parser.add_argument("--pub-timeout", type=float, default=5.0, help="PUB timeout: unknown")
    parser.add_argument(
        "--settle", type=float, default=40.0, help="max seconds to wait for deliveries at the end"
    )
    parser.add_argument("--nsqd-bin", help="run this nsqd binary (e.g. Go's) instead of ours")
    parser.add_argument("--nsqlookupd-bin", help="run this nsqlookupd binary instead of ours")
    parser.add_argument("--mem-queue-size", type=int, default=0, help="nsqd flag (default 0)")
    parser.add_argument("--sync-every", type=int, default=1, help="nsqd flag (default 1)")
    parser.add_argument(
        "--msg-timeout", type=float, default=5.0, help="nsqd --msg-timeout in seconds (default 5)"
    )
    parser.add_argument(
        "--replicated",
        action="store_true",
        help="run the nsqd as one replication group (docs/replication.md): each gets "
        "--replica-peer for every other, --replica-acks, --replica-timeout and its own "
        f"--node-id; the faults then include {NODE_LOST} (needs nsqpy's nsqd)",
    )
    parser.add_argument(
        "--replica-acks",
        type=int,
        default=2,
        help="with --replicated: nsqd --replica-acks (default 2)",
    )
    parser.add_argument(
        "--replica-timeout",
        type=float,
        default=3.0,
        help="with --replicated: nsqd --replica-timeout in seconds (default 3)",
    )
    parser.add_argument(
        "--faults",
        type=fault_classes,
        help="comma-separated fault classes to schedule (default: "
        f"{','.join(FAULT_CLASSES)}, plus {NODE_LOST} with --replicated); e.g. "
        f"'--faults {','.join((*FAULT_CLASSES, NODE_LOST))}' gives unreplicated (Go's) "
        "daemons a replicated run's schedule",
    )
    parser.add_argument(
        "--spark",
        action="store_true",
        help="also run the Spark archive job (killed and restarted as a fault) and check its "
        "Parquet against the acknowledged messages (needs Java and the spark extra)",
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "cleanup":
        return cleanup_main(args[1:])
    if args and args[0] == "report":
        return report_main(args[1:])
    if args and args[0].startswith("workload-"):
        return workload_main(args[0], args[1:])
    parser = run_parser()
    opts = parser.parse_args(args)
    for flag in ("duration", "rate", "pub_timeout", "msg_timeout", "publishers"):
        if getattr(opts, flag) <= 0:
            parser.error(f"--{flag.replace('_', '-')} must be positive")
    if opts.settle < 0:
        parser.error("--settle must not be negative")
    if opts.faults and "kill-spark" in opts.faults and not opts.spark:
        parser.error("--faults kill-spark needs --spark")
    try:
        cluster = ClusterOptions(
            nsqd_bin=opts.nsqd_bin,
            nsqlookupd_bin=opts.nsqlookupd_bin,
            mem_queue_size=opts.mem_queue_size,
            sync_every=opts.sync_every,
            msg_timeout=opts.msg_timeout,
            replicated=opts.replicated,
            replica_acks=opts.replica_acks,
            replica_timeout=opts.replica_timeout,
        )
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=logging.INFO if opts.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    logging.getLogger("nsqpy.chaos").setLevel(logging.INFO)
    problem = why_not_possible()
    if problem:
        print(f"chaos: {problem}", file=sys.stderr)
        return EXIT_NOT_POSSIBLE
    from .runner import Run, RunOptions

    run = Run(
        RunOptions(
            seed=opts.seed,
            duration=opts.duration,
            out=opts.out,
            rate=opts.rate,
            publishers=opts.publishers,
            pub_timeout=opts.pub_timeout,
            settle=opts.settle,
            cluster=cluster,
            plot=not opts.no_plot,
            spark=opts.spark,
            fault_classes=opts.faults,
        )
    )
    report = run.execute()
    return 0 if report["check"]["valid"] else 1


def fault_classes(text: str) -> tuple[str, ...]:
    """``--faults``: known class names, comma-separated. Returned in the harness's own order,
    so a seed's schedule depends on which classes are given, not on how they are listed."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(names - set(KNOWN_FAULT_CLASSES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown fault class {', '.join(unknown) or '(none given)'}: "
            f"choose from {', '.join(KNOWN_FAULT_CLASSES)}"
        )
    return tuple(c for c in KNOWN_FAULT_CLASSES if c in names)


def why_not_possible() -> str | None:
    """Why this machine cannot run the harness, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth links, tmpfs mounts): run it as root"
    for tool in ("ip", "tc", "mount"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (Debian: apt-get install iproute2)"
    return None


def cleanup_main(args: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nsqpy.chaos cleanup",
        description="Kill the processes in, and delete, every namespace left by a chaos run.",
    )
    parser.add_argument("--prefix", default=NAME_PREFIX, help=f"default {NAME_PREFIX!r}: all")
    opts = parser.parse_args(args)
    if os.geteuid() != 0:
        print("chaos cleanup: needs root", file=sys.stderr)
        return EXIT_NOT_POSSIBLE
    for item in cleanup_prefix(opts.prefix):
        print("removed", item)
    return 0


def report_main(args: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nsqpy.chaos report",
        description="Check a finished run's histories again and rewrite its report and plot.",
    )
    parser.add_argument("out", type=Path, help="the run's directory (--out)")
    parser.add_argument("--no-plot", action="store_true")
    opts = parser.parse_args(args)
    from .runner import recheck

    return 0 if recheck(opts.out, plot=not opts.no_plot)["check"]["valid"] else 1


def workload_main(role: str, args: Sequence[str]) -> int:
    """The workload processes the runner starts inside the client namespaces."""
    from .workload import History, run_consumer, run_producers

    parser = argparse.ArgumentParser(prog=f"python -m nsqpy.chaos {role}")
    parser.add_argument("--history", type=Path, required=True)
    parser.add_argument("--nsqd", action="append", default=[])
    parser.add_argument("--lookupd", action="append", default=[])
    parser.add_argument("--nsqd-http", action="append", default=[])
    parser.add_argument("--channel", action="append", default=[])
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--publishers", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--poll-interval", type=float, default=2.0)
    opts = parser.parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    with open(opts.history, "a") as stream:
        history = History(stream)
        if role == "workload-producer":
            coro = run_producers(
                opts.nsqd,
                history,
                rate=opts.rate,
                publishers=opts.publishers,
                timeout=opts.timeout,
                nsqd_http_addresses=opts.nsqd_http,
                channels=opts.channel,
            )
        elif role == "workload-consumer":
            coro = run_consumer(opts.lookupd, history, poll_interval=opts.poll_interval)
        else:
            parser.error(f"unknown workload {role}")
        asyncio.run(coro)
    return 0


if __name__ == "__main__":
    sys.exit(main())
