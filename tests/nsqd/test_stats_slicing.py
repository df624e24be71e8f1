"""/stats and /metrics are built in slices between other loop work. The sliced JSON
must be byte for byte what encoding the whole body at once gives, and a scrape of many
channels must leave a concurrent publisher waiting far less than the scrape takes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from nsqpy.internal.http_api import go_json
from nsqpy.nsqd.stats import stats_json, stats_json_steps
from nsqpy.testing import DaemonProcess

from ..raw_v2 import NsqConn, http_ok, http_request, q
from .nsqd_storage_support import launch


def channel(name: str, depth: int) -> dict[str, Any]:
    return {
        "channel_name": name,
        "depth": depth,
        "clients": [{"hostname": "h<&>", "ratio": 2.0, "sample_rate": 0.5}],
        "paused": False,
        "e2e_processing_latency": {"count": 0, "percentiles": [{"quantile": 0.99, "value": 3.0}]},
    }


def sliced(body: dict[str, Any]) -> bytes:
    out: list[bytes] = []
    steps = sum(1 for _ in stats_json_steps(body, out))
    assert steps >= sum(len(t["channels"]) for t in body["topics"] or [])
    return out[0]


def test_sliced_json_is_the_whole_encoding() -> None:
    topics = [
        {"topic_name": "a", "channels": [channel("c1", 1), channel("c2\u2028", 2)], "depth": 3},
        {"topic_name": "b#ephemeral", "channels": [], "depth": 0, "x": 1e22},
        {"topic_name": "c", "channels": [channel("channels", 7)], "depth": 7.0},
    ]
    health = 'NOK - "topics":[] "channels":[] <bad>'
    for body in (
        stats_json(topics, None, {"heap_objects": 0}, health, 1700000000),
        stats_json(topics, [{"client_id": "p", "pub_counts": []}], None, "OK", 1),
        stats_json([], None, None, "OK", 1),
        stats_json(None, None, None, "OK", 1),
    ):
        assert sliced(body) == go_json(body)


def test_scrapes_of_many_channels_do_not_hold_publishers(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    nsqd = launch(daemons, tmp_path)
    http_ok(nsqd, "POST", "/topic/create?" + q(topic="wide"))
    for index in range(1000):
        http_ok(nsqd, "POST", "/channel/create?" + q(topic="wide", channel=f"c{index}"))
    scraping = threading.Event()
    durations: list[float] = []

    def scrape() -> None:
        for path in ("/metrics", "/stats?format=json", "/stats") * 2:
            start = time.monotonic()
            assert http_request(nsqd, "GET", path, timeout=30).status == 200
            durations.append(time.monotonic() - start)
        scraping.set()

    round_trips: list[float] = []
    with NsqConn(nsqd.tcp_address) as pub:
        scraper = threading.Thread(target=scrape)
        scraper.start()
        while not scraping.is_set():
            start = time.monotonic()
            pub.pub("probe", b"x")
            round_trips.append(time.monotonic() - start)
        scraper.join()
    round_trips.sort()
    # unsliced, a PUB arriving during a scrape waited for most of it; sliced, for a slice
    assert round_trips[len(round_trips) // 2] < sorted(durations)[len(durations) // 2] / 4, (
        round_trips[len(round_trips) // 2],
        durations,
    )
