"""``nsq_to_nsq``: copy topics to a destination nsqd (Go: apps/nsq_to_nsq).

Each message is re-published to ``--destination-topic`` (default: the topic it came from) on
one of the ``--destination-nsqd-tcp-address`` chosen by ``--mode`` (``hostpool``, the default,
and ``epsilon-greedy`` prefer healthy destinations; ``round-robin`` rotates; any other value
means round-robin, as in Go). The source message is FINished only once the destination nsqd
answered OK; a failed publish REQueues it with backoff.

JSON filters (as Go): with ``--require-json-field`` or ``--whitelist-json-field`` set, a
message that is not a JSON object is logged and dropped; a message without the required field
is dropped (and backs the consumer off when ``--require-json-value`` is set); the value matches
as a string or, when the flag parses as a number, numerically; whitelisting re-encodes the
object with only the listed fields, in Go's JSON form. ``--status-every`` logs publish timings
every N messages (per destination when there are several, and in aggregate).
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..client import Consumer, Message, Producer
from ..internal.flags import BOOL, INT, STR, STR_LIST, option
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from ._gojson import GoJSONError, marshal, unmarshal_object
from ._hostpool import EpsilonGreedyHostPool, HostPool, HostPoolResponse
from ._timer_metrics import TimerMetrics
from .common import (
    ClientConfig,
    ConsumerFlags,
    FatalError,
    ProducerFlags,
    client_config,
    go_log,
    make_consumer,
    run_app,
    start_consumer,
    stop_event,
    user_agent,
)

PROGRAM = "nsq_to_nsq"
_GO_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)", re.I)


@dataclass
class Options(ConsumerFlags, ProducerFlags):
    version: bool = option("version", False, BOOL, "print version string")
    topic: list[str] = option("topic", [], STR_LIST, "nsq topic (may be given multiple times)")
    channel: str = option("channel", "nsq_to_nsq", STR, "nsq channel")
    destination_topic: str = option(
        "destination-topic",
        "",
        STR,
        "use this destination topic for all consumed topics (default is consumed topic name)",
    )
    destination_nsqd_tcp_address: list[str] = option(
        "destination-nsqd-tcp-address",
        [],
        STR_LIST,
        "destination nsqd TCP address (may be given multiple times)",
    )
    status_every: int = option(
        "status-every",
        250,
        INT,
        "the # of requests between logging status (per destination), 0 disables",
    )
    mode: str = option(
        "mode",
        "hostpool",
        STR,
        "the upstream request mode options: round-robin, hostpool (default), epsilon-greedy",
    )
    require_json_field: str = option(
        "require-json-field",
        "",
        STR,
        "for JSON messages: only pass messages that contain this field",
    )
    require_json_value: str = option(
        "require-json-value",
        "",
        STR,
        "for JSON messages: only pass messages in which the required field has this value",
    )
    whitelist_json_field: list[str] = option(
        "whitelist-json-field",
        [],
        STR_LIST,
        "for JSON messages: pass this field (may be given multiple times)",
    )


# ---------------------------------------------------------------------- JSON filtering


class JSONFilter:
    """Go's shouldPassMessage and filterMessage."""

    def __init__(self, field: str, value: str, whitelist: Sequence[str]) -> None:
        self.field = field
        self.value = value
        self.whitelist = list(whitelist)
        self.number: float | None = None
        if value and _GO_FLOAT.fullmatch(value):
            self.number = float(value)

    @property
    def active(self) -> bool:
        return bool(self.field or self.whitelist)

    def should_pass(self, js: dict[str, Any]) -> tuple[bool, bool]:
        """(pass, backoff) for a decoded message."""
        if not self.field:
            return True, False
        if self.field not in js:
            if self.value:
                go_log("ERROR: missing field to check required value")
                return False, True
            return False, False
        if not self.value:
            return True, False
        found = js[self.field]
        if isinstance(found, str):
            return found == self.value, False
        if self.number is not None:
            return isinstance(found, float) and found == self.number, False
        return False, False  # neither a plain string nor a number to compare with

    def filter(self, js: dict[str, Any], raw: bytes) -> bytes:
        if not self.whitelist:
            return raw
        kept: dict[str, Any] = {}
        for key in self.whitelist:
            if key in js:
                value = js[key]
                # Go prints an integral float64 as an int64 (when it fits one)
                if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
                    value = int(value)
                kept[key] = value
        return marshal(kept)


