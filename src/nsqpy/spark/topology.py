"""Which nsqd carry a topic, and how deep our channel is on each: blocking HTTP calls.

The Spark driver's stream-reader runner is a plain blocking process, so these use urllib
rather than the asyncio client. Every call has a timeout; every address is the user's.
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..client.lookup import lookup_url
from ..internal.api_client import request_v1_sync
from ..internal.net import join_host_port as join_address

__all__ = [
    "ChannelStats",
    "LookupdUnreachable",
    "NsqdNode",
    "all_nodes",
    "channel_stats",
    "create_channel",
    "lookup_nodes",
    "matching_topics",
]

log = logging.getLogger("nsqpy.spark")


class LookupdUnreachable(ConnectionError):
    """None of the configured nsqlookupd answered."""


@dataclass(frozen=True, order=True)
class NsqdNode:
    """One nsqd: its TCP address (what tasks connect to) and HTTP address (stats), if known."""

    tcp: str
    http: str | None = None


@dataclass(frozen=True)
class ChannelStats:
    """One channel on one nsqd, from ``/stats``; ``exists`` is False if the channel is not there."""

    topic_exists: bool
    exists: bool
    depth: int = 0
    in_flight: int = 0
    deferred: int = 0
    #: messages still in the topic's own queue, on their way to its channels
    topic_depth: int = 0

    @property
    def available(self) -> int:
        return self.depth + self.topic_depth


def _base(address: str) -> str:
    return (address if "://" in address else "http://" + address).rstrip("/")


_get_json = request_v1_sync  # the same V1 request as the asyncio callers'


def _nodes_from(payload: Any) -> list[NsqdNode]:
    if not isinstance(payload, dict):
        return []
    data = payload.get("data") if "producers" not in payload else payload
    if not isinstance(data, dict):
        return []
    nodes = []
    for producer in data.get("producers") or ():
        host = producer.get("broadcast_address") or producer.get("address")
        tcp_port, http_port = producer.get("tcp_port"), producer.get("http_port")
        if host and isinstance(tcp_port, int):
            http = join_address(host, http_port) if isinstance(http_port, int) else None
            nodes.append(NsqdNode(join_address(host, tcp_port), http))
    return nodes


def _query_all(lookupd: Sequence[str], urls: Sequence[str], timeout: float) -> list[Any]:
    """GET each URL; raise LookupdUnreachable if none answered at all (404 is an answer)."""
    answers: list[Any] = []
    errors: list[str] = []
    for address, url in zip(lookupd, urls, strict=True):
        try:
            status, payload = _get_json(url, timeout)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            errors.append(f"{address}: {reason}")
            continue
        if status == 200:
            answers.append(payload)
        elif status == 404:
            answers.append(None)
        else:
            errors.append(f"{address}: HTTP {status}")
    if not answers:
        raise LookupdUnreachable(
            "could not reach any nsqlookupd (" + "; ".join(errors) + "): check the 'lookupd' "
            "option (nsqlookupd HTTP addresses, default port 4161)"
        )
    for error in errors:
        log.warning("nsqlookupd query failed: %s", error)
    return answers


def lookup_nodes(lookupd: Sequence[str], topic: str, timeout: float) -> list[NsqdNode]:
    """The union of the nsqd that every reachable nsqlookupd lists for ``topic``, sorted."""
    urls = [lookup_url(address, topic) for address in lookupd]
    nodes: set[NsqdNode] = set()
    for payload in _query_all(lookupd, urls, timeout):
        nodes.update(_nodes_from(payload))
    return sorted(nodes)


def all_nodes(lookupd: Sequence[str], timeout: float) -> list[NsqdNode]:
    """Every nsqd registered with any reachable nsqlookupd (``/nodes``), sorted."""
    urls = [_base(address) + "/nodes" for address in lookupd]
    nodes: set[NsqdNode] = set()
    for payload in _query_all(lookupd, urls, timeout):
        nodes.update(_nodes_from(payload))
    return sorted(nodes)


def matching_topics(lookupd: Sequence[str], pattern: str, timeout: float) -> list[str]:
    """Topics known to any nsqlookupd whose whole name matches ``pattern``, sorted."""
    urls = [_base(address) + "/topics" for address in lookupd]
    regex = re.compile(pattern)
    topics: set[str] = set()
    for payload in _query_all(lookupd, urls, timeout):
        if isinstance(payload, dict):
            data = payload.get("data") if "topics" not in payload else payload
            if isinstance(data, dict):
                topics.update(t for t in data.get("topics") or () if isinstance(t, str))
    return sorted(t for t in topics if regex.fullmatch(t))


def _topic_stats(http: str, topic: str, channel: str | None, timeout: float) -> Any:
    params = {"format": "json", "topic": topic, "include_clients": "false"}
    if channel is not None:
        params["channel"] = channel
    query = urllib.parse.urlencode(params)
    try:
        status, payload = _get_json(f"{_base(http)}/stats?{query}&include_mem=false", timeout)
    except (OSError, ValueError) as exc:
        log.warning("nsqd %s /stats failed: %s", http, exc)
        return None
    if status != 200 or not isinstance(payload, dict):
        log.warning("nsqd %s /stats answered HTTP %s", http, status)
        return None
    data = payload.get("data") if "topics" not in payload else payload
    for t in (data or {}).get("topics") or ():
        if t.get("topic_name") == topic:
            return t
    return {}


def channel_stats(http: str, topic: str, channel: str, timeout: float) -> ChannelStats | None:
    """Our channel's depth, in-flight and deferred counts on one nsqd; None if unreachable."""
    found = _topic_stats(http, topic, channel, timeout)
    if found is None:
        return None
    for c in found.get("channels") or ():
        if c.get("channel_name") == channel:
            return ChannelStats(
                topic_exists=True,
                exists=True,
                depth=int(c.get("depth") or 0),
                in_flight=int(c.get("in_flight_count") or 0),
                deferred=int(c.get("deferred_count") or 0),
                topic_depth=int(found.get("depth") or 0),
            )
    # nsqd leaves out a topic that lacks the channel asked for: ask about the topic alone
    topic_only = found or _topic_stats(http, topic, None, timeout)
    if topic_only is None:
        return None
    return ChannelStats(topic_exists=bool(topic_only), exists=False)


def create_channel(http: str, topic: str, channel: str, timeout: float) -> bool:
    """POST ``/channel/create`` on one nsqd; True if it now exists (the topic must exist)."""
    query = urllib.parse.urlencode({"topic": topic, "channel": channel})
    try:
        status, _ = request_v1_sync(f"{_base(http)}/channel/create?{query}", timeout, "POST")
        if status == 200:
            return True
        log.warning("nsqd %s: cannot create channel %s/%s: HTTP %s", http, topic, channel, status)
    except (OSError, ValueError) as exc:
        log.warning("nsqd %s: cannot create channel %s/%s: %s", http, topic, channel, exc)
    return False
