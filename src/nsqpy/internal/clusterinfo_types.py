"""Go's clusterinfo types: nsqd's and nsqlookupd's JSON read into the dicts nsqadmin serves
(keys in Go's order), and their merging into cluster-wide aggregates (Go's ``TopicStats.Add``,
``ChannelStats.Add``, ``E2eProcessingLatencyAggregate``). Pure data: no I/O.

:mod:`.clusterinfo` gathers the answers; this module shapes and merges them.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from ..internal.net import join_host_port

Json = dict[str, Any]


def parse_version(text: str) -> tuple[int, int, int]:
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


def producer_from_info(addr: str, info: Json, topics: list[str]) -> Json:
    """A producer from an nsqd's ``/info`` (nsqd mode: no lookupd to list it), falling back
    to the address it was reached at."""
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


def http_address(producer: Json) -> str:
    return join_host_port(producer["broadcast_address"], producer["http_port"])


def tcp_address(producer: Json) -> str:
    return join_host_port(producer["broadcast_address"], producer["tcp_port"])


def producer_sort_key(producer: Json) -> tuple[str, str, int]:
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
        **queue_limit_keys(data),  # nsqd --max-queue-bytes
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


#: Summed over nodes; ``max_queue_bytes`` aggregates as the highest cap.
QUEUE_LIMIT_SUMS = ("queue_bytes", "queue_dropped_count", "queue_refused_count")


def queue_limit_keys(data: Json) -> Json:
    """nsqd's bounded-queue figures (``--max-queue-bytes``), only where nsqd gives them: a
    queue without the feature keeps exactly Go's keys."""
    if "max_queue_bytes" not in data:
        return {}
    out: Json = {
        "max_queue_bytes": data.get("max_queue_bytes", 0),
        "queue_full_policy": data.get("queue_full_policy", ""),
    }
    out.update({key: data.get(key, 0) for key in QUEUE_LIMIT_SUMS})
    return out


def queue_limit_add(total: Json, node_stats: Json) -> None:
    """One node's figures into the cluster aggregate (the highest cap, the sums; the policy,
    or ``mixed`` when nodes differ)."""
    if "max_queue_bytes" not in node_stats:
        return
    first = "max_queue_bytes" not in total
    total["max_queue_bytes"] = max(total.get("max_queue_bytes", 0), node_stats["max_queue_bytes"])
    policy = node_stats["queue_full_policy"]
    if not first and total.get("queue_full_policy") != policy:
        policy = "mixed"
    total["queue_full_policy"] = policy
    for key in QUEUE_LIMIT_SUMS:
        total[key] = total.get(key, 0) + node_stats[key]


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
        **queue_limit_keys(data),  # nsqd --max-queue-bytes
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


def by_host(stats: Json) -> tuple[str, str]:
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
    total["nodes"] = sorted([*(total["nodes"] or []), node_stats], key=by_host)
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
    total["nodes"] = sorted([*(total["nodes"] or []), node_stats], key=by_host)
    if total["e2e_processing_latency"] is None:
        total["e2e_processing_latency"] = _new_e2e(total["topic_name"], "")
    _e2e_add(total["e2e_processing_latency"], node_stats["e2e_processing_latency"])


@dataclass
class NodeStats:
    """``get_nsqd_stats``: per-node topic stats and the channel aggregates."""

    topics: list[Json]
    channels: dict[str, Json]
    #: nsqpy nsqd with --replica-peer: its /stats "replication" object, by HTTP address
    replication: dict[str, Json] = field(default_factory=dict)


@dataclass
class Inspection:
    """``inspect_channel``: per node that has the routes, its listings; the nodes without."""

    nodes: list[Json]
    unsupported: list[str]


#: The most bytes of a message body nsqadmin passes on from a peek (a body may be 1 MiB).
BODY_LIMIT = 4096


def inspected_messages(answer: object) -> list[Json]:
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