# ---------------------------------------------------------------------- publishing


class Publisher:
    """Chooses a destination, publishes, FINs or REQs the source message, records timings."""

    def __init__(self, opts: Options, producers: dict[str, Producer]) -> None:
        self.producers = producers
        self.addresses = list(producers)
        self.round_robin = opts.mode not in ("hostpool", "epsilon-greedy")
        self.pool: HostPool = (
            EpsilonGreedyHostPool(self.addresses)
            if opts.mode == "epsilon-greedy"
            else HostPool(self.addresses)
        )
        self.counter = 0
        self.filter = JSONFilter(
            opts.require_json_field, opts.require_json_value, opts.whitelist_json_field
        )
        if len(self.addresses) == 1:  # one destination: its own line would repeat aggregate's
            self.per_address = {self.addresses[0]: TimerMetrics(0, "", go_log)}
        else:
            self.per_address = {
                a: TimerMetrics(opts.status_every, f"[{a}]:", go_log) for a in self.addresses
            }
        self.aggregate = TimerMetrics(opts.status_every, "[aggregate]:", go_log)

    async def handle(self, message: Message, destination_topic: str) -> bool:
        body = message.body
        if self.filter.active:
            try:
                js = unmarshal_object(body)
            except GoJSONError:
                go_log(f"ERROR: Unable to decode json: {body.decode('utf-8', 'replace')}")
                return True
            passed, backoff = self.filter.should_pass(js)
            if not passed:
                return not backoff  # False: REQueue with backoff
            body = self.filter.filter(js, body)
        started = time.monotonic()
        response: HostPoolResponse | None = None
        if self.round_robin:
            self.counter += 1
            address = self.addresses[self.counter % len(self.addresses)]
        else:
            response = self.pool.get()
            address = response.host
        message.disable_auto_response()
        try:
            await self.producers[address].publish(destination_topic, body)
        except Exception as exc:
            if response is not None:
                response.mark(exc)
            message.requeue()
        else:
            if response is not None:
                response.mark(None)
            message.finish()
        self.per_address[address].status(started)
        self.aggregate.status(started)
        return True


def _check(opts: Options) -> None:
    if not opts.topic or not opts.channel:
        raise FatalError("--topic and --channel are required")
    if not all(is_valid_topic_name(t) for t in opts.topic):
        raise FatalError("--topic is invalid")
    if opts.destination_topic and not is_valid_topic_name(opts.destination_topic):
        raise FatalError("--destination-topic is invalid")
    if not is_valid_channel_name(opts.channel):
        raise FatalError("--channel is invalid")
    opts.check_sources()
    if not opts.destination_nsqd_tcp_address:
        raise FatalError("--destination-nsqd-tcp-address required")


def _producers(opts: Options, config: ClientConfig) -> dict[str, Producer]:
    try:
        config.validate()
        kwargs = config.producer_options(user_agent(PROGRAM))
        return {a: Producer(a, **kwargs) for a in dict.fromkeys(opts.destination_nsqd_tcp_address)}
    except ValueError as exc:
        raise FatalError(f"failed creating producer {exc}") from None


async def nsq_to_nsq(opts: Options) -> int:
    _check(opts)
    consumer_config = client_config(opts.consumer_opt)
    producer_config = client_config(opts.producer_opt, "producer-opt")
    stop = stop_event()
    producers = _producers(opts, producer_config)
    publisher = Publisher(opts, producers)
    consumers: list[Consumer] = []
    try:
        for topic in opts.topic:
            destination = opts.destination_topic or topic

            async def handler(message: Message, destination: str = destination) -> bool:
                return await publisher.handle(message, destination)

            consumer = make_consumer(PROGRAM, topic, opts.channel, handler, opts, consumer_config)
            consumers.append(consumer)
        for consumer in consumers:
            await start_consumer(consumer)
        await stop.wait()
    finally:
        # in-flight copies finish first: their sources are FINed before the producers close
        await asyncio.gather(*(c.close() for c in consumers))
        await asyncio.gather(*(p.close() for p in producers.values()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_app(PROGRAM, Options, argv, nsq_to_nsq)


if __name__ == "__main__":
    sys.exit(main())
