"""Query an NSQ cluster over HTTP (Go: ``internal/clusterinfo``), for nsqadmin and nsq_stat.

    async with ClusterInfo(ApiClient()) as ci:
        topics = await ci.get_lookupd_topics(["127.0.0.1:4161"])
        print(topics.value, topics.failures)

Every query fans out to all the given daemons at once. A call that reaches none of them raises
:class:`UpstreamError` (Go: a plain error, nsqadmin's 502); a call that reaches some returns a
:class:`Result` whose ``failures`` name each daemon that failed and why (Go's ``PartialErr``,
nsqadmin's ``WARNING:`` message). Values are the JSON-ready dicts Go's types marshal to, keys in
Go's order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from . import lg
from .api_client import ApiClient, RequestError, query_string
from .clusterinfo_types import (
    Inspection,
    Json,
    NodeStats,
    by_host,
    channel_add,
    http_address,
    inspected_messages,
    new_channel_aggregate,
    parse_version,
    producer_from_info,
    producer_from_lookupd,
    producer_sort_key,
    tcp_address,
    topic_from_nsqd,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Failure:
    """One daemon that did not answer as it should: its address and Go's error text."""

    address: str
    error: str

    def as_json(self) -> Json:
        return {"address": self.address, "error": self.error}


class UpstreamError(Exception):
    """No daemon of a fan-out answered (Go: ``failed to query any nsqd: ...``)."""

    def __init__(self, message: str, failures: Sequence[Failure] = ()) -> None:
        super().__init__(message)
        self.failures = list(failures)


@dataclass
class Result(Generic[T]):
    """A fan-out's value plus the daemons that failed (empty when all answered)."""

    value: T
    failures: list[Failure] = field(default_factory=list)

    @property
    def error_text(self) -> str:
        """Go's ``ErrList.Error()``: the errors joined by newlines."""
        return "\n".join(f.error for f in self.failures)


