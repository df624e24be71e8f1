"""Query and aggregate an NSQ cluster over HTTP (Go: ``internal/clusterinfo``); no web layer.

    async with ClusterInfo(Client()) as ci:
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
import base64
import json
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, TypeVar
from urllib.parse import quote_plus, urlsplit, urlunsplit

import aiohttp

from ..internal import lg
from .queue_limits import queue_limit_add, queue_limit_keys

T = TypeVar("T")
Json = dict[str, Any]

ACCEPT_V1 = "application/vnd.nsq; version=1.0"


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


class RequestError(Exception):
    """One HTTP request failed; ``str()`` is Go's error text for it. ``status`` and ``body``
    are the daemon's answer when it gave one (0 and b"" when it could not be reached)."""

    def __init__(self, text: str, status: int = 0, body: bytes = b"") -> None:
        super().__init__(text)
        self.status = status
        self.body = body

    @property
    def api_message(self) -> str:
        """The ``message`` of a V1 JSON error body (``""`` if it has none)."""
        try:
            decoded = json.loads(self.body)
        except ValueError:
            return ""
        return str(decoded.get("message", "")) if isinstance(decoded, dict) else ""


# --------------------------------------------------------------------------- the HTTP client


def _go_quote(text: str) -> str:
    """Go's ``%q`` of a string (close enough for error messages)."""
    return json.dumps(text, ensure_ascii=False)


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc


