"""Shared helpers for the beyond-Go tests: daemons that are always stopped, /metrics parsing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import http_request

Labels = tuple[tuple[str, str], ...]


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    """Every daemon a test starts goes in this list and is stopped afterwards."""
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        daemon.stop()


def launch(daemons: list[DaemonProcess], data_path: Path, *args: str) -> DaemonProcess:
    nsqd = start_nsqd(data_path, "--queue-scan-interval=20ms", *args)
    daemons.append(nsqd)
    return nsqd


def scrape(daemon: DaemonProcess) -> dict[str, tuple[str, dict[Labels, float]]]:
    """``/metrics`` parsed by prometheus_client: family name -> (type, {labels: value})."""
    resp = http_request(daemon, "GET", "/metrics")
    assert resp.status == 200, resp.body
    assert resp.header("Content-Type") or "".startswith("text/plain; version=0.0.4")
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
