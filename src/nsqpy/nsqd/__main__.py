"""The ``nsqd`` command: Go-compatible flags and config file, then run until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from .. import version_line
from ..internal import daemon, lg
from ..internal.daemon import Service, StopSignals
from ..internal.flags import run_command
from .beyond.drain import drain
from .collector import CollectorPacer
from .nsqd import NSQD, NSQDError
from .options import Options


def install_event_loop_policy() -> None:
    try:
        import uvloop
    except ImportError:  # uvloop is optional (e.g. Windows): the stdlib loop works too
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def serve_with_paced_collector(serving: Coroutine[Any, Any, int]) -> int:
    """``serving`` with nsqd's full collections paced by their cost (collector.py)."""
    pacer = CollectorPacer()
    pacer.install()
    pacing = asyncio.create_task(pacer.run())
    try:
        return await serving
    finally:
        pacing.cancel()


async def drain_on_sigterm(nsqd: Service, signals: StopSignals) -> None:
    """nsqpy ``--drain-timeout``: after SIGTERM (not SIGINT) let consumers finish first; a
    second signal ends the drain at once."""
    assert isinstance(nsqd, NSQD)
    opts = nsqd.options
    if opts.drain_timeout > 0 and signals.received[0] == signal.SIGTERM:
        signals.stopping.clear()
        await drain(nsqd, opts.drain_timeout, interrupt=signals.stopping)


def start(opts: Options) -> int:
    install_event_loop_policy()
    logger = lg.Logger(opts.log_prefix, opts.log_level)
    serving = daemon.serve(
        "nsqd",
        logger,
        lambda: NSQD(opts, logger),
        start_errors=(NSQDError,),
        before_stop=drain_on_sigterm,
    )
    try:
        # asyncio.run under the policy above: replacing install_event_loop_policy (as
        # tests/faults/stdlib_loop_nsqd.py and bench/bench_nsqd.py do) keeps asyncio's loop
        return daemon.run_until_stopped(serve_with_paced_collector(serving), use_uvloop=False)
    except NSQDError as exc:
        sys.stderr.write(f"[nsqd] FATAL: {exc}\n")
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    return run_command("nsqd", Options, args, version_line("nsqd"), start)


if __name__ == "__main__":
    sys.exit(main())
