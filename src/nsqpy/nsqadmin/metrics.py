"""nsqadmin's Prometheus ``/metrics`` (nsqpy addition): the cluster as the poller last saw it.

Cluster-level gauges, built at scrape time from the last poll (no upstream request per
scrape): per topic its depths, message count and rates; per channel its depth and rates; how
many nsqd and lookupd answered. Per-node detail is each nsqd's own ``/metrics``. Empty until
the first poll, and empty with ``--poll-interval=0``.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..internal.http_api import RouteHandler
from .history import History

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TOPIC_GAUGES = (
    ("depth", "nsqadmin_topic_depth", "Messages queued in the topic itself, all nsqd"),
    ("channel_depth", "nsqadmin_topic_channel_depth", "Messages queued in the topic's channels"),
    ("message_count", "nsqadmin_topic_message_count", "Messages published to the topic, all nsqd"),
    ("rate_in", "nsqadmin_topic_rate_in", "Messages/s published (last poll interval)"),
    ("rate_out", "nsqadmin_topic_rate_out", "Messages/s finished, all channels"),
    ("depth_trend", "nsqadmin_topic_depth_trend", "Backlog change in messages/s over the history"),
    ("producer_count", "nsqadmin_topic_producers", "nsqd producing the topic"),
)
_CHANNEL_GAUGES = (
    ("depth", "nsqadmin_channel_depth", "Messages queued in the channel, all nsqd"),
    ("rate_in", "nsqadmin_channel_rate_in", "Messages/s put on the channel"),
    ("rate_out", "nsqadmin_channel_rate_out", "Messages/s finished by the channel's consumers"),
)


class ClusterCollector(Collector):
    """Reads ``history`` at every scrape."""

    def __init__(self, history: History) -> None:
        self.history = history

    def collect(self) -> Iterable[Metric]:
        overview = self.history.overview()
        families: list[Metric] = []
        for key, name, doc in _TOPIC_GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["topic"])
            for row in overview["topics"]:
                family.add_metric([row["topic_name"]], float(row[key]))
            families.append(family)
        channels = self.history.latest_channels()
        for key, name, doc in _CHANNEL_GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["topic", "channel"])
            for (topic, channel), point in sorted(channels.items()):
                family.add_metric([topic, channel], float(point[key]))
            families.append(family)
        for kind, doc in (("nodes", "nsqd"), ("lookupd", "nsqlookupd")):
            family = GaugeMetricFamily(
                f"nsqadmin_{kind}", f"{doc} known, by state", labels=["state"]
            )
            counts = overview[kind]
            family.add_metric(["reachable"], float(counts["reachable"]))
            family.add_metric(["unreachable"], float(counts["total"] - counts["reachable"]))
            families.append(family)
        families.append(
            GaugeMetricFamily(
                "nsqadmin_last_poll_timestamp_seconds",
                "When the last poll completed (0: none yet)",
                value=overview["updated_at"] / 1000,
            )
        )
        return families

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked: the series vary with the cluster's topics


def metrics_handler(history: History) -> RouteHandler:
    """``GET /metrics`` for ``history`` (a registry of its own, never the global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(history))

    async def handle(request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    return handle
