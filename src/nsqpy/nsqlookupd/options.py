"""nsqlookupd options: the single source for flags, config-file keys and defaults.

Go: ``nsqlookupd/options.go`` and ``apps/nsqlookupd/main.go``. Config-file keys are the flag names
with ``-`` replaced by ``_`` (``tcp_address``, ``inactive_producer_timeout``, ...).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from ..internal.flags import DURATION, STR, CommonOptions, option

HOSTNAME = socket.gethostname()


@dataclass
class Options(CommonOptions):
    log_prefix: str = option("log-prefix", "[nsqlookupd] ", STR, "log message prefix")

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