class ClusterInfo:
    """Go's ``ClusterInfo``: the queries nsqadmin makes, each fanned out concurrently."""

    def __init__(self, client: ApiClient | None = None, logger: lg.Logger | None = None) -> None:
        self.client = client if client is not None else ApiClient()
        self.logger = logger

    async def __aenter__(self) -> ClusterInfo:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.client.close()

    def _log(self, text: str) -> None:
        if self.logger is not None:
            self.logger.info(text)

    async def _fan_out(
        self,
        kind: str,
        addresses: Iterable[str],
        query: Callable[[str], Awaitable[T]],
    ) -> tuple[list[tuple[str, T]], list[Failure]]:
        """``query`` every address of a ``kind`` daemon at once: the (address, answer) pairs
        and the failures; :class:`UpstreamError` when none answered."""
        addresses = list(addresses)

        async def one(address: str) -> tuple[str, T | Failure]:
            try:
                return address, await query(address)
            except RequestError as exc:
                return address, Failure(address, str(exc))

        answers = await asyncio.gather(*(one(a) for a in addresses))
        values = [(a, v) for a, v in answers if not isinstance(v, Failure)]
        failures = [v for _, v in answers if isinstance(v, Failure)]
        if len(failures) == len(addresses):
            text = "\n".join(f.error for f in failures)
            raise UpstreamError(f"failed to query any {kind}: {text}", failures)
        return values, failures

    async def _get(self, url: str, daemon: str) -> Any:
        self._log(f"CI: querying {daemon} {url}")
        return await self.client.get_v1(url)

    # ------------------------------------------------------------------ lookupd queries

    async def get_lookupd_topics(self, lookupds: Sequence[str]) -> Result[list[str]]:
        async def query(addr: str) -> list[str]:
            data = await self._get(f"http://{addr}/topics", "nsqlookupd")
            return list(data.get("topics") or [])

        values, failures = await self._fan_out("nsqlookupd", lookupds, query)
        topics = sorted({t for _, ts in values for t in ts})
        return Result(topics, failures)

    async def get_lookupd_topic_channels(
        self, topic: str, lookupds: Sequence[str]
    ) -> Result[list[str]]:
        async def query(addr: str) -> list[str]:
            data = await self._get(
                f"http://{addr}/channels?{query_string(topic=topic)}", "nsqlookupd"
            )
            return list(data.get("channels") or [])

        values, failures = await self._fan_out("nsqlookupd", lookupds, query)
        return Result(sorted({c for _, cs in values for c in cs}), failures)

    async def get_lookupd_producers(self, lookupds: Sequence[str]) -> Result[list[Json]]:
        async def query(addr: str) -> list[Json]:
            data = await self._get(f"http://{addr}/nodes", "nsqlookupd")
            return [producer_from_lookupd(p) for p in data.get("producers") or []]

        values, failures = await self._fan_out("nsqlookupd", lookupds, query)
        by_tcp: dict[str, Json] = {}
        for addr, producers in values:
            for producer in producers:
                mine = by_tcp.setdefault(tcp_address(producer), producer)
                remote = producer["remote_address"] or "N/A"
                mine["remote_addresses"] = [*(mine["remote_addresses"] or []), f"{addr}/{remote}"]
        newest = max((parse_version(p["version"]) for p in by_tcp.values()), default=(0, 0, 0))
        for producer in by_tcp.values():
            producer["out_of_date"] = parse_version(producer["version"]) < newest
        return Result(sorted(by_tcp.values(), key=producer_sort_key), failures)

    async def get_lookupd_topic_producers(
        self, topic: str, lookupds: Sequence[str]
    ) -> Result[list[Json]]:
        async def query(addr: str) -> list[Json]:
            data = await self._get(
                f"http://{addr}/lookup?{query_string(topic=topic)}", "nsqlookupd"
            )
            return [producer_from_lookupd(p) for p in data.get("producers") or []]

        values, failures = await self._fan_out("nsqlookupd", lookupds, query)
        producers: dict[str, Json] = {}
        for _, found in values:
            for producer in found:
                producers.setdefault(http_address(producer), producer)
        return Result(list(producers.values()), failures)

    # ------------------------------------------------------------------ nsqd queries

    async def _nsqd_info(self, addr: str) -> Json:
        info = await self._get(f"http://{addr}/info", "nsqd")
        return info if isinstance(info, dict) else {}

    async def get_nsqd_topics(self, nsqds: Sequence[str]) -> Result[list[str]]:
        async def query(addr: str) -> list[str]:
            data = await self._get(f"http://{addr}/stats?format=json", "nsqd")
            return [t.get("topic_name", "") for t in data.get("topics") or []]

        values, failures = await self._fan_out("nsqd", nsqds, query)
        return Result(sorted({t for _, ts in values for t in ts}), failures)

    async def get_nsqd_producers(self, nsqds: Sequence[str]) -> Result[list[Json]]:
        async def query(addr: str) -> Json:
            info = await self._nsqd_info(addr)
            url = f"http://{addr}/stats?format=json&include_clients=false"
            stats = await self._get(url, "nsqd")
            topics = [t.get("topic_name", "") for t in stats.get("topics") or []]
            return producer_from_info(addr, info, topics)

        values, failures = await self._fan_out("nsqd", nsqds, query)
        return Result([p for _, p in values], failures)

    async def get_nsqd_topic_producers(
        self, topic: str, nsqds: Sequence[str]
    ) -> Result[list[Json]]:
        async def query(addr: str) -> Json | None:
            url = (
                f"http://{addr}/stats?format=json&{query_string(topic=topic)}&include_clients=false"
            )
            stats = await self._get(url, "nsqd")
            topics = [t.get("topic_name", "") for t in stats.get("topics") or []]
            if topic not in topics:
                return None
            info = await self._nsqd_info(addr)
            return producer_from_info(addr, info, topics)

        values, failures = await self._fan_out("nsqd", nsqds, query)
        return Result([p for _, p in values if p is not None], failures)

    async def get_nsqd_stats(
        self,
        producers: Sequence[Json],
        topic: str = "",
        channel: str = "",
        include_clients: bool = True,
    ) -> Result[NodeStats]:
        """Per-node topic stats (sorted by hostname) and channel aggregates keyed by channel
        name, or by ``topic:channel`` when no topic is selected."""
        by_address = {http_address(p): p for p in producers}

        async def query(addr: str) -> Json:
            url = f"http://{addr}/stats?format=json"
            if topic:
                url += f"&{query_string(topic=topic)}"
                if channel:
                    url += f"&{query_string(channel=channel)}"
            if not include_clients:
                url += "&include_clients=false"
            data = await self._get(url, "nsqd")
            return data if isinstance(data, dict) else {}

        values, failures = await self._fan_out("nsqd", list(by_address), query)
        now = time.time()
        topics: list[Json] = []
        channels: dict[str, Json] = {}
        replication: dict[str, Json] = {}
        for addr, data in values:
            hostname = by_address[addr]["hostname"]
            if isinstance(data.get("replication"), dict):
                replication[addr] = data["replication"]
            for raw in data.get("topics") or []:
                stats = topic_from_nsqd(raw, addr, hostname, now)
                if topic and stats["topic_name"] != topic:
                    continue
                topics.append(stats)
                for channel_stats in stats["channels"] or []:
                    name = channel_stats["channel_name"]
                    key = name if topic else f"{stats['topic_name']}:{name}"
                    if key not in channels:
                        channels[key] = new_channel_aggregate(stats["topic_name"], name, addr)
                    channel_add(channels[key], channel_stats)
        topics.sort(key=by_host)
        return Result(NodeStats(topics, channels, replication), failures)

    async def inspect_channel(
        self, producers: Sequence[Json], topic: str, channel: str, limit: int
    ) -> Result[Inspection]:
        """nsqpy nsqd's ``--enable-inspect`` listings of one channel on each producer: the
        next ``limit`` queued messages, and up to ``limit`` in flight and deferred. An nsqd
        without the routes (404 ``NOT_FOUND``: Go's, or nsqpy's without the flag) is listed in
        ``unsupported``; one without the channel is left out. Nothing is changed on nsqd."""
        by_address = {http_address(p): p for p in producers}
        qs = query_string(topic=topic, channel=channel)

        async def query(addr: str) -> Json | str:
            base = f"http://{addr}/channel"
            urls = [f"{base}/peek?{qs}&n={limit}", f"{base}/inflight?{qs}", f"{base}/deferred?{qs}"]
            answers = await asyncio.gather(
                *(self._get(url, "nsqd") for url in urls), return_exceptions=True
            )
            for answer in answers:
                if isinstance(answer, RequestError) and answer.status == 404:
                    absent = answer.api_message in ("TOPIC_NOT_FOUND", "CHANNEL_NOT_FOUND")
                    return "absent" if absent else "unsupported"
            for answer in answers:
                if isinstance(answer, BaseException):
                    raise answer
            queued, in_flight, deferred = (inspected_messages(answer) for answer in answers)
            return {
                "node": addr,
                "hostname": by_address[addr]["hostname"],
                "queued": queued[:limit],
                "in_flight": sorted(in_flight, key=lambda m: m.get("deadline", 0))[:limit],
                "deferred": deferred[:limit],
                "in_flight_total": len(in_flight),
                "deferred_total": len(deferred),
            }

        values, failures = await self._fan_out("nsqd", list(by_address), query)
        nodes = sorted((v for _, v in values if isinstance(v, dict)), key=by_host)
        unsupported = sorted(a for a, v in values if v == "unsupported")
        return Result(Inspection(nodes, unsupported), failures)

    # ------------------------------------------------------------------ either mode

    async def get_producers(
        self, lookupds: Sequence[str], nsqds: Sequence[str]
    ) -> Result[list[Json]]:
        if lookupds:
            return await self.get_lookupd_producers(lookupds)
        return await self.get_nsqd_producers(nsqds)

    async def get_topic_producers(
        self, topic: str, lookupds: Sequence[str], nsqds: Sequence[str]
    ) -> Result[list[Json]]:
        if lookupds:
            return await self.get_lookupd_topic_producers(topic, lookupds)
        return await self.get_nsqd_topic_producers(topic, nsqds)

    async def get_topics(self, lookupds: Sequence[str], nsqds: Sequence[str]) -> Result[list[str]]:
        if lookupds:
            return await self.get_lookupd_topics(lookupds)
        return await self.get_nsqd_topics(nsqds)

    # ------------------------------------------------------------------ actions

    async def _post_all(
        self, addresses: Sequence[str], uri: str, qs: str, daemon: str
    ) -> list[Failure]:
        """POST to each address in turn (as Go); every failure is collected, none raises."""
        failures = []
        for addr in addresses:
            url = f"http://{addr}/{uri}?{qs}"
            self._log(f"CI: querying {daemon} {url}")
            try:
                await self.client.post_v1(url)
            except RequestError as exc:
                failures.append(Failure(addr, str(exc)))
        return failures

    async def _producers_post(self, producers: Sequence[Json], uri: str, qs: str) -> list[Failure]:
        return await self._post_all([http_address(p) for p in producers], uri, qs, "nsqd")

    async def tombstone_node_for_topic(
        self, topic: str, node: str, lookupds: Sequence[str]
    ) -> list[Failure]:
        """Tombstone ``node`` for ``topic`` on every lookupd, then delete the topic on it."""
        failures = await self._post_all(
            lookupds, "topic/tombstone", query_string(topic=topic, node=node), "nsqlookupd"
        )
        producers = await self.get_nsqd_producers([node])
        failures += producers.failures
        failures += await self._producers_post(
            producers.value, "topic/delete", query_string(topic=topic)
        )
        return failures

    async def create_topic_channel(
        self, topic: str, channel: str, lookupds: Sequence[str]
    ) -> list[Failure]:
        failures = await self._post_all(
            lookupds, "topic/create", query_string(topic=topic), "nsqlookupd"
        )
        if channel:
            qs = query_string(topic=topic, channel=channel)
            failures += await self._post_all(lookupds, "channel/create", qs, "nsqlookupd")
            producers = await self.get_lookupd_topic_producers(topic, lookupds)
            failures += producers.failures
            failures += await self._producers_post(producers.value, "channel/create", qs)
        return failures

    async def delete_topic(
        self, topic: str, lookupds: Sequence[str], nsqds: Sequence[str]
    ) -> list[Failure]:
        producers = await self.get_topic_producers(topic, lookupds, nsqds)  # before deleting
        qs = query_string(topic=topic)
        failures = list(producers.failures)
        failures += await self._post_all(lookupds, "topic/delete", qs, "nsqlookupd")
        failures += await self._producers_post(producers.value, "topic/delete", qs)
        return failures

    async def delete_channel(
        self, topic: str, channel: str, lookupds: Sequence[str], nsqds: Sequence[str]
    ) -> list[Failure]:
        producers = await self.get_topic_producers(topic, lookupds, nsqds)
        qs = query_string(topic=topic, channel=channel)
        failures = list(producers.failures)
        failures += await self._post_all(lookupds, "channel/delete", qs, "nsqlookupd")
        failures += await self._producers_post(producers.value, "channel/delete", qs)
        return failures

    async def topic_channel_action(
        self,
        uri: str,
        topic: str,
        channel: str,
        lookupds: Sequence[str],
        nsqds: Sequence[str],
    ) -> list[Failure]:
        """``topic/pause``, ``channel/empty``, ... on every nsqd producing the topic."""
        producers = await self.get_topic_producers(topic, lookupds, nsqds)
        qs = query_string(topic=topic, channel=channel) if channel else query_string(topic=topic)
        return producers.failures + await self._producers_post(producers.value, uri, qs)
