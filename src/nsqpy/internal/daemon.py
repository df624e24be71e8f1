"""What a daemon's command line does after its flags are parsed (Go: each app's ``main.go``
with ``svc.Run``): run on uvloop when installed, stop on SIGINT/SIGTERM, and turn a failure
to start into one FATAL line and exit status 1."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, Self

from .lg import Logger
from .net import ListenError


class Service(Protocol):
    """A daemon as a library: ``start`` opens its listeners, ``stop`` closes everything."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class ServiceContext:
    """``async with daemon:`` for a daemon used as a library: ``start()`` on entry, ``stop()``
    on exit, whatever ended the block."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


def run_event_loop(main: Coroutine[Any, Any, int], use_uvloop: bool = True) -> int:
    """Run ``main`` on uvloop when it is installed, else on asyncio's own loop. With
    ``use_uvloop`` False: on the loop of the current event loop policy (nsqd sets that policy
    itself, so that tests and benchmarks can keep asyncio's loop)."""
    if not use_uvloop:
        return asyncio.run(main)
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


#: Runs between the stop signal and ``stop()`` (nsqd's ``--drain-timeout``).
BeforeStop = Callable[[Service, StopSignals], Awaitable[None]]


async def serve(
    name: str,
    logger: Logger,
    build: Callable[[], Service],
    config_errors: tuple[type[Exception], ...] = (),
    *,
    start_errors: tuple[type[Exception], ...] = (),
    before_stop: BeforeStop | None = None,
) -> int:
    """Build the daemon, start it and serve until a stop signal; the exit status.

    ``config_errors`` raised by ``build`` and a :class:`ListenError` from ``start`` are
    logged as Go logs them (``failed to instantiate <name> - <error>``) and exit 1.
    ``start_errors`` already read as Go's whole fatal line (nsqd's): logged as they are, exit
    1; the service has cleaned up after itself. ``before_stop`` runs after the stop signal."""
    signals = StopSignals()
    try:
        service = build()
    except config_errors as exc:
        logger.fatal(f"failed to instantiate {name} - {exc}")
        return 1
    try:
        await service.start()
    except start_errors as exc:
        logger.fatal(str(exc))
        return 1
    except ListenError as exc:
        logger.fatal(f"failed to instantiate {name} - {exc}")
        await service.stop()
        return 1
    try:
        await signals.stopping.wait()
        if before_stop is not None:
            await before_stop(service, signals)
    finally:
        await service.stop()
    return 0


def run_until_stopped(main: Coroutine[Any, Any, int], use_uvloop: bool = True) -> int:
    """:func:`run_event_loop` for a daemon: a signal that comes before the handlers are
    installed (a KeyboardInterrupt) is a clean stop too."""
    try:
        return run_event_loop(main, use_uvloop)
    except KeyboardInterrupt:
        return 0
