"""nsqadmin's Prometheus /metrics: cluster gauges from the poller, parsed as Prometheus does."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from ..raw_v2 import wait_until
from .conftest import Cluster, StartAdmin, http


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body, headers = http(url + "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_cluster_gauges(cluster: Cluster, start_admin: StartAdmin) -> None:
    topic = cluster.new_topic("scraped")
    cluster.create_channel(topic, "c", 0)
    cluster.pub(topic, b"m", 0, 7)
    cluster.wait_registered(topic, 1)
    admin = start_admin()

    def seen() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        samples = scrape(admin.http_url)
        key = ("nsqadmin_channel_depth", (("channel", "c"), ("topic", topic)))
        return samples if samples.get(key) == 7 else None

    samples = wait_until(seen, what="the channel in /metrics", timeout=20.0)
    labels = (("topic", topic),)
    assert samples[("nsqadmin_topic_channel_depth", labels)] == 7
    assert samples[("nsqadmin_topic_message_count", labels)] == 7
    assert samples[("nsqadmin_topic_producers", labels)] == 1
    assert samples[("nsqadmin_nodes", (("state", "reachable"),))] == 2
    assert samples[("nsqadmin_nodes", (("state", "unreachable"),))] == 0
    assert samples[("nsqadmin_lookupd", (("state", "reachable"),))] == 1
    assert samples[("nsqadmin_last_poll_timestamp_seconds", ())] > 0


def test_metrics_without_the_poller(start_admin: StartAdmin) -> None:
    admin = start_admin("--poll-interval=0")
    samples = scrape(admin.http_url)
    assert samples[("nsqadmin_last_poll_timestamp_seconds", ())] == 0
    assert not any(name.startswith("nsqadmin_topic") for name, _ in samples)
