"""Run pynsq's Tornado clients on the test's own asyncio loop.

With Tornado >= 5, ``IOLoop.current()`` inside a running asyncio loop wraps that loop, so a
pynsq ``Reader``/``Writer`` made inside an ``async def`` test runs alongside the test's
awaits. The harness remembers what it made and closes it all when the test ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import nsq

from nsqpy.testing import DaemonProcess

from ..raw_v2 import wait_for_async
from .helpers import tcp_address

# pynsq reconnects on close after ``reconnect_interval``; keep that past any test's end.
NO_RECONNECT = 3600.0


class PynsqClients:
    def __init__(self) -> None:
        self.writers: list[Any] = []
        self.readers: list[Any] = []

    async def writer(self, nsqd: DaemonProcess, **kwargs: Any) -> Any:
        """A connected ``nsq.Writer`` (its IDENTIFY answered)."""
        writer = nsq.Writer([tcp_address(nsqd)], reconnect_interval=NO_RECONNECT, **kwargs)
        self.writers.append(writer)
        await wait_for_async(
            lambda: dict(writer.conns), bool, what="pynsq Writer to connect", timeout=5.0
        )
        return writer

    def reader(
        self,
        nsqd: DaemonProcess | None,
        topic: str,
        channel: str,
        handler: Callable[[Any], Any],
        **kwargs: Any,
    ) -> Any:
        """An ``nsq.Reader``; it connects and subscribes once the test next awaits.

        With ``nsqd=None`` it finds its nsqd through ``lookupd_http_addresses`` alone.
        """
        if nsqd is not None:
            kwargs["nsqd_tcp_addresses"] = [tcp_address(nsqd)]
        reader = nsq.Reader(topic=topic, channel=channel, message_handler=handler, **kwargs)
        self.readers.append(reader)
        return reader

    def close(self) -> None:
        for reader in self.readers:
            if reader.redist_periodic is not None:  # its _run callback has happened
                reader.close()
        for writer in self.writers:
            for conn in list(writer.conns.values()):
                conn.close()


async def answer(send: Callable[..., Any], timeout: float = 5.0) -> Any:
    """Call a pynsq Writer method with a ``callback=`` and await what nsqd answered.

    ``send`` is e.g. ``functools.partial(writer.pub, topic, body)``; the answer is ``b"OK"`` or
    an ``nsq.Error``.
    """
    answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def on_answer(conn: Any, data: Any) -> None:
        if not answered.done():
            answered.set_result(data)

    send(callback=on_answer)
    return await asyncio.wait_for(answered, timeout)
