"""nsqlookupd's Prometheus ``/metrics`` (nsqpy addition; docs/beyond-go.md).

Read from the registration database at scrape time: the active nsqd producers, and per topic
how many producers serve it and how many channels it has.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from ..internal.metrics import Families, new_registry
from .registration_db import filter_active
from .tcp import CLIENT_REGISTRATION

if TYPE_CHECKING:
    from .nsqlookupd import NSQLookupd


def build_registry(lookupd: NSQLookupd) -> CollectorRegistry:
    started = time.time()
    return new_registry(lambda families: collect(lookupd, started, families))


def collect(lookupd: NSQLookupd, started: float, out: Families) -> None:
    db = lookupd.db
    opts = lookupd.options
    now = lookupd.clock()
    active = filter_active(
        db.find_producers(*CLIENT_REGISTRATION), opts.inactive_producer_timeout, 0.0, now
    )
    out.gauge(
        "nsqlookupd_uptime_seconds",
        "Seconds since nsqlookupd started",
        (),
        (),
        time.time() - started,
    )
    out.gauge("nsqlookupd_producer_count", "Active nsqd producers", (), (), len(active))
    out.gauge(
        "nsqlookupd_tcp_connection_count", "nsqd TCP connections", (), (), len(lookupd.tcp_clients)
    )
    topics = db.keys("topic")
    out.gauge("nsqlookupd_topic_count", "Registered topics", (), (), len(topics))
    for topic in topics:
        producers = filter_active(
            db.find_producers("topic", topic, ""),
            opts.inactive_producer_timeout,
            opts.tombstone_lifetime,
            now,
        )
        labels = (topic,)
        out.gauge(
            "nsqlookupd_topic_producer_count",
            "Active producers of the topic",
            ("topic",),
            labels,
            len(producers),
        )
        out.gauge(
            "nsqlookupd_topic_channel_count",
            "Registered channels of the topic",
            ("topic",),
            labels,
            len(db.subkeys("channel", topic)),
        )
