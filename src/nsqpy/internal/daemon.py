"""What a daemon's command line does after its flags are parsed (Go: each app's ``main.go``
with ``svc.Run``): run on uvloop when installed, stop on SIGINT/SIGTERM, and turn a failure
to start into one FATAL line and exit status 1."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from .lg import Logger
from .net import ListenError


class Service(Protocol):
    """A daemon as a library: ``start`` opens its listeners, ``stop`` closes everything."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def run_event_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` on uvloop when it is installed, else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:  # uvloop is optional (e.g. Windows): the stdlib loop works too
        return asyncio.run(main)
    return uvloop.run(main)


class StopSignals:
    """SIGINT and SIGTERM handlers on the running loop that record the signal and set
    :attr:`stopping`. Install them before starting: a signal that comes while starting up
    must still stop cleanly."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.received: list[signal.Signals] = []
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        self.received.append(sig)
        self.stopping.set()


async def serve(
    name: str,
    logger: Logger,
    build: Callable[[], Service],
    config_errors: tuple[type[Exception], ...] = (),
) -> int:
    """Build the daemon, start it and serve until a stop signal; the exit status.

    ``config_errors`` raised by ``build`` and a :class:`ListenError` from ``start`` are
    logged as Go logs them (``failed to instantiate <name> - <error>``) and exit 1."""
    signals = StopSignals()
    try:
        service = build()
    except config_errors as exc:
        logger.fatal(f"failed to instantiate {name} - {exc}")
        return 1
    try:
        await service.start()
    except ListenError as exc:
        logger.fatal(f"failed to instantiate {name} - {exc}")
        await service.stop()
        return 1
    try:
        await signals.stopping.wait()
    finally:
        await service.stop()
    return 0


def run_until_stopped(main: Coroutine[Any, Any, int]) -> int:
    """:func:`run_event_loop` for a daemon: a signal that comes before the handlers are
    installed (a KeyboardInterrupt) is a clean stop too."""
    try:
        return run_event_loop(main)
    except KeyboardInterrupt:
        return 0
