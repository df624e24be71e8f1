"""``nsqadmin`` the command: flags and config file into :class:`Options`, then serve until
SIGINT/SIGTERM (Go: apps/nsqadmin/main.go)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence

from ..internal import lg
from ..internal.flags import run_command
from ..internal.net import ListenError
from ..nsqlookupd.__main__ import run_event_loop
from .nsqadmin import ConfigError, NSQAdmin, version_string
from .options import Options


async def serve(options: Options) -> int:
    """Run one nsqadmin until a stop signal; the exit status."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    logger = lg.Logger(options.log_prefix, options.log_level)
    try:
        admin = NSQAdmin(options, logger=logger)
    except ConfigError as exc:
        logger.fatal(f"failed to instantiate nsqadmin - {exc}")
        return 1
    try:
        await admin.start()
    except ListenError as exc:
        logger.fatal(f"failed to instantiate nsqadmin - {exc}")
        await admin.stop()
        return 1
    try:
        await stopping.wait()
    finally:
        await admin.stop()
    return 0


def _start(options: Options) -> int:
    try:
        return run_event_loop(serve(options))
    except KeyboardInterrupt:
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    return run_command("nsqadmin", Options, args, version_string(), _start)


if __name__ == "__main__":
    sys.exit(main())
