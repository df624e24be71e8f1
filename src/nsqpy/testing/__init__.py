"""Start nsqpy daemons on free loopback ports, for our tests and for users' own tests.

    with start_nsqd(tmp_path) as nsqd:
        reader, writer = await asyncio.open_connection(*nsqd.tcp_address)

Daemons run as real processes (``python -m nsqpy.<daemon>``) listening on port 0; the real ports
are read from their Go-format ``<PROTO>: listening on <addr>`` log lines.
"""

from .process import DaemonProcess, preferred_port, start_nsqadmin, start_nsqd, start_nsqlookupd

__all__ = [
    "DaemonProcess",
    "preferred_port",
    "start_nsqadmin",
    "start_nsqd",
    "start_nsqlookupd",
]
