"""nsqadmin's Prometheus ``/metrics`` (nsqpy addition): the cluster as the poller last saw it.

Cluster-level gauges, built at scrape time from the last poll (no upstream request per
scrape): per topic its depths, message count and rates; per channel its depth and rates; how
many nsqd and lookupd answered. Per-node detail is each nsqd's own ``/metrics``. Empty until
the first poll, and empty with ``--poll-interval=0``. Built with ``nsqpy.internal.metrics``, as
nsqd's and nsqlookupd's.
"""

from __future__ import annotations

from ..internal.http_api import RouteHandler
from ..internal.metrics import Families, metrics_handler, new_registry
from .history import History

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
_STATES = (("nodes", "nsqd"), ("lookupd", "nsqlookupd"))


def collect(history: History, out: Families) -> None:
    """The cluster as the last poll saw it, into metric families (read at every scrape)."""
    overview = history.overview()
    for row in overview["topics"]:
        for key, name, doc in _TOPIC_GAUGES:
            out.gauge(name, doc, ["topic"], [row["topic_name"]], float(row[key]))
    for (topic, channel), point in sorted(history.latest_channels().items()):
        for key, name, doc in _CHANNEL_GAUGES:
            out.gauge(name, doc, ["topic", "channel"], [topic, channel], float(point[key]))
    for kind, daemon in _STATES:
        counts = overview[kind]
        doc = f"{daemon} known, by state"
        out.gauge(f"nsqadmin_{kind}", doc, ["state"], ["reachable"], float(counts["reachable"]))
        down = float(counts["total"] - counts["reachable"])
        out.gauge(f"nsqadmin_{kind}", doc, ["state"], ["unreachable"], down)
    out.gauge(
        "nsqadmin_last_poll_timestamp_seconds",
        "When the last poll completed (0: none yet)",
        [],
        [],
        overview["updated_at"] / 1000,
    )


def cluster_metrics_handler(history: History) -> RouteHandler:
    """``GET /metrics`` for ``history`` (a registry of its own, never the global one)."""
    return metrics_handler(new_registry(lambda families: collect(history, families)))
