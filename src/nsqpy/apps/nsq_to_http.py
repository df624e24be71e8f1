"""``nsq_to_http``: send each message of a topic to HTTP endpoints (Go: apps/nsq_to_http).

``--post URL`` sends the body as a POST (success: any 2xx); ``--get URL`` fills the one ``%s``
of the URL with the query-escaped body (success: exactly 200). A failed request fails the
message, which the consumer REQueues with backoff. With several endpoints ``--mode`` picks:
``hostpool`` (default; go-hostpool's pool: in turn, skipping failed hosts until their retry
time), ``epsilon-greedy`` (mostly the fastest healthy host), ``round-robin``; any other value
sends every message to every endpoint. ``--n`` requests run at once; ``--status-every`` logs
timing summaries in bitly/timer_metrics' format.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote_plus

import aiohttp
import yarl

from .. import NSQ_VERSION
from ..client import Message
from ..internal.flags import DURATION, FLOAT, INT, STR, STR_LIST, option
from . import common
from ._hostpool import EpsilonGreedyHostPool, HostPool
from ._timer_metrics import TimerMetrics

PROGRAM = "nsq_to_http"
USER_AGENT = f"nsq_to_http v{NSQ_VERSION}"
DEFAULT_CONTENT_TYPE = "application/octet-stream"

MODE_ALL, MODE_ROUND_ROBIN, MODE_HOST_POOL = 0, 1, 2

log = logging.getLogger("nsqpy.apps.nsq_to_http")  # go-nsq's shape on stderr (common)


@dataclass
class Options(common.ConsumerFlags, common.HTTPClientFlags):
    topic: str = option("topic", "", STR, "nsq topic")  # type: ignore[assignment]
    channel: str = option("channel", "nsq_to_http", STR, "nsq channel")
    n: int = option("n", 100, INT, "number of concurrent publishers")
    mode: str = option(
        "mode",
        "hostpool",
        STR,
        "the upstream request mode options: round-robin, hostpool (default), epsilon-greedy",
    )
    sample: float = option("sample", 1.0, FLOAT, "% of messages to publish (float b/w 0 -> 1)")
    http_client_request_timeout: float = option(
        "http-client-request-timeout", 20.0, DURATION, "timeout for HTTP request"
    )
    status_every: int = option(
        "status-every",
        250,
        INT,
        "the # of requests between logging status (per handler), 0 disables",
    )
    content_type: str = option(
        "content-type", DEFAULT_CONTENT_TYPE, STR, "the Content-Type used for POST requests"
    )
    post: list[str] = option(
        "post",
        [],
        STR_LIST,
        "HTTP address to make a POST request to.  data will be in the body "
        "(may be given multiple times)",
    )
    header: list[str] = option(
        "header", [], STR_LIST, "Custom header for HTTP requests (may be given multiple times)"
    )
    get: list[str] = option(
        "get",
        [],
        STR_LIST,
        "HTTP address to make a GET request to. '%s' will be printf replaced with data "
        "(may be given multiple times)",
    )


def parse_custom_headers(values: Sequence[str]) -> dict[str, str]:
    """``Key: Value`` strings (Go: parseCustomHeaders); ValueError for a malformed one."""
    headers: dict[str, str] = {}
    for text in values:
        key, sep, value = text.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"invalid header: {text!r}")
        headers[key] = value
    return headers


def validate(opts: Options) -> tuple[dict[str, str], int]:
    """Go's checks in Go's order and texts; the custom headers and the mode."""
    headers: dict[str, str] = {}
    if opts.header:
        try:
            headers = parse_custom_headers(opts.header)
        except ValueError:
            raise common.FatalError("--header value format should be 'key=value'") from None
    if not opts.topic or not opts.channel:
        raise common.FatalError("--topic and --channel are required")
    if opts.content_type != DEFAULT_CONTENT_TYPE:
        if not opts.post:
            raise common.FatalError("--content-type only used with --post")
        if not opts.content_type:
            raise common.FatalError("--content-type requires a value when used")
    opts.check_sources()
    if not opts.get and not opts.post:
        raise common.FatalError("--get or --post required")
    if opts.get and opts.post:
        raise common.FatalError("use --get or --post not both")
    for address in opts.get:
        if address.count("%s") != 1:
            raise common.FatalError("invalid GET address - must be a printf string")
    mode = {"round-robin": MODE_ROUND_ROBIN, "hostpool": MODE_HOST_POOL}.get(opts.mode, MODE_ALL)
    if opts.mode == "epsilon-greedy":
        mode = MODE_HOST_POOL
    if not 0.0 <= opts.sample <= 1.0:
        raise common.FatalError("ERROR: --sample must be between 0.0 and 1.0")
    if opts.n < 1:  # Go would start no handler and never deliver
        raise common.FatalError("--n must be > 0")
    return headers, mode


class RequestError(Exception):
    """A request that did not succeed; the message is REQueued."""


class Publisher:
    """Sends bodies to the endpoints (Go: PublishHandler with a Get/PostPublisher)."""

    def __init__(
        self,
        opts: Options,
        headers: dict[str, str],
        mode: int,
        session: aiohttp.ClientSession,
    ) -> None:
        self.opts = opts
        self.mode = mode
        self.session = session
        self.is_post = bool(opts.post)
        self.addresses = list(opts.post or opts.get)
        # the headers Go's net/http sends: ours, the custom ones, then its Accept-Encoding
        self.headers = {"User-Agent": USER_AGENT}
        if self.is_post:
            self.headers["Content-Type"] = opts.content_type
        self.headers.update(headers)
        if not any(key.lower() == "accept-encoding" for key in headers):
            self.headers["Accept-Encoding"] = "gzip"
        self.counter = 0
        self.pool: HostPool = (
            EpsilonGreedyHostPool(self.addresses)
            if opts.mode == "epsilon-greedy"
            else HostPool(self.addresses)
        )
        if len(self.addresses) == 1:  # one address: its own summary would repeat the aggregate
            self.per_address = {self.addresses[0]: TimerMetrics(0, "", common.go_log)}
        else:
            self.per_address = {
                a: TimerMetrics(opts.status_every, f"[{a}]:", common.go_log) for a in self.addresses
            }
        self.aggregate = TimerMetrics(opts.status_every, "[aggregate]:", common.go_log)
        self._slots = asyncio.Semaphore(opts.n)

    async def handle(self, message: Message) -> None:
        """The consumer's handler: FIN once delivered; REQ with backoff on a failure (as
        go-nsq does when a handler returns an error)."""
        if self.opts.sample < 1.0 and random.random() > self.opts.sample:
            return
        async with self._slots:
            try:
                await self._deliver(message.body)
            except RequestError as exc:
                log.error(
                    "[%s/%s] Handler returned error (%s) for msg %s",
                    self.opts.topic,
                    self.opts.channel,
                    exc,
                    message.id.decode(),
                )
                message.requeue()

    async def _deliver(self, body: bytes) -> None:
        start = time.monotonic()
        if self.mode == MODE_ALL:
            for address in self.addresses:
                began = time.monotonic()
                await self.publish(address, body)
                self.per_address[address].status(began)
        elif self.mode == MODE_ROUND_ROBIN:
            self.counter += 1
            address = self.addresses[self.counter % len(self.addresses)]
            await self.publish(address, body)
            self.per_address[address].status(start)
        else:
            choice = self.pool.get()
            try:
                await self.publish(choice.host, body)
            except RequestError as exc:
                choice.mark(exc)
                raise
            choice.mark(None)
            self.per_address[choice.host].status(start)
        self.aggregate.status(start)

    async def publish(self, address: str, body: bytes) -> None:
        if self.is_post:
            method, url, data = "POST", address, body
        else:
            method, url, data = "GET", address.replace("%s", go_query_escape(body), 1), None
        try:
            # sent as written (yarl would otherwise decode the %21 etc. that Go sends)
            target = yarl.URL(url, encoded=True)
            async with self.session.request(
                method, target, data=data, headers=self.headers, allow_redirects=True
            ) as resp:
                await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            # Go's url.Error: Post "<url>": dial tcp 127.0.0.1:1: connect: connection refused
            verb = method.capitalize()
            raise RequestError(f'{verb} "{url}": {common.describe_http_error(exc)}') from None
        ok = 200 <= status < 300 if self.is_post else status == 200
        if not ok:
            raise RequestError(f"got status code {status}")


def go_query_escape(body: bytes) -> str:
    """Go's ``url.QueryEscape``: all but ``A-Za-z0-9-_.~`` as ``%XX``, space as ``+``."""
    return quote_plus(body, safe="")


async def run(opts: Options) -> int:
    headers, mode = validate(opts)
    config = common.client_config(opts.consumer_opt)
    timeout = aiohttp.ClientTimeout(
        total=opts.http_client_request_timeout, sock_connect=opts.http_client_connect_timeout
    )
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        timeout=timeout,
        connector=connector,
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
    ) as session:
        publisher = Publisher(opts, headers, mode, session)
        consumer = common.make_consumer(
            PROGRAM, opts.topic, opts.channel, publisher.handle, opts, config
        )
        stop = common.stop_event()
        await common.start_consumer(consumer)
        await stop.wait()
        await consumer.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_app(PROGRAM, Options, argv, run)


if __name__ == "__main__":
    sys.exit(main())
