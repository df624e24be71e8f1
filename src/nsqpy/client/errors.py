"""Exceptions raised by the client."""

from __future__ import annotations

import os
import socket

import aiohttp

from ..protocol.errors import NON_FATAL_CODES


class NSQError(Exception):
    """Base class for every error the client raises."""


class ConnectionClosedError(NSQError, ConnectionError):
    """The connection ended before the answer to a command arrived."""


class IdentifyError(NSQError):
    """IDENTIFY, a negotiated upgrade (TLS, snappy, deflate) or AUTH failed."""


class ServerError(NSQError):
    """An error frame from nsqd: ``<code> <description>``, e.g. ``E_BAD_TOPIC ...``."""

    def __init__(self, data: bytes) -> None:
        text = data.decode("utf-8", errors="replace")
        code, _, desc = text.partition(" ")
        super().__init__(text)
        self.code = code
        self.desc = desc

    @property
    def fatal(self) -> bool:
        """nsqd closes the connection after every error except E_FIN/REQ/TOUCH_FAILED."""
        return self.code not in NON_FATAL_CODES


class NSQDConnectError(NSQError):
    """Connecting or subscribing to the nsqd at ``address`` failed; the cause is chained."""

    def __init__(self, address: str, cause: BaseException) -> None:
        super().__init__(f"({address}) error connecting to nsqd - {cause}")
        self.address = address
        self.__cause__ = cause


class NoConnectionsError(NSQError):
    """A producer could reach none of its nsqd."""


class ClosedError(NSQError):
    """The producer or consumer was closed."""


class HTTPPublishError(NSQError):
    """nsqd's HTTP API refused a publish; ``status`` and nsqd's ``message`` say why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def go_dial_error(address: str, exc: BaseException) -> str:
    """A failed dial in Go's words (``dial tcp <address>: connect: connection refused``), so
    logs and fatal errors read as Go's tools' do rather than as Python exception reprs."""
    if isinstance(exc, TimeoutError):
        return f"dial tcp {address}: i/o timeout"
    if isinstance(exc, socket.gaierror):
        host = address.rpartition(":")[0].strip("[]")
        return f"dial tcp: lookup {host}: {_lower_first(exc.strerror or str(exc))}"
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"dial tcp {address}: connect: {_lower_first(os.strerror(exc.errno))}"
    return f"dial tcp {address}: {exc}"


def go_http_error(exc: BaseException) -> str:
    """An HTTP client failure in the words of Go's net/http (what follows ``Get "<url>": ``)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        host = f"[{exc.host}]" if ":" in exc.host else exc.host
        return go_dial_error(f"{host}:{exc.port}", exc.os_error)
    if isinstance(exc, TimeoutError):
        return "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    return str(exc) or type(exc).__name__


def _lower_first(text: str) -> str:
    """Go's syscall error texts are the C library's, lower-cased (``connection refused``)."""
    return text[:1].lower() + text[1:]
