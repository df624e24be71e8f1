"""nsqlookupd options: the single source for flags, config-file keys and defaults.

Go: ``nsqlookupd/options.go`` and ``apps/nsqlookupd/main.go``. Config-file keys are the flag names
with ``-`` replaced by ``_`` (``tcp_address``, ``inactive_producer_timeout``, ...).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from ..internal import lg
from ..internal.flags import BOOL, DURATION, LOG_LEVEL, STR, option

HOSTNAME = socket.gethostname()


@dataclass
class Options:
    version: bool = option("version", False, BOOL, "print version string")
    config: str = option("config", "", STR, "path to config file")
    log_level: int = option(
        "log-level", lg.INFO, LOG_LEVEL, "set log verbosity: debug, info, warn, error, or fatal"
    )
    log_prefix: str = option("log-prefix", "[nsqlookupd] ", STR, "log message prefix")
    verbose: bool = option("verbose", False, BOOL, "[deprecated] has no effect, use --log-level")

    tcp_address: str = option(
        "tcp-address", "0.0.0.0:4160", STR, "<addr>:<port> to listen on for TCP clients"
    )
    http_address: str = option(
        "http-address", "0.0.0.0:4161", STR, "<addr>:<port> to listen on for HTTP clients"
    )
    broadcast_address: str = option(
        "broadcast-address",
        HOSTNAME,
        STR,
        "address of this lookupd node, (default to the OS hostname)",
    )

    inactive_producer_timeout: float = option(
        "inactive-producer-timeout",
        300.0,
        DURATION,
        "duration of time a producer will remain in the active list since its last ping",
    )
    tombstone_lifetime: float = option(
        "tombstone-lifetime",
        45.0,
        DURATION,
        "duration of time a producer will remain tombstoned if registration remains",
    )
