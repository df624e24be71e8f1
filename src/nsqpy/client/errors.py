"""Exceptions raised by the client."""

from __future__ import annotations

from ..internal.api_client import go_dial_error, go_http_error
from ..protocol.errors import NON_FATAL_CODES

__all__ = [
    "ClosedError",
    "ConnectionClosedError",
    "HTTPPublishError",
    "IdentifyError",
    "NSQDConnectError",
    "NSQError",
    "NoConnectionsError",
    "ServerError",
    "go_dial_error",
    "go_http_error",
]


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
