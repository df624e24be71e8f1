"""nsqd's Prometheus ``/metrics`` (nsqpy addition; docs/beyond-go.md).

Built at scrape time from the same figures as ``/stats`` (``stats.get_stats_sliced``), so
nothing is counted per message for it; only the TCP byte totals are its own
(``NSQD.tcp_bytes``: one add per read or write call of a connection). The figures are read and
the text written (``internal.metrics.TextFamilies``) in slices between other loop work.

Names and labels follow lovoo/nsq_exporter (``nsq_topic_*`` with ``type, topic, paused``;
``nsq_channel_*`` with ``type, topic, channel, paused``; ``nsq_client_*``), so dashboards built
on it find their series. Where the exporter exposes a monotonic count as a gauge, this is a
counter of the same name (``# TYPE nsq_topic_message_count counter``; internal/metrics.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ...internal.http_api import RouteHandler
from ...internal.metrics import CONTENT_TYPE, Families, TextFamilies, bool_label
from ...protocol.names import is_ephemeral
from ..stats import get_stats_sliced, run_sliced

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..nsqd import NSQD

TOPIC_LABELS = ("type", "topic", "paused")
CHANNEL_LABELS = ("type", "topic", "channel", "paused")
CLIENT_LABELS = (
    "topic",
    "channel",
    "deflate",
    "snappy",
    "tls",
    "client_id",
    "hostname",
    "version",
    "remote_address",
)

PEER_LABELS = ("peer",)
_PEER_UP_DOC = "1 if the peer's replication link is connected, else 0"
_PEER_LAG_DOC = "Events of this node's stream the peer has not acknowledged"
_HELD_DOC = "Unfinished copies of the peer's messages held here"
_TAKEN_OVER_DOC = "Messages of the peer this node took over and delivers"

_TOPIC_GAUGES = (
    ("depth", "depth", "Queue depth (memory + backend)"),
    ("backend_depth", "backend_depth", "Queue backend (disk) depth"),
)
_CHANNEL_GAUGES = (
    ("depth", "depth", "Queue depth (memory + backend)"),
    ("backend_depth", "backend_depth", "Queue backend (disk) depth"),
    ("in_flight_count", "in_flight_count", "Messages in flight"),
    ("deferred_count", "deferred_count", "Deferred messages"),
    ("client_count", "client_count", "Number of consumers"),
)
_CHANNEL_COUNTERS = (
    ("message_count", "message_count", "Messages put on the channel"),
    ("requeue_count", "requeue_count", "Messages requeued (REQ)"),
    ("timeout_count", "timeout_count", "Messages that timed out in flight"),
)
_CLIENT_GAUGES = (
    ("state", "state", "State of client"),
    ("ready_count", "ready_count", "Ready count"),
    ("in_flight_count", "in_flight_count", "In flight count"),
    ("connect_ts", "connect_ts", "Connect timestamp"),
    ("sample_rate", "sample_rate", "Sample rate"),
)
_CLIENT_COUNTERS = (
    ("message_count", "message_count", "Messages sent to the client"),
    ("finish_count", "finish_count", "Messages finished by the client"),
    ("requeue_count", "requeue_count", "Messages requeued by the client"),
)


def metrics_route(nsqd: NSQD) -> RouteHandler:
    """``GET /metrics`` that never holds the loop long: the figures are read and
    the text is written in slices of about ``stats.SNAPSHOT_SLICE`` between other work."""

    async def handle(request: web.Request) -> web.Response:
        topics, _ = await get_stats_sliced(nsqd, "", "", include_clients=True)
        process = process_figures(nsqd, len(topics or []))
        out = TextFamilies()
        exclude = nsqd.options.metrics_exclude_ephemeral
        await run_sliced(fill_steps(process, topics or [], exclude, out))
        if nsqd.replication is not None:  # nothing of it without --replica-peer
            replication_metrics(nsqd.replication.stats(), out)
        return web.Response(body=out.exposition(), headers={"Content-Type": CONTENT_TYPE})

    return handle


def fill_steps(
    process: ProcessFigures,
    topics: list[dict[str, Any]],
    exclude_ephemeral: bool,
    out: Families | TextFamilies,
) -> Iterator[None]:
    """The families from figures already read, yielding after each channel."""
    process_metrics(process, out)
    for topic in topics:
        name = topic["topic_name"]
        if exclude_ephemeral and is_ephemeral(name):
            continue
        topic_metrics(topic, out)
        for channel in topic["channels"]:
            if exclude_ephemeral and is_ephemeral(channel["channel_name"]):
                continue
            channel_metrics(name, channel, out)
            yield


@dataclass(frozen=True)
class ProcessFigures:
    uptime: float
    healthy: bool
    draining: bool
    connections: int
    topic_count: int
    bytes_received: int
    bytes_sent: int


def process_figures(nsqd: NSQD, topic_count: int) -> ProcessFigures:
    received, sent = nsqd.tcp_bytes()
    return ProcessFigures(
        time.time() - nsqd.start_time,
        nsqd.writes.health_error is None,
        nsqd.draining,
        len(nsqd.clients),
        topic_count,
        received,
        sent,
    )


def process_metrics(process: ProcessFigures, out: Families | TextFamilies) -> None:
    out.gauge("nsq_uptime_seconds", "Seconds since nsqd started", (), (), process.uptime)
    out.gauge("nsq_health", "1 if nsqd is healthy (/ping OK), else 0", (), (), process.healthy)
    out.gauge("nsq_draining", "1 while nsqd drains before shutting down", (), (), process.draining)
    out.gauge("nsq_client_connections", "Open TCP client connections", (), (), process.connections)
    out.gauge("nsq_topic_count", "Number of topics", (), (), process.topic_count)
    out.counter(
        "nsq_tcp_bytes_received",
        "Bytes read from TCP client connections",
        (),
        (),
        process.bytes_received,
    )
    out.counter(
        "nsq_tcp_bytes_sent", "Bytes written to TCP client connections", (), (), process.bytes_sent
    )


def topic_metrics(topic: dict[str, Any], out: Families | TextFamilies) -> None:
    labels = ("topic", topic["topic_name"], bool_label(topic["paused"]))
    out.gauge(
        "nsq_topic_channel_count",
        "Number of channels",
        TOPIC_LABELS,
        labels,
        len(topic["channels"]),
    )
    for key, name, doc in _TOPIC_GAUGES:
        out.gauge(f"nsq_topic_{name}", doc, TOPIC_LABELS, labels, topic[key])
    out.counter(
        "nsq_topic_message_count",
        "Messages published",
        TOPIC_LABELS,
        labels,
        topic["message_count"],
    )
    out.counter(
        "nsq_topic_message_bytes",
        "Bytes of message bodies published",
        TOPIC_LABELS,
        labels,
        topic["message_bytes"],
    )
    queue_limit_metrics("nsq_topic", TOPIC_LABELS, labels, topic, out)
    e2e_metrics("nsq_topic", TOPIC_LABELS, labels, topic["e2e_processing_latency"], out)


def channel_metrics(topic_name: str, channel: dict[str, Any], out: Families | TextFamilies) -> None:
    labels = ("channel", topic_name, channel["channel_name"], bool_label(channel["paused"]))
    for key, name, doc in _CHANNEL_GAUGES:
        out.gauge(f"nsq_channel_{name}", doc, CHANNEL_LABELS, labels, channel[key])
    for key, name, doc in _CHANNEL_COUNTERS:
        out.counter(f"nsq_channel_{name}", doc, CHANNEL_LABELS, labels, channel[key])
    dead = channel.get("dead_letter_count")
    if dead is not None:
        out.counter(
            "nsq_channel_dead_letter_count",
            "Messages moved to the dead-letter topic",
            CHANNEL_LABELS,
            labels,
            dead,
        )
    queue_limit_metrics("nsq_channel", CHANNEL_LABELS, labels, channel, out)
    e2e_metrics("nsq_channel", CHANNEL_LABELS, labels, channel["e2e_processing_latency"], out)
    for client in channel["clients"] or []:
        client_metrics(topic_name, channel["channel_name"], client, out)


def client_metrics(
    topic: str, channel: str, client: dict[str, Any], out: Families | TextFamilies
) -> None:
    labels = (
        topic,
        channel,
        bool_label(client["deflate"]),
        bool_label(client["snappy"]),
        bool_label(client["tls"]),
        client["client_id"],
        client["hostname"],
        client["version"],
        client["remote_address"],
    )
    for key, name, doc in _CLIENT_GAUGES:
        out.gauge(f"nsq_client_{name}", doc, CLIENT_LABELS, labels, client[key])
    for key, name, doc in _CLIENT_COUNTERS:
        out.counter(f"nsq_client_{name}", doc, CLIENT_LABELS, labels, client[key])


def queue_limit_metrics(
    prefix: str,
    label_names: tuple[str, ...],
    labels: tuple[str, ...],
    stats: dict[str, Any],
    out: Families | TextFamilies,
) -> None:
    """nsqd --max-queue-bytes (queue_limits.py): only for queues with a cap or counts."""
    if "max_queue_bytes" not in stats:
        return
    out.gauge(
        f"{prefix}_max_queue_bytes",
        "Cap on the queue's bytes (0 = none)",
        label_names,
        labels,
        stats["max_queue_bytes"],
    )
    out.gauge(
        f"{prefix}_queue_bytes",
        "Bytes queued (memory + disk, as disk records)",
        label_names,
        labels,
        stats["queue_bytes"],
    )
    out.counter(
        f"{prefix}_queue_dropped_count",
        "Messages discarded by --queue-full-policy=drop-oldest",
        label_names,
        labels,
        stats["queue_dropped_count"],
    )
    out.counter(
        f"{prefix}_queue_refused_count",
        "Published messages refused because a queue was full",
        label_names,
        labels,
        stats["queue_refused_count"],
    )


def replication_metrics(replication: dict[str, Any], out: Families | TextFamilies) -> None:
    """``--replica-peer`` (docs/replication.md): this node's acks and, per peer, its link,
    how far behind this node's stream it is, and the copies of its messages held here."""
    out.gauge(
        "nsq_replication_acks",
        "Durable copies a publish waits for, this node's included (--replica-acks)",
        (),
        (),
        replication["acks"],
    )
    for peer in replication["peers"]:
        labels = (peer["address"],)
        up = peer["state"] == "connected"
        out.gauge("nsq_replication_peer_up", _PEER_UP_DOC, PEER_LABELS, labels, up)
        out.gauge(
            "nsq_replication_peer_lag_events", _PEER_LAG_DOC, PEER_LABELS, labels, peer["lag"]
        )
        out.gauge(
            "nsq_replication_held_copies", _HELD_DOC, PEER_LABELS, labels, peer["held_copies"]
        )
        out.counter(
            "nsq_replication_taken_over_total",
            _TAKEN_OVER_DOC,
            PEER_LABELS,
            labels,
            peer["taken_over"],
        )


def e2e_metrics(
    prefix: str,
    label_names: tuple[str, ...],
    labels: tuple[str, ...],
    e2e: dict[str, Any],
    out: Families | TextFamilies,
) -> None:
    """``--e2e-processing-latency-percentile`` results, in seconds, one series per quantile."""
    for item in e2e["percentiles"] or []:
        out.gauge(
            f"{prefix}_e2e_processing_latency_seconds",
            "End-to-end processing latency quantile over the window",
            (*label_names, "quantile"),
            (*labels, f"{item['quantile']:g}"),
            item["value"] / 1e9,
        )
