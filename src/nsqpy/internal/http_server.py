"""Serving an aiohttp app on a listening socket, the same way in every daemon."""

from __future__ import annotations

import logging
import socket

from aiohttp import web
from aiohttp.log import server_logger

from . import lg


class _ToDebugLog(logging.Handler):
    """aiohttp's own reports (malformed requests, mostly) as one DEBUG line, no traceback: Go's
    net/http answers those with a 400 and logs nothing."""

    def __init__(self, logger: lg.Logger) -> None:
        super().__init__()
        self._logger = logger

    def emit(self, record: logging.LogRecord) -> None:
        self._logger.debug(f"HTTP: {record.getMessage()}")


def http_server_logger(logger: lg.Logger) -> logging.Logger:
    # made directly, not through getLogger(), so that it is not kept in logging's registry
    server_logger = logging.Logger("nsqpy.http_server")
    server_logger.propagate = False
    server_logger.addHandler(_ToDebugLog(logger))
    return server_logger


async def start_app(
    app: web.Application,
    sock: socket.socket,
    logger: lg.Logger | None = None,
    *,
    shutdown_timeout: float = 60.0,
    handler_cancellation: bool = False,
) -> web.AppRunner:
    """Serve ``app`` on ``sock`` (already listening); ``cleanup()`` the runner to stop.

    No access log (the router middleware writes Go's line) and no signal handlers (the daemon
    owns them). With ``logger``, aiohttp's own reports go to its DEBUG level."""
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=shutdown_timeout,
        handler_cancellation=handler_cancellation,
        logger=http_server_logger(logger) if logger is not None else server_logger,
    )
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner
