"""``nsq_stat``: poll a topic/channel's stats on all its nsqd and print totals (Go: apps/nsq_stat).

Every ``--interval`` it finds the producers of ``--topic`` (through nsqlookupd's ``/lookup`` or
each ``--nsqd-http-address``'s ``/stats``), sums the channel's stats over them and prints one
line in Go's columns; a header every 25 reports::

    ------rate------+----------------depth----------------+--------------metadata---------------
    ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients
         50      50 |       0       0       0     0     0 |       0       0          300       1

``ingress`` is new messages per second, ``egress`` those that also left the depth. The first
poll is the baseline (no line); ``--count N`` prints N lines and exits.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..internal.api_client import ApiClient, api_url
from ..internal.flags import BOOL, DURATION, STR, STR_LIST, UsageError, option
from ..internal.net import join_host_port
from ..protocol.errors import go_quote
from .common import FatalError, HTTPClientFlags, run_app

PROGRAM = "nsq_stat"
HEADER_EVERY = 25
#: the summed fields of a channel, in the order of a report line's numbers
_COUNTERS = (
    "depth",
    "memory_depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "requeue_count",
    "timeout_count",
    "message_count",
    "client_count",
)


@dataclass
class Options(HTTPClientFlags):
    version: bool = option("version", False, BOOL, "print version")
    topic: str = option("topic", "", STR, "NSQ topic")
    channel: str = option("channel", "", STR, "NSQ channel")
    interval: float = option(
        "interval", 2.0, DURATION, "duration of time between polling/printing output"
    )
    count: str = option("count", "", STR, "number of reports")
    nsqd_http_address: list[str] = option(
        "nsqd-http-address", [], STR_LIST, "nsqd HTTP address (may be given multiple times)"
    )
    lookupd_http_address: list[str] = option(
        "lookupd-http-address", [], STR_LIST, "lookupd HTTP address (may be given multiple times)"
    )

    def check_flags(self) -> None:
        """``--count`` is Go's ``numValue``: an int32, parsed when given."""
        if self.count and not re.fullmatch(r"[+-]?[0-9]+", self.count):
            raise UsageError(
                f"invalid value {go_quote(self.count)} for flag -count: "
                f"strconv.ParseInt: parsing {go_quote(self.count)}: invalid syntax"
            )
        if self.count and not -(2**31) <= int(self.count) < 2**31:
            raise UsageError(
                f"invalid value {go_quote(self.count)} for flag -count: "
                f"strconv.ParseInt: parsing {go_quote(self.count)}: value out of range"
            )

    @property
    def reports(self) -> int | None:
        return int(self.count) if self.count else None


# ---------------------------------------------------------------------- formatting


def header() -> str:
    rule = (
        "------rate------"
        "+----------------depth----------------"
        "+--------------metadata---------------"
    )
    names = (
        f"{'ingress':>7} {'egress':>7} | {'total':>7} {'mem':>7} {'disk':>7} {'inflt':>5} "
        f"{'def':>5} | {'req':>7} {'t-o':>7} {'msgs':>12} {'clients':>7}"
    )
    return f"{rule}\n{names}\n"


def report_line(new: dict[str, int], old: dict[str, int], interval: float) -> str:
    """One report: Go's ``%7d %7d | %7d %7d %7d %5d %5d | %7d %7d %12d %7d``."""
    received = new["message_count"] - old["message_count"]
    ingress = int(received / interval)
    egress = int((received - (new["depth"] - old["depth"])) / interval)
    return (
        f"{ingress:7d} {egress:7d} | {new['depth']:7d} {new['memory_depth']:7d} "
        f"{new['backend_depth']:7d} {new['in_flight_count']:5d} {new['deferred_count']:5d} | "
        f"{new['requeue_count']:7d} {new['timeout_count']:7d} {new['message_count']:12d} "
        f"{new['client_count']:7d}\n"
    )


# ---------------------------------------------------------------------- cluster queries


