"""nsqlookupd: the directory service nsqd registers with and consumers query.

A drop-in replacement for Go's ``nsqlookupd`` 1.3: same flags and config keys, the same V1 TCP
protocol for nsqd, the same HTTP API. :class:`NSQLookupd` runs it inside any asyncio program.
"""

from .nsqlookupd import ListenError, NSQLookupd, version_string
from .options import Options
from .registration_db import PeerInfo, Producer, Registration, RegistrationDB

__all__ = [
    "ListenError",
    "NSQLookupd",
    "Options",
    "PeerInfo",
    "Producer",
    "Registration",
    "RegistrationDB",
    "version_string",
]
