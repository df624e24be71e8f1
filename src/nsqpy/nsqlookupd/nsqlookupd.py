"""The nsqlookupd daemon as a library (Go: nsqlookupd/nsqlookupd.go).

    lookupd = NSQLookupd(Options(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0"))
    await lookupd.start()
    ...  # lookupd.real_tcp_address, lookupd.real_http_address, lookupd.db
    await lookupd.stop()

Time is read through ``clock`` (seconds, wall clock as ``time.time``) so tests can drive
inactivity and tombstone expiry.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

from aiohttp import web

from .. import version_line
from ..internal import lg
from ..internal.daemon import ServiceContext
from ..internal.http_server import start_app
from ..internal.net import (
    Admission,
    ListenError,
    RefusedConnection,
    format_address,
    listen_socket,
    log_open_files_limit,
)
from .http import make_app
from .options import Options
from .registration_db import RegistrationDB
from .tcp import LookupProtocolV1


def version_string(app: str = "nsqlookupd") -> str:
    """``nsqlookupd v1.3.0 (built w/python3.11.7)``: Go's ``version.String`` with our runtime."""
    return version_line(app)


class NSQLookupd(ServiceContext):
    """One nsqlookupd: a registration DB with its TCP (nsqd) and HTTP (clients) listeners."""

    def __init__(
        self,
        options: Options | None = None,
        *,
        clock: Callable[[], float] = time.time,
        logger: lg.Logger | None = None,
    ) -> None:
        self.options = options if options is not None else Options()
        self.clock = clock
        self.logger = logger or lg.Logger(self.options.log_prefix, self.options.log_level)
        self.hostname = socket.gethostname()
        self.db = RegistrationDB()
        self.tcp_clients: set[LookupProtocolV1] = set()
        self.real_tcp_address: tuple[str, int] = ("", 0)
        self.real_http_address: tuple[str, int] = ("", 0)
        self._tcp_server: asyncio.Server | None = None
        self._http_runner: web.AppRunner | None = None
        self._tcp_text = ""
        self._http_text = ""
        self._admission: Admission | None = None

    async def start(self) -> None:
        """Open both listeners (raising :class:`ListenError`) and start serving."""
        self.logger.info(version_string())
        log_open_files_limit(self.logger)  # as Go's runtime: soft limit = hard limit
        self._admission = Admission(self.logger)
        tcp_sock = listen_socket(self.options.tcp_address)
        try:
            http_sock = listen_socket(self.options.http_address)
        except ListenError:
            tcp_sock.close()
            raise
        self.real_tcp_address = tcp_sock.getsockname()[:2]
        self.real_http_address = http_sock.getsockname()[:2]
        self._tcp_text = format_address(self.real_tcp_address)
        self._http_text = format_address(self.real_http_address)

        loop = asyncio.get_running_loop()
        # the loop would re-listen with a backlog of 100: keep Go's somaxconn
        self._tcp_server = await loop.create_server(
            self._new_peer, sock=tcp_sock, backlog=socket.SOMAXCONN
        )
        self.logger.info(f"TCP: listening on {self._tcp_text}")

        self._http_runner = await start_app(
            make_app(self), http_sock, self.logger, shutdown_timeout=1.0
        )
        self.logger.info(f"HTTP: listening on {self._http_text}")

    def _new_peer(self) -> LookupProtocolV1 | RefusedConnection:
        """An nsqd (or a client) connecting, unless the last descriptors are reserved."""
        if self._admission is not None and not self._admission.admit():
            return RefusedConnection()
        return LookupProtocolV1(self)

    async def stop(self) -> None:
        """Close the listeners and every nsqd connection (Go: ``Exit``)."""
        server, self._tcp_server = self._tcp_server, None
        if server is not None:
            self.logger.info(f"TCP: closing {self._tcp_text}")
            server.close()
            for client in list(self.tcp_clients):
                client.close()
            await server.wait_closed()
        runner, self._http_runner = self._http_runner, None
        if runner is not None:
            self.logger.info(f"HTTP: closing {self._http_text}")
            await runner.cleanup()
        admission, self._admission = self._admission, None
        if admission is not None:
            admission.close()
