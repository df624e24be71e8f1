"""Shared plumbing for the bench tools: worker processes, timing, Go-style report lines."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from typing import Any


def go_style_args(argv: list[str]) -> list[str]:
    """Accept Go's single-dash long flags (``-runfor 5s``) as well as ``--runfor``."""
    return [
        "-" + a if a.startswith("-") and not a.startswith("--") and len(a) > 2 else a for a in argv
    ]


def parse_duration(text: str) -> float:
    from nsqpy.internal.durations import parse_duration as parse

    return parse(text)


def run_workers(
    workers: int, target: Callable[..., None], args: tuple[Any, ...]
) -> tuple[int, float]:
    """Start ``workers`` processes running ``target(*args, start_event, results)``.

    Returns (total count, elapsed seconds). Each worker puts (count, seconds) on results.
    """
    ctx = mp.get_context("fork")
    start = ctx.Event()
    results: Any = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, start, results)) for _ in range(workers)]
    for proc in procs:
        proc.start()
    time.sleep(0.2)
    start.set()
    total = 0
    longest = 0.0
    for _ in procs:
        count, seconds = results.get(timeout=600)
        total += count
        longest = max(longest, seconds)
    for proc in procs:
        proc.join(10)
    return total, longest


def report(name: str, count: int, seconds: float, size: int) -> None:
    """Go's line: ``duration: <d> - <MB/s>mb/s - <ops/s>ops/s - <us/op>us/op``."""
    mbps = count * size / (1024 * 1024) / seconds if seconds else 0.0
    ops = count / seconds if seconds else 0.0
    us_per_op = seconds * 1e6 / count if count else 0.0
    line = (
        f"[{name}] duration: {seconds:.6f}s - {mbps:.3f}mb/s - {ops:.3f}ops/s - "
        f"{us_per_op:.3f}us/op"
    )
    print(line, file=sys.stderr, flush=True)


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runfor", default="10s", help="duration of time to run (Go syntax)")
    parser.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    parser.add_argument("--topic", default="sub_bench")
    parser.add_argument("--size", type=int, default=200, help="bytes per message")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    return parser
