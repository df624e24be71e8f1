"""Shared helpers for the beyond-Go tests: daemons that are always stopped, /metrics parsing."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from nsqpy.testing import DaemonProcess

from ..nsqd import nsqd_storage_support as storage
from ..raw_v2 import http_request

Labels = tuple[tuple[str, str], ...]


def launch(daemons: list[DaemonProcess], data_path: Path, *args: str) -> DaemonProcess:
    """nsqd with a short queue scan interval, stopped by the ``daemons`` fixture."""
    return storage.launch(daemons, data_path, "--queue-scan-interval=20ms", *args)


def scrape(daemon: DaemonProcess) -> dict[str, tuple[str, dict[Labels, float]]]:
    """``/metrics`` parsed by prometheus_client: family name -> (type, {labels: value})."""
    resp = http_request(daemon, "GET", "/metrics")
    assert resp.status == 200, resp.body
    assert (resp.header("Content-Type") or "").startswith("text/plain; version=0.0.4")
    out: dict[str, tuple[str, dict[Labels, float]]] = {}
    for family in text_string_to_metric_families(resp.body.decode()):
        samples = {tuple(sorted(s.labels.items())): s.value for s in family.samples}
        out[family.name] = (family.type, samples)
    return out


def labels(**values: str) -> Labels:
    return tuple(sorted(values.items()))


def value(metrics: dict[str, tuple[str, dict[Labels, float]]], name: str, **lbl: str) -> float:
    _, samples = metrics[name]
    return samples[labels(**lbl)]