class StatsClient:
    """The parts of Go's clusterinfo nsq_stat uses, with its error texts."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    async def get_v1(self, url: str) -> Any:
        return await self.client.get_v1(url)

    async def _all(self, urls: list[str]) -> list[Any]:
        return await asyncio.gather(*(self.get_v1(u) for u in urls), return_exceptions=True)

    async def lookupd_topic_producers(self, topic: str, lookupds: list[str]) -> list[str]:
        urls = [api_url(a, "lookup", topic=topic) for a in lookupds]
        producers: list[str] = []
        errors: list[str] = []
        for result in await self._all(urls):
            if isinstance(result, BaseException):
                errors.append(str(result))
                continue
            for p in (result or {}).get("producers") or ():
                address = join_host_port(p["broadcast_address"], p["http_port"])
                if address not in producers:
                    producers.append(address)
        if errors and len(errors) == len(lookupds):
            raise RuntimeError("failed to query any nsqlookupd: " + "\n".join(errors))
        if errors:
            raise RuntimeError("\n".join(errors))
        return producers

    async def nsqd_topic_producers(self, topic: str, nsqds: list[str]) -> list[str]:
        results = await asyncio.gather(
            *(self._nsqd_producer(a, topic) for a in nsqds), return_exceptions=True
        )
        errors = [str(r) for r in results if isinstance(r, BaseException)]
        if errors and len(errors) == len(nsqds):
            raise RuntimeError("failed to query any nsqd: " + "\n".join(errors))
        if errors:
            raise RuntimeError("\n".join(errors))
        return [r for r in results if isinstance(r, str)]

    async def _nsqd_producer(self, address: str, topic: str) -> str | None:
        url = api_url(address, "stats", format="json", topic=topic, include_clients="false")
        stats = await self.get_v1(url)
        if not any(t.get("topic_name") == topic for t in stats.get("topics") or ()):
            return None
        info = await self.get_v1(api_url(address, "info"))
        host, port = info.get("broadcast_address"), info.get("http_port")
        if not host:  # an old nsqd: use the address we were given
            host, _, port_text = address.rpartition(":")
            host, port = host.strip("[]"), int(port_text)
        return join_host_port(host, port)

    async def channel_stats(
        self, producers: list[str], topic: str, channel: str
    ) -> dict[str, int] | None:
        params = {"format": "json", "topic": topic, "channel": channel, "include_clients": "false"}
        results = await self._all([api_url(p, "stats", **params) for p in producers])
        errors = [str(r) for r in results if isinstance(r, BaseException)]
        if len(errors) == len(producers):  # with no producers at all, as Go: an empty list
            raise RuntimeError("failed to query any nsqd: " + "\n".join(errors))
        total: dict[str, int] | None = None
        for result in results:
            if isinstance(result, BaseException):
                continue
            for t in result.get("topics") or ():
                if t.get("topic_name") != topic:
                    continue
                for c in t.get("channels") or ():
                    if c.get("channel_name") != channel:
                        continue
                    c = dict(c, memory_depth=c["depth"] - c["backend_depth"])
                    total = total or dict.fromkeys(_COUNTERS, 0)
                    for key in _COUNTERS:
                        total[key] += int(c.get(key) or 0)
        if errors:
            raise RuntimeError("\n".join(errors))
        return total


# ---------------------------------------------------------------------- the loop


async def stat_loop(opts: Options) -> None:
    api = ApiClient(opts.http_client_connect_timeout, opts.http_client_request_timeout)
    try:
        client = StatsClient(api)
        previous: dict[str, int] | None = None
        reports = opts.reports
        i = 0
        while reports is None or reports >= i:
            try:
                if opts.lookupd_http_address:
                    producers = await client.lookupd_topic_producers(
                        opts.topic, opts.lookupd_http_address
                    )
                else:
                    producers = await client.nsqd_topic_producers(
                        opts.topic, opts.nsqd_http_address
                    )
            except RuntimeError as exc:
                raise FatalError(f"ERROR: failed to get topic producers - {exc}") from None
            try:
                current = await client.channel_stats(producers, opts.topic, opts.channel)
            except RuntimeError as exc:
                raise FatalError(f"ERROR: failed to get nsqd stats - {exc}") from None
            if current is None:
                raise FatalError(
                    f"ERROR: failed to find channel({opts.channel}) in stats metadata "
                    f"for topic({opts.topic})"
                )
            out = header() if i % HEADER_EVERY == 0 else ""
            if previous is not None:
                out += report_line(current, previous, opts.interval)
            if out:
                sys.stdout.write(out)
                sys.stdout.flush()
            previous = current
            await asyncio.sleep(opts.interval)
            i += 1
    finally:
        await api.close()


def _check(opts: Options) -> None:
    if not opts.topic or not opts.channel:
        raise FatalError("--topic and --channel are required")
    if opts.interval <= 0:
        raise FatalError("--interval should be positive")
    opts.check_http_client_timeouts()
    if opts.reports is not None and opts.reports <= 0:
        raise FatalError("--count should be positive")
    if not opts.nsqd_http_address and not opts.lookupd_http_address:
        raise FatalError("--nsqd-http-address or --lookupd-http-address required")
    if opts.nsqd_http_address and opts.lookupd_http_address:
        raise FatalError("use --nsqd-http-address or --lookupd-http-address not both")
    if any(a.startswith("http") for a in opts.nsqd_http_address):
        raise FatalError("--nsqd-http-address error - address should not contain scheme")
    if any(a.startswith("http") for a in opts.lookupd_http_address):
        raise FatalError("--lookupd-http-address error - address should not contain scheme")


async def nsq_stat(opts: Options) -> int:
    _check(opts)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    polling = asyncio.ensure_future(stat_loop(opts))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([polling, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not polling.done():
        polling.cancel()
        await asyncio.gather(polling, return_exceptions=True)
        return 0
    polling.result()  # a FatalError goes up to run_app
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_app(PROGRAM, Options, argv, nsq_stat)


if __name__ == "__main__":
    sys.exit(main())
