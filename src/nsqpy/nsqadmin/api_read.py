"""nsqadmin's read API (``GET /api/...``): topics, channels, nodes, counters, Graphite rates
and nsqpy's poller history and channel inspection, each gathered through ClusterInfo and shaped
as Go's nsqadmin answers."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp
from aiohttp import web

from ..internal import clusterinfo as cluster
from ..internal.api_client import RequestError
from ..internal.clusterinfo_types import (
    Inspection,
    Json,
    NodeStats,
    http_address,
    new_topic_aggregate,
    topic_add,
)
from ..internal.http_api import ApiError, v1_json
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from .context import AdminContext, Warnings, upstream_error


def is_valid_node(node: str) -> bool:
    """A node as the API names one: ``host:port`` (``[v6]:port``), port 1..65535."""
    host, _, port = node.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


#: ``n`` of ``/api/topics/:topic/:channel/inspect``: the default and the largest.
INSPECT_DEFAULT_N = 20

INSPECT_MAX_N = 100


def _inspect_limit(raw: str | None) -> int:
    if raw is None:
        return INSPECT_DEFAULT_N
    try:
        limit = int(raw)
    except ValueError:
        raise ApiError(400, "INVALID_N") from None
    if not 1 <= limit <= INSPECT_MAX_N:
        raise ApiError(400, "INVALID_N")
    return limit


class ReadHandlers(AdminContext):
    """The ``GET /api`` handlers: they change nothing on the cluster."""

    async def topics(self, request: web.Request) -> web.Response:
        warnings = Warnings(self.logger)
        try:
            result = await self.ci.get_topics(self.lookupds, self.nsqds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "get topics", exc) from None
        warnings.add(result.failures)
        if request.query.get("inactive") == "true":
            inactive: dict[str, list[str] | None] = {}
            if self.lookupds:
                for topic in result.value:
                    channels = await self._inactive_channels(topic)
                    if channels is not None:
                        inactive[topic] = channels or None
            return v1_json({"topics": inactive, "message": warnings.message})
        return v1_json({"topics": result.value, "message": warnings.message})

    async def _inactive_channels(self, topic: str) -> list[str] | None:
        """The channels of a topic no nsqd produces; None when it has producers."""
        try:
            producers = await self.ci.get_lookupd_topic_producers(topic, self.lookupds)
        except cluster.UpstreamError:
            producers = cluster.Result([])
        if producers.value:
            return None
        try:
            return (await self.ci.get_lookupd_topic_channels(topic, self.lookupds)).value
        except cluster.UpstreamError:
            return []

    async def topic_producers(self, topic: str, warnings: Warnings) -> tuple[list[Json], set[str]]:
        """The producers of a topic, plus (lookupd mode) the nodes tombstoned for it, which
        lookupd's ``/lookup`` leaves out and Go's pages hide. Returns the tombstoned nodes'
        HTTP addresses too."""
        try:
            result = await self.ci.get_topic_producers(topic, self.lookupds, self.nsqds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "get topic producers", exc) from None
        warnings.add(result.failures)
        producers = list(result.value)
        tombstoned: set[str] = set()
        if self.lookupds:
            known = {http_address(p) for p in producers}
            try:
                nodes = await self.ci.get_lookupd_producers(self.lookupds)
            except cluster.UpstreamError:
                nodes = cluster.Result([])
            for node in nodes.value:
                for entry in node["topics"] or []:
                    if entry["topic"] == topic and entry["tombstoned"]:
                        tombstoned.add(http_address(node))
                        if http_address(node) not in known:
                            producers.append(node)
        return producers, tombstoned

    async def _stats(
        self,
        producers: list[Json],
        topic: str,
        channel: str,
        include_clients: bool,
        warnings: Warnings,
        what: str,
    ) -> NodeStats:
        if not producers:  # Go answers 502 "failed to query any nsqd: " here; nothing failed
            return NodeStats([], {})
        try:
            result = await self.ci.get_nsqd_stats(producers, topic, channel, include_clients)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, f"get {what}", exc) from None
        warnings.add(result.failures)
        return result.value

    async def topic(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        warnings = Warnings(self.logger)
        producers, tombstoned = await self.topic_producers(topic, warnings)
        stats = await self._stats(producers, topic, "", False, warnings, "topic metadata")
        total = new_topic_aggregate(topic)
        for node_stats in stats.topics:
            node_stats["tombstoned"] = node_stats["node"] in tombstoned
            topic_add(total, node_stats)
        total["message"] = warnings.message
        total["unreachable"] = warnings.unreachable()
        return v1_json(total)

    async def channel(self, request: web.Request) -> web.Response:
        topic, channel = request.match_info["topic"], request.match_info["channel"]
        warnings = Warnings(self.logger)
        producers, tombstoned = await self.topic_producers(topic, warnings)
        stats = await self._stats(producers, topic, channel, True, warnings, "channel metadata")
        body: dict[str, Any] = dict(stats.channels.get(channel) or {})
        for node_stats in body.get("nodes") or []:
            node_stats["tombstoned"] = node_stats["node"] in tombstoned
        body["message"] = warnings.message
        body["unreachable"] = warnings.unreachable()
        return v1_json(body)

    async def inspect_channel(self, request: web.Request) -> web.Response:
        """nsqpy: what a channel holds, without consuming (nsqd ``--enable-inspect``). Message
        bodies can be sensitive: with ``--admin-user`` only admins may read them."""
        self.require_admin(request)
        topic, channel = request.match_info["topic"], request.match_info["channel"]
        if not is_valid_topic_name(topic):
            raise ApiError(400, "INVALID_TOPIC")
        if not is_valid_channel_name(channel):
            raise ApiError(400, "INVALID_CHANNEL")
        limit = _inspect_limit(request.query.get("n"))
        warnings = Warnings(self.logger)
        producers, _ = await self.topic_producers(topic, warnings)
        found = Inspection([], [])
        if producers:
            try:
                result = await self.ci.inspect_channel(producers, topic, channel, limit)
            except cluster.UpstreamError as exc:
                raise upstream_error(self.logger, "inspect channel", exc) from None
            warnings.add(result.failures)
            found = result.value
        body = {
            "topic_name": topic,
            "channel_name": channel,
            "n": limit,
            "nodes": found.nodes,
            "unsupported": found.unsupported,
            "message": warnings.message,
            "unreachable": warnings.unreachable(),
        }
        return v1_json(body)

    async def _producers(self, warnings: Warnings, what: str) -> list[Json]:
        try:
            result = await self.ci.get_producers(self.lookupds, self.nsqds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, what, exc) from None
        warnings.add(result.failures)
        return result.value

    async def nodes(self, request: web.Request) -> web.Response:
        warnings = Warnings(self.logger)
        producers = await self._producers(warnings, "get nodes")
        unreachable = warnings.unreachable()
        listed = {u["address"] for u in unreachable}
        for failure in self.admin.unreachable_nodes():  # the poller's view of the nsqd
            if failure["address"] not in listed:
                unreachable.append(failure)
        body = {"nodes": producers, "message": warnings.message, "unreachable": unreachable}
        return v1_json(body)

    async def node(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        warnings = Warnings(self.logger)
        producers = await self._producers(warnings, "get producers")
        producer = next((p for p in producers if http_address(p) == node), None)
        if producer is None:
            raise ApiError(404, "NODE_NOT_FOUND")
        try:
            result = await self.ci.get_nsqd_stats([producer], "", "", True)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "get nsqd stats", exc) from None
        topics = result.value.topics
        total_clients = sum(len(c["clients"] or []) for t in topics for c in t["channels"] or [])
        body = {
            "node": node,
            "topics": topics,
            "total_messages": sum(t["message_count"] for t in topics),
            "total_clients": total_clients,
            "message": warnings.message,
            "total_topics": len(topics),
            "unreachable": warnings.unreachable(),
        }
        replication = result.value.replication.get(node)
        if replication is not None:  # the node page's Replication table; absent otherwise
            body["replication"] = replication
        return v1_json(body)

    async def counter(self, request: web.Request) -> web.Response:
        warnings = Warnings(self.logger)
        producers = await self._producers(warnings, "get counter producer list")
        stats = await self._stats(producers, "", "", False, warnings, "nsqd stats")
        counters: dict[str, dict[str, Any]] = {}
        for aggregate in stats.channels.values():
            for node_stats in aggregate["nodes"] or []:
                key = f"{aggregate['topic_name']}:{aggregate['channel_name']}:{node_stats['node']}"
                entry = counters.setdefault(
                    key,
                    {
                        "node": node_stats["node"],
                        "topic_name": aggregate["topic_name"],
                        "channel_name": aggregate["channel_name"],
                        "message_count": 0,
                    },
                )
                entry["message_count"] += node_stats["message_count"]
        return v1_json({"stats": counters, "message": warnings.message})

    # ------------------------------------------------------------------ graphite

    async def graphite(self, request: web.Request) -> web.Response:
        if request.query.get("metric") != "rate":
            raise ApiError(400, "INVALID_ARG_METRIC")
        target = request.query.get("target")
        if target is None:
            raise ApiError(400, "INVALID_ARG_TARGET")
        interval = int(self.opts.statsd_interval)
        params = {
            "format": "json",
            "from": f"-{interval * 2}sec",
            "target": target,
            "until": f"-{interval}sec",
        }
        url = f"{self.opts.graphite_url}/render?{urlencode(params)}"
        self.logger.info(f"GRAPHITE: {url}")
        try:
            response = await self.ci.client.get_v1(url)
            rate = float(response[0]["datapoints"][0][0])
        except (RequestError, ValueError, TypeError, KeyError, IndexError) as exc:
            self.logger.error(f"graphite request failed - {exc}")
            raise ApiError(500, "INTERNAL_ERROR") from None
        text = "N/A" if rate < 0 else f"{rate / interval:.2f}"
        return v1_json({"rate": text})

    async def render_proxy(self, request: web.Request) -> web.Response:
        """``--proxy-graphite``: ``GET <base>/render`` forwarded to Graphite, with the basic
        auth of the Graphite URL's user info."""
        target = urlsplit(self.opts.graphite_url)
        url = f"{target.scheme}://{target.hostname}"
        if target.port:
            url += f":{target.port}"
        url += request.rel_url.raw_path
        if request.rel_url.raw_query_string:
            url += "?" + request.rel_url.raw_query_string
        auth = None
        if target.username is not None:
            auth = aiohttp.BasicAuth(target.username, target.password or "")
        session = self.ci.client.session()
        try:
            async with session.get(url, auth=auth) as upstream:
                body = await upstream.read()
                content_type = upstream.headers.get("Content-Type", "")
                status = upstream.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.logger.error(f"graphite proxy error - {exc}")
            return web.Response(status=502)
        response = web.Response(body=body, status=status)
        if content_type:
            response.headers["Content-Type"] = content_type
        return response

    # ------------------------------------------------------------------ nsqpy: the poller

    async def overview(self, request: web.Request) -> web.Response:
        return v1_json(self.admin.history.overview())

    async def history(self, request: web.Request) -> web.Response:
        """A series' points; a well-formed name the poller has not met (yet) has none: 200
        with ``[]``, so a page opened on a new topic does not see an error."""
        query = request.query
        history = self.admin.history
        if "node" in query:
            if not is_valid_node(query["node"]):
                raise ApiError(400, "INVALID_NODE")
            points = history.node_points(query["node"])
        elif "topic" in query:
            if not is_valid_topic_name(query["topic"]):
                raise ApiError(400, "INVALID_TOPIC")
            if "channel" in query:
                if not is_valid_channel_name(query["channel"]):
                    raise ApiError(400, "INVALID_CHANNEL")
                points = history.channel_points(query["topic"], query["channel"])
            else:
                points = history.topic_points(query["topic"])
        else:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        return v1_json({"interval_ms": history.interval_ms, "points": points or []})
