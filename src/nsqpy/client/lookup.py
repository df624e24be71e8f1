"""Discovering the nsqd that carry a topic by polling nsqlookupd's ``/lookup``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..internal.api_client import ApiClient, RequestError
from ..internal.net import join_host_port

__all__ = ["LookupdPoller", "lookup_url", "producer_addresses"]

log = logging.getLogger("nsqpy.client")


def lookup_url(address: str, topic: str) -> str:
    """``host:port`` or a URL to the ``/lookup?topic=...`` URL (go-nsq's buildLookupAddr)."""
    url = address if "://" in address else "http://" + address
    parts = urlsplit(url)
    if parts.port is None:
        raise ValueError(f"nsqlookupd address {address!r} has no port")
    path = parts.path if parts.path not in ("", "/") else "/lookup"
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "topic"]
    query.append(("topic", topic))
    return urlunsplit((parts.scheme, parts.netloc, path, urlencode(query), ""))


def producer_addresses(response: dict[str, Any]) -> list[str]:
    """``broadcast_address:tcp_port`` of each producer in a lookup response.

    Accepts the current format and the legacy ``{"status_code":..,"data":{...}}`` envelope.
    """
    data = response.get("data") if "producers" not in response else response
    if not isinstance(data, dict):
        return []
    addresses: list[str] = []
    for producer in data.get("producers") or ():
        host = producer.get("broadcast_address") or producer.get("address")
        port = producer.get("tcp_port")
        if host and isinstance(port, int):
            addresses.append(join_host_port(host, port))
    return addresses


class LookupdPoller:
    """Polls every nsqlookupd and reports the union of the producers they list.

    The first round runs at :meth:`start`; later rounds every ``interval`` seconds plus a random
    ``[0, jitter * interval)`` so that many consumers restarted together spread their queries.
    :meth:`trigger` asks for a round now (e.g. after losing an nsqd).
    """

    def __init__(
        self,
        addresses: Sequence[str],
        topic: str,
        on_discovered: Callable[[list[str]], None],
        *,
        interval: float = 60.0,
        jitter: float = 0.3,
        timeout: float = 60.0,
        rng: random.Random | None = None,
    ) -> None:
        if not 0.0 <= jitter <= 1.0:
            raise ValueError("lookupd_poll_jitter must be between 0 and 1")
        self.urls = [lookup_url(address, topic) for address in addresses]
        self.topic = topic
        self.on_discovered = on_discovered
        self.interval = interval
        self.jitter = jitter
        self.timeout = timeout
        self.rng = rng if rng is not None else random.Random()
        self.rounds = 0
        # A new connection and a fresh name lookup on every poll: a lookupd that moved to
        # another IP is asked at its new address (nsqio/nsq#1233), not through a kept-alive
        # connection or aiohttp's 10 s DNS cache.
        self._client = ApiClient(
            connect_timeout=None, request_timeout=timeout, dns_cache=False, keep_alive=False
        )
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def trigger(self) -> None:
        self._wake.set()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._client.close()

    async def _run(self) -> None:
        while True:
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception:  # keep polling whatever one round did
                log.exception("lookupd poll round failed")
            delay = self.interval + self.rng.random() * self.jitter * self.interval
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancel
            # that comes as the event is set, and this loop would outlive close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            self._wake.clear()

    async def poll(self) -> list[str]:
        """Query all nsqlookupd now; report and return the union of their producers."""
        results = await asyncio.gather(*(self._query(url) for url in self.urls))
        union = list(dict.fromkeys(_flatten(results)))
        self.rounds += 1
        self.on_discovered(union)
        return union

    async def _query(self, url: str) -> list[str]:
        log.debug("querying nsqlookupd %s", url)
        try:
            body = await self._client.get_v1(url)
        except RequestError as exc:
            if exc.status == 404:
                return []  # TOPIC_NOT_FOUND: nobody produces it (yet)
            if exc.status:
                log.error("error querying nsqlookupd (%s) - HTTP %d", url, exc.status)
            else:
                log.error("error querying nsqlookupd (%s) - %s", url, exc)
            return []
        return producer_addresses(body) if isinstance(body, dict) else []


def _flatten(lists: Iterable[list[str]]) -> Iterable[str]:
    for items in lists:
        yield from items
