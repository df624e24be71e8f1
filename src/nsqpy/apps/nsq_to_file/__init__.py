"""``nsq_to_file``: archive topics to files, durably (Go: apps/nsq_to_file).

Flags, defaults, file names and error texts are Go's (``nsq_to_file --help``). Each topic gets
a consumer and a :class:`~.file_logger.FileLogger`; a message is FINished only once the file
holding it has been fsynced. SIGHUP closes and reopens the files (for logrotate), SIGINT and
SIGTERM sync, close and exit.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence

from ...internal import lg
from ...internal.flags import UsageError, resolve
from .. import common
from .._go_config import ClientConfig, ConfigError
from .options import Options, validate
from .topic_discoverer import PROGRAM, TopicDiscoverer

__all__ = ["Options", "main", "run"]


def lenient_config(values: Sequence[str]) -> ClientConfig:
    """Go's nsq_to_file ignores a ``--consumer-opt`` that go-nsq refuses (it drops the error
    of ``ConfigFlag.Set``); so do we, after saying so."""
    config = ClientConfig()
    for value in values:
        try:
            config.set_flag(value)
        except ConfigError as exc:
            common.go_log(f"ignoring --consumer-opt {value}: {exc}")
    return config


async def run(opts: Options) -> int:
    level = validate(opts)
    logger = lg.Logger(opts.log_prefix, level)
    config = lenient_config(opts.consumer_opt)
    stop = common.stop_event()
    discoverer = TopicDiscoverer(opts, config, logger)
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, discoverer.hup)
    await discoverer.run(stop)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        _, parsed = resolve(Options, args)
    except UsageError:
        pass  # run_app prints it with the usage
    else:
        if parsed.positional and not parsed.show_help:
            common.go_log(f"unknown arguments: [{' '.join(parsed.positional)}]")
            return 1
    return common.run_app(PROGRAM, Options, args, run, check_client_opts=False)
