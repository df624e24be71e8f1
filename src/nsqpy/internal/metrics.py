"""Prometheus exposition shared by the daemons: a collector that reads stats at scrape time.

Nothing is counted per message for metrics: each daemon already keeps plain-int counters for
/stats, and a scrape turns a snapshot of them into metric families. The daemons' modules
(``nsqd/metrics.py``, ``nsqlookupd/metrics.py``) only say which families to build.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .http_api import RouteHandler

#: The classic text exposition format, which every Prometheus version scrapes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Families:
    """Metric families keyed by name, created on first use, in a stable order."""

    def __init__(self) -> None:
        self._families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def gauge(
        self, name: str, doc: str, labels: Sequence[str], values: Sequence[str], value: float
    ) -> None:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = GaugeMetricFamily(name, doc, labels=list(labels))
        family.add_metric(list(values), value)

    def counter(
        self, name: str, doc: str, labels: Sequence[str], values: Sequence[str], value: float
    ) -> None:
        """A monotonic counter; prometheus_client exposes its sample as ``<name>_total``."""
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = CounterMetricFamily(name, doc, labels=list(labels))
        family.add_metric(list(values), value)

    def all(self) -> list[Metric]:
        return list(self._families.values())


class SnapshotCollector(Collector):
    """Calls ``build`` at every scrape; the families it fills are the whole exposition, so a
    deleted topic or channel simply has no series in the next scrape."""

    def __init__(self, build: Callable[[Families], None]) -> None:
        self._build = build

    def collect(self) -> Iterable[Metric]:
        families = Families()
        self._build(families)
        return families.all()

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked collector: the families vary with topics and channels


def new_registry(build: Callable[[Families], None]) -> CollectorRegistry:
    """A registry of its own (never the global one: several daemons may share a process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(build))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def metrics_handler(registry: CollectorRegistry) -> RouteHandler:
    """An aiohttp handler for ``GET /metrics`` serving ``registry`` in the text format."""

    async def handle(request: web.Request) -> web.Response:
        response = web.Response(body=exposition(registry))
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    return handle


def bool_label(value: bool) -> str:
    """Labels as Go's strconv.FormatBool (what nsq_exporter puts in ``paused``)."""
    return "true" if value else "false"