class Client:
    """Go's ``http_api.Client``: V1 GET/POST with connect and request deadlines.

    A ``403`` carrying ``https_port`` (nsqd with ``--tls-required``) is retried over HTTPS with
    ``ssl_context``, as Go's client does.
    """

    def __init__(
        self,
        connect_timeout: float = 2.0,
        request_timeout: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.ssl_context = ssl_context
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(
                total=self.request_timeout, sock_connect=self.connect_timeout
            )
            connector = aiohttp.TCPConnector(limit=100, ssl=self.ssl_context or True)
            self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get_v1(self, url: str) -> Any:
        body = await self._request("GET", url)
        try:
            return json.loads(body)
        except ValueError as exc:
            raise RequestError(f"invalid character in response from {url}: {exc}") from None

    async def post_v1(self, url: str) -> None:
        await self._request("POST", url)

    async def _request(self, method: str, url: str) -> bytes:
        verb = method.capitalize()
        for _ in range(2):  # the second round is the HTTPS retry
            try:
                async with self.session().request(
                    method, url, headers={"Accept": ACCEPT_V1}
                ) as response:
                    body = await response.read()
                    status, reason = response.status, response.reason or ""
            except TimeoutError:
                raise RequestError(
                    f'{verb} "{url}": context deadline exceeded '
                    "(Client.Timeout exceeded while awaiting headers)"
                ) from None
            except aiohttp.ClientConnectorCertificateError as exc:
                raise RequestError(
                    f'{verb} "{url}": tls: failed to verify certificate: {exc.certificate_error}'
                ) from None
            except aiohttp.ClientConnectorError as exc:
                errno = exc.os_error.errno
                cause = os.strerror(errno) if errno else str(exc.os_error)
                cause = cause[:1].lower() + cause[1:]  # Go: "connect: connection refused"
                raise RequestError(
                    f'{verb} "{url}": dial tcp {_host_port(url)}: connect: {cause}'
                ) from None
            except aiohttp.ClientError as exc:
                raise RequestError(f'{verb} "{url}": {exc}') from None
            if status == 200:
                return body
            if status == 403 and not url.startswith("https"):
                url = _https_url(url, body)
                continue
            text = body.decode("utf-8", "replace")
            raise RequestError(f"got response {status} {reason} {_go_quote(text)}", status, body)
        raise RequestError(f'{verb} "{url}": too many redirects')


def _https_url(url: str, body: bytes) -> str:
    try:
        port = int(json.loads(body)["https_port"])
    except (ValueError, KeyError, TypeError):
        raise RequestError(f"got response 403 Forbidden {_go_quote(body.decode())}") from None
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(("https", netloc, parts.path, parts.query, ""))


# --------------------------------------------------------------------------- Go's types


def join_host_port(host: str, port: int | str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_version(text: str) -> tuple[int, int, int]:
    """semver's major.minor.patch; anything unparsable is 0.0.0 (as Go's clusterinfo)."""
    core = text.split("-", 1)[0].split("+", 1)[0]
    parts = core.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return (0, 0, 0)
    return (int(parts[0]), int(parts[1]), int(parts[2]))


def producer_from_lookupd(data: Json) -> Json:
    """A lookupd producer entry as Go's ``Producer`` (topics zipped with their tombstones)."""
    names = data.get("topics") or []
    tombstones = data.get("tombstones") or []
    topics = [
        {"topic": name, "tombstoned": bool(tombstones[i]) if i < len(tombstones) else False}
        for i, name in enumerate(names)
    ]
    return {
        "remote_addresses": None,
        "remote_address": data.get("remote_address", ""),
        "hostname": data.get("hostname", ""),
        "broadcast_address": data.get("broadcast_address", ""),
        "tcp_port": data.get("tcp_port", 0),
        "http_port": data.get("http_port", 0),
        "version": data.get("version", ""),
        "topics": sorted(topics, key=lambda t: t["topic"]) if data.get("topics") else None,
        "out_of_date": False,
    }


def http_address(producer: Json) -> str:
    return join_host_port(producer["broadcast_address"], producer["http_port"])


def tcp_address(producer: Json) -> str:
    return join_host_port(producer["broadcast_address"], producer["tcp_port"])


def _producer_sort_key(producer: Json) -> tuple[str, str, int]:
    # Go sorts by hostname only, so equal hostnames swap places between reloads; break ties
    return (producer["hostname"], producer["broadcast_address"], producer["http_port"])


def _e2e_from_nsqd(data: Json | None) -> Json | None:
    """nsqd's ``e2e_processing_latency`` with min/max/average/count per percentile (Go's
    ``E2eProcessingLatencyAggregate.UnmarshalJSON``; map keys sorted as Go marshals maps)."""
    if data is None:
        return None
    count = data.get("count", 0)
    percentiles = None
    if data.get("percentiles") is not None:
        percentiles = []
        for p in data["percentiles"]:
            value = p.get("value", 0)
            entry = {**p, "min": value, "max": value, "average": value, "count": float(count)}
            percentiles.append(dict(sorted(entry.items())))
    return {
        "count": count,
        "percentiles": percentiles,
        "topic": data.get("topic", ""),
        "channel": data.get("channel", ""),
        "host": data.get("host", ""),
    }


def _e2e_add(total: Json, other: Json | None) -> None:
    """Merge one node's latency into an aggregate: counts add, averages weighted by count.

    Go's ``Add`` takes ``min`` from the other node's *max*; here it is the true minimum.
    """
    if other is None:
        return
    total["host"] = "*"
    total["count"] += other["count"]
    for value in other["percentiles"] or []:
        percentiles = total["percentiles"] if total["percentiles"] is not None else []
        total["percentiles"] = percentiles
        mine = next((p for p in percentiles if p["quantile"] == value["quantile"]), None)
        if mine is None:
            mine = {"quantile": value["quantile"], "max": 0.0, "min": value["min"]}
            mine.update(average=0.0, count=0.0)
            percentiles.append(mine)
        mine["max"] = max(value["max"], mine["max"])
        mine["min"] = min(value["min"], mine["min"])
        mine["count"] += value["count"]
        if mine["count"] == 0:
            mine["average"] = 0.0
            continue
        delta = value["average"] - mine["average"]
        mine["average"] += delta * value["count"] / mine["count"]
    if total["percentiles"] is not None:
        total["percentiles"] = [dict(sorted(p.items())) for p in total["percentiles"]]


def _new_e2e(topic: str, channel: str) -> Json:
    return {"count": 0, "percentiles": None, "topic": topic, "channel": channel, "host": ""}


CLIENT_KEYS: tuple[tuple[str, Any], ...] = (
    ("remote_address", ""),
    ("version", ""),
    ("client_id", ""),
    ("hostname", ""),
    ("user_agent", ""),
    ("connect_ts", 0),
)
CLIENT_TAIL_KEYS: tuple[tuple[str, Any], ...] = (
    ("in_flight_count", 0),
    ("ready_count", 0),
    ("finish_count", 0),
    ("requeue_count", 0),
    ("message_count", 0),
    ("sample_rate", 0),
    ("deflate", False),
    ("snappy", False),
    ("authed", False),
    ("auth_identity", ""),
    ("auth_identity_url", ""),
    ("tls", False),
    ("tls_cipher_suite", ""),
    ("tls_version", ""),
    ("tls_negotiated_protocol", ""),
    ("tls_negotiated_protocol_is_mutual", False),
)


def client_from_nsqd(data: Json, node: str, now: float) -> Json:
    """Go's ``ClientStats``: ``connected`` is the connection's age in ns (whole seconds)."""
    out: Json = {"node": node}
    for key, default in CLIENT_KEYS:
        out[key] = data.get(key, default)
    out["connected"] = (int(now) - int(out["connect_ts"])) * 1_000_000_000
    for key, default in CLIENT_TAIL_KEYS:
        out[key] = data.get(key, default)
    return out


def channel_from_nsqd(data: Json, topic: str, node: str, hostname: str, now: float) -> Json:
    depth, backend = data.get("depth", 0), data.get("backend_depth", 0)
    clients = data.get("clients")
    return {
        "node": node,
        "hostname": hostname,
        "topic_name": topic,
        "channel_name": data.get("channel_name", ""),
        "depth": depth,
        "memory_depth": depth - backend,
        "backend_depth": backend,
        "in_flight_count": data.get("in_flight_count", 0),
        "deferred_count": data.get("deferred_count", 0),
        "requeue_count": data.get("requeue_count", 0),
        "timeout_count": data.get("timeout_count", 0),
        "message_count": data.get("message_count", 0),
        "client_count": data.get("client_count", 0),
        "nodes": None,
        "clients": None if clients is None else [client_from_nsqd(c, node, now) for c in clients],
        "paused": data.get("paused", False),
        "e2e_processing_latency": _e2e_from_nsqd(data.get("e2e_processing_latency")),
        **_dead_letter_keys(data),
        **queue_limit_keys(data),  # nsqd --max-queue-bytes (queue_limits.py)
    }


def _dead_letter_keys(data: Json) -> Json:
    """nsqpy's dead-lettering figures (nsqd ``--max-attempts``), only where nsqd gives them:
    a channel without the feature keeps exactly Go's keys."""
    if "max_attempts" not in data and "dead_letter_count" not in data:
        return {}
    return {
        "max_attempts": data.get("max_attempts", 0),
        "dead_letter_count": data.get("dead_letter_count", 0),
    }


def topic_from_nsqd(data: Json, node: str, hostname: str, now: float) -> Json:
    name = data.get("topic_name", "")
    depth, backend = data.get("depth", 0), data.get("backend_depth", 0)
    channels = data.get("channels")
    return {
        "node": node,
        "hostname": hostname,
        "topic_name": name,
        "depth": depth,
        "memory_depth": depth - backend,
        "backend_depth": backend,
        "message_count": data.get("message_count", 0),
        "nodes": None,
        "channels": None
        if channels is None
        else [channel_from_nsqd(c, name, node, hostname, now) for c in channels],
        "paused": data.get("paused", False),
        "e2e_processing_latency": _e2e_from_nsqd(data.get("e2e_processing_latency")),
        **queue_limit_keys(data),  # nsqd --max-queue-bytes (queue_limits.py)
    }


_CHANNEL_SUMS = (
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


def _by_host(stats: Json) -> tuple[str, str]:
    return (stats["hostname"], stats["node"])


def new_channel_aggregate(topic: str, channel: str, node: str = "") -> Json:
    out: Json = {"node": node, "hostname": "", "topic_name": topic, "channel_name": channel}
    out.update({key: 0 for key in _CHANNEL_SUMS[:-1]})
    out["client_count"] = 0
    out.update(nodes=None, clients=None, paused=False, e2e_processing_latency=None)
    return out


def channel_add(total: Json, node_stats: Json) -> None:
    """Go's ``ChannelStats.Add``: one node's channel into the cluster aggregate."""
    total["node"] = "*"
    for key in _CHANNEL_SUMS:
        total[key] += node_stats[key]
    total["paused"] = total["paused"] or node_stats["paused"]
    total["nodes"] = sorted([*(total["nodes"] or []), node_stats], key=_by_host)
    if total["e2e_processing_latency"] is None:
        total["e2e_processing_latency"] = _new_e2e(total["topic_name"], total["channel_name"])
    _e2e_add(total["e2e_processing_latency"], node_stats["e2e_processing_latency"])
    if "max_attempts" in node_stats:  # nsqpy dead-lettering: the highest limit, the sum
        total["max_attempts"] = max(total.get("max_attempts", 0), node_stats["max_attempts"])
        total["dead_letter_count"] = (
            total.get("dead_letter_count", 0) + node_stats["dead_letter_count"]
        )
    queue_limit_add(total, node_stats)
    if node_stats["clients"]:  # Go appends to a nil slice: null until a client is seen
        clients = [*(total["clients"] or []), *node_stats["clients"]]
        total["clients"] = sorted(clients, key=lambda c: (c["hostname"], c["node"]))


def new_topic_aggregate(topic: str) -> Json:
    return {
        "node": "",
        "hostname": "",
        "topic_name": topic,
        "depth": 0,
        "memory_depth": 0,
        "backend_depth": 0,
        "message_count": 0,
        "nodes": None,
        "channels": None,
        "paused": False,
        "e2e_processing_latency": None,
    }


def topic_add(total: Json, node_stats: Json) -> None:
    """Go's ``TopicStats.Add``. Unlike Go, channels are aggregated into fresh objects, so a
    node's own ``channels`` stay that node's and every aggregate lists all of its nodes."""
    total["node"] = "*"
    for key in ("depth", "memory_depth", "backend_depth", "message_count"):
        total[key] += node_stats[key]
    total["paused"] = total["paused"] or node_stats["paused"]
    queue_limit_add(total, node_stats)
    for channel in node_stats["channels"] or []:
        channels = total["channels"] if total["channels"] is not None else []
        total["channels"] = channels
        mine = next((c for c in channels if c["channel_name"] == channel["channel_name"]), None)
        if mine is None:
            mine = new_channel_aggregate(total["topic_name"], channel["channel_name"])
            channels.append(mine)
        channel_add(mine, channel)
    total["nodes"] = sorted([*(total["nodes"] or []), node_stats], key=_by_host)
    if total["e2e_processing_latency"] is None:
        total["e2e_processing_latency"] = _new_e2e(total["topic_name"], "")
    _e2e_add(total["e2e_processing_latency"], node_stats["e2e_processing_latency"])


# --------------------------------------------------------------------------- ClusterInfo


@dataclass
class NodeStats:
    """``get_nsqd_stats``: per-node topic stats and the channel aggregates."""

    topics: list[Json]
    channels: dict[str, Json]


@dataclass
class Inspection:
    """``inspect_channel``: per node that has the routes, its listings; the nodes without."""

    nodes: list[Json]
    unsupported: list[str]


#: The most bytes of a message body nsqadmin passes on from a peek (a body may be 1 MiB).
BODY_LIMIT = 4096


def _messages(answer: object) -> list[Json]:
    """The messages of one inspect answer, bodies cut to BODY_LIMIT bytes (base64 as nsqd
    sends them), with ``body_size`` (the whole body's) and ``body_truncated``."""
    found = answer.get("messages") if isinstance(answer, dict) else None
    out = []
    for message in found or []:
        if not isinstance(message, dict):
            continue
        entry = dict(message)
        try:
            body = base64.b64decode(entry.get("body") or "")
        except ValueError:
            body = b""
        entry["body"] = base64.b64encode(body[:BODY_LIMIT]).decode("ascii")
        entry["body_size"] = len(body)
        entry["body_truncated"] = len(body) > BODY_LIMIT
        out.append(entry)
    return out


def _qs(**params: str) -> str:
    return "&".join(f"{key}={quote_plus(value, safe='')}" for key, value in params.items())


class ClusterInfo:
    """Go's ``ClusterInfo``: the queries nsqadmin makes, each fanned out concurrently."""

    def __init__(self, client: Client | None = None, logger: lg.Logger | None = None) -> None:
        self.client = client if client is not None else Client()
        self.logger = logger

    async def __aenter__(self) -> ClusterInfo:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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
            data = await self._get(f"http://{addr}/channels?{_qs(topic=topic)}", "nsqlookupd")
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
        newest = max((_parse_version(p["version"]) for p in by_tcp.values()), default=(0, 0, 0))
        for producer in by_tcp.values():
            producer["out_of_date"] = _parse_version(producer["version"]) < newest
        return Result(sorted(by_tcp.values(), key=_producer_sort_key), failures)

    async def get_lookupd_topic_producers(
        self, topic: str, lookupds: Sequence[str]
    ) -> Result[list[Json]]:
        async def query(addr: str) -> list[Json]:
            data = await self._get(f"http://{addr}/lookup?{_qs(topic=topic)}", "nsqlookupd")
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

    @staticmethod
    def _producer_from_info(addr: str, info: Json, topics: list[str]) -> Json:
        host, _, port = addr.rpartition(":")
        broadcast = info.get("broadcast_address") or host.strip("[]")
        http_port = info.get("http_port") or (int(port) if port.isdigit() else 0)
        return {
            "remote_addresses": None,
            "remote_address": "",
            "hostname": info.get("hostname") or host.strip("[]"),
            "broadcast_address": broadcast,
            "tcp_port": info.get("tcp_port", 0),
            "http_port": http_port,
            "version": info.get("version", ""),
            "topics": [{"topic": t, "tombstoned": False} for t in topics] or None,
            "out_of_date": False,
        }

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
            return self._producer_from_info(addr, info, topics)

        values, failures = await self._fan_out("nsqd", nsqds, query)
        return Result([p for _, p in values], failures)

    async def get_nsqd_topic_producers(
        self, topic: str, nsqds: Sequence[str]
    ) -> Result[list[Json]]:
        async def query(addr: str) -> Json | None:
            url = f"http://{addr}/stats?format=json&{_qs(topic=topic)}&include_clients=false"
            stats = await self._get(url, "nsqd")
            topics = [t.get("topic_name", "") for t in stats.get("topics") or []]
            if topic not in topics:
                return None
            info = await self._nsqd_info(addr)
            return self._producer_from_info(addr, info, topics)

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
                url += f"&{_qs(topic=topic)}"
                if channel:
                    url += f"&{_qs(channel=channel)}"
            if not include_clients:
                url += "&include_clients=false"
            data = await self._get(url, "nsqd")
            return data if isinstance(data, dict) else {}

        values, failures = await self._fan_out("nsqd", list(by_address), query)
        now = time.time()
        topics: list[Json] = []
        channels: dict[str, Json] = {}
        for addr, data in values:
            hostname = by_address[addr]["hostname"]
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
        topics.sort(key=_by_host)
        return Result(NodeStats(topics, channels), failures)

    async def inspect_channel(
        self, producers: Sequence[Json], topic: str, channel: str, limit: int
    ) -> Result[Inspection]:
        """nsqpy nsqd's ``--enable-inspect`` listings of one channel on each producer: the
        next ``limit`` queued messages, and up to ``limit`` in flight and deferred. An nsqd
        without the routes (404 ``NOT_FOUND``: Go's, or nsqpy's without the flag) is listed in
        ``unsupported``; one without the channel is left out. Nothing is changed on nsqd."""
        by_address = {http_address(p): p for p in producers}
        qs = _qs(topic=topic, channel=channel)

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
            queued, in_flight, deferred = (_messages(answer) for answer in answers)
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
        nodes = sorted((v for _, v in values if isinstance(v, dict)), key=_by_host)
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
            lookupds, "topic/tombstone", _qs(topic=topic, node=node), "nsqlookupd"
        )
        producers = await self.get_nsqd_producers([node])
        failures += producers.failures
        failures += await self._producers_post(producers.value, "topic/delete", _qs(topic=topic))
        return failures

    async def create_topic_channel(
        self, topic: str, channel: str, lookupds: Sequence[str]
    ) -> list[Failure]:
        failures = await self._post_all(lookupds, "topic/create", _qs(topic=topic), "nsqlookupd")
        if channel:
            qs = _qs(topic=topic, channel=channel)
            failures += await self._post_all(lookupds, "channel/create", qs, "nsqlookupd")
            producers = await self.get_lookupd_topic_producers(topic, lookupds)
            failures += producers.failures
            failures += await self._producers_post(producers.value, "channel/create", qs)
        return failures

    async def delete_topic(
        self, topic: str, lookupds: Sequence[str], nsqds: Sequence[str]
    ) -> list[Failure]:
        producers = await self.get_topic_producers(topic, lookupds, nsqds)  # before deleting
        qs = _qs(topic=topic)
        failures = list(producers.failures)
        failures += await self._post_all(lookupds, "topic/delete", qs, "nsqlookupd")
        failures += await self._producers_post(producers.value, "topic/delete", qs)
        return failures

    async def delete_channel(
        self, topic: str, channel: str, lookupds: Sequence[str], nsqds: Sequence[str]
    ) -> list[Failure]:
        producers = await self.get_topic_producers(topic, lookupds, nsqds)
        qs = _qs(topic=topic, channel=channel)
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
        qs = _qs(topic=topic, channel=channel) if channel else _qs(topic=topic)
        return producers.failures + await self._producers_post(producers.value, uri, qs)
