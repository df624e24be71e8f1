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
from typing import TypeVar

from ..internal.api_client import ApiClient
from ..internal.clusterinfo import ClusterInfo, Result, UpstreamError
from ..internal.clusterinfo_types import Json
from ..internal.flags import BOOL, DURATION, STR, STR_LIST, UsageError, option
from ..protocol.errors import go_quote
from .common import FatalError, HTTPClientFlags, run_app

PROGRAM = "nsq_stat"
HEADER_EVERY = 25
T = TypeVar("T")


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


def report_line(new: Json, old: Json, interval: float) -> str:
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


def _value(result: Result[T]) -> T:
    """Go's nsq_stat treats a partial error as fatal too: any failure raises its text."""
    if result.failures:
        raise UpstreamError(result.error_text, result.failures)
    return result.value


async def topic_producers(ci: ClusterInfo, opts: Options) -> list[Json]:
    if opts.lookupd_http_address:
        found = await ci.get_lookupd_topic_producers(opts.topic, opts.lookupd_http_address)
    else:
        found = await ci.get_nsqd_topic_producers(opts.topic, opts.nsqd_http_address)
    return _value(found)


async def channel_totals(ci: ClusterInfo, producers: list[Json], opts: Options) -> Json | None:
    """The channel's stats summed over its producers; None if none of them has it. With no
    producers at all this fails as Go's does (``failed to query any nsqd: ``)."""
    found = await ci.get_nsqd_stats(producers, opts.topic, opts.channel, include_clients=False)
    return _value(found).channels.get(opts.channel)


# ---------------------------------------------------------------------- the loop


async def stat_loop(opts: Options) -> None:
    client = ApiClient(opts.http_client_connect_timeout, opts.http_client_request_timeout)
    async with ClusterInfo(client) as ci:
        previous: Json | None = None
        reports = opts.reports
        i = 0
        while reports is None or reports >= i:
            try:
                producers = await topic_producers(ci, opts)
            except UpstreamError as exc:
                raise FatalError(f"ERROR: failed to get topic producers - {exc}") from None
            try:
                current = await channel_totals(ci, producers, opts)
            except UpstreamError as exc:
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
