"""``nsqlookupd`` the command: flags and config file into :class:`Options`, then serve until
SIGINT/SIGTERM (Go: apps/nsqlookupd/main.go)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..internal import daemon, lg
from ..internal.flags import run_command
from .nsqlookupd import NSQLookupd, version_string
from .options import Options


def _start(options: Options) -> int:
    logger = lg.Logger(options.log_prefix, options.log_level)
    serving = daemon.serve("nsqlookupd", logger, lambda: NSQLookupd(options, logger=logger))
    return daemon.run_until_stopped(serving)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    return run_command("nsqlookupd", Options, args, version_string(), _start)


if __name__ == "__main__":
    sys.exit(main())
