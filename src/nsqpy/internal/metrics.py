"""Prometheus exposition shared by the daemons: a collector that reads stats at scrape time.

Nothing is counted per message for metrics: each daemon already keeps plain-int counters for
/stats, and a scrape turns a snapshot of them into metric families. The daemons' modules
(``nsqd/beyond/metrics.py``, ``nsqlookupd/metrics.py``) only say which families to build.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from .http_api import RouteHandler

#: The classic text exposition format, which every Prometheus version scrapes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class FamilyBuilder:
    """What a daemon's metrics module fills: gauges and counters by family name, with labels.
    :class:`Families` keeps prometheus_client objects; :class:`TextFamilies` writes text."""

    def gauge(
        self, name: str, doc: str, labels: Sequence[str], values: Sequence[str], value: float
    ) -> None:
        self._add("gauge", name, doc, labels, values, value)

    def counter(
        self, name: str, doc: str, labels: Sequence[str], values: Sequence[str], value: float
    ) -> None:
        """A monotonic counter whose series keeps ``name`` as it is (see :func:`exposition`)."""
        self._add("counter", name, doc, labels, values, value)

    def _add(
        self,
        kind: str,
        name: str,
        doc: str,
        labels: Sequence[str],
        values: Sequence[str],
        value: float,
    ) -> None:
        raise NotImplementedError


class Families(FamilyBuilder):
    """Metric families keyed by name, created on first use, in a stable order."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def _add(
        self,
        kind: str,
        name: str,
        doc: str,
        labels: Sequence[str],
        values: Sequence[str],
        value: float,
    ) -> None:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = Metric(name, doc, kind)
        family.samples.append(Sample(name, dict(zip(labels, values, strict=True)), value))

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


# prometheus_client writes a counter's HELP/TYPE lines as ``<name>_total``
_COUNTER_HEADER = re.compile(rb"^# (HELP|TYPE) (\w+)_total ", re.M)


def exposition(registry: CollectorRegistry) -> bytes:
    """The text format, with counters under nsq_exporter's names: its dashboards query
    ``nsq_topic_message_count``, not ``..._total``. The classic format (0.0.4) allows a counter
    without the suffix; Prometheus ingests these series as counters of exactly that name."""
    return _COUNTER_HEADER.sub(rb"# \1 \2 ", generate_latest(registry))


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


class TextFamilies(FamilyBuilder):
    """:class:`Families` written straight to the text format as samples arrive: the same
    bytes as :func:`exposition` of a registry holding the same families (tests check it),
    without building Metric and Sample objects, so a daemon can fill it in slices between
    other work and join it at the end (nsqd's ``/metrics`` with thousands of channels)."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[str]]] = {}
        self._label_order: dict[tuple[str, ...], tuple[int, ...]] = {}

    def _add(
        self,
        kind: str,
        name: str,
        doc: str,
        labels: Sequence[str],
        values: Sequence[str],
        value: float,
    ) -> None:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = (kind, doc, [])
        if not labels:
            family[2].append(f"{name} {floatToGoString(value)}\n")
            return
        names = tuple(labels)
        order = self._label_order.get(names)
        if order is None:  # the text format lists labels sorted by name
            order = self._label_order[names] = tuple(
                sorted(range(len(names)), key=names.__getitem__)
            )
        pairs = ",".join(f'{names[i]}="{_escape_label_value(values[i])}"' for i in order)
        family[2].append(f"{name}{{{pairs}}} {floatToGoString(value)}\n")

    def exposition(self) -> bytes:
        out: list[str] = []
        for name, (kind, doc, lines) in self._families.items():
            help_text = doc.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
            out.extend(lines)
        return "".join(out).encode()


def _escape_label_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value
