"""``nsqlookupd`` the command: flags and config file into :class:`Options`, then serve until
SIGINT/SIGTERM (Go: apps/nsqlookupd/main.go)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from ..internal import lg
from ..internal.flags import run_command
from .nsqlookupd import ListenError, NSQLookupd, version_string
from .options import Options


def run_event_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` on uvloop when it is installed, else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def serve(options: Options) -> int:
    """Run one nsqlookupd until a stop signal; the exit status."""
    # Handlers first: a stop signal that comes while starting up still stops cleanly.
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    logger = lg.Logger(options.log_prefix, options.log_level)
    lookupd = NSQLookupd(options, logger=logger)
    try:
        await lookupd.start()
    except ListenError as exc:
        logger.fatal(f"failed to instantiate nsqlookupd - {exc}")
        await lookupd.stop()
        return 1
    try:
        await stopping.wait()
    finally:
        await lookupd.stop()
    return 0


def _start(options: Options) -> int:
    try:
        return run_event_loop(serve(options))
    except KeyboardInterrupt:  # a signal that came before the handlers were installed
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    return run_command("nsqlookupd", Options, args, version_string(), _start)


if __name__ == "__main__":
    sys.exit(main())
