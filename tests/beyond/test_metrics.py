"""Prometheus /metrics on real nsqd and nsqlookupd processes, checked against /stats."""

from __future__ import annotations

import threading
from pathlib import Path

from nsqpy.testing import DaemonProcess, start_nsqlookupd

from ..raw_v2 import (
    NsqConn,
    channel_stats,
    http_ok,
    http_request,
    q,
    topic_stats,
    unique,
    wait_until,
)
from .support import launch, scrape, value


def test_metrics_match_stats_for_topics_channels_and_clients(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=5")
    topic, other = unique("metrics"), unique("metrics")
    pub = NsqConn(nsqd.tcp_address)
    pub.mpub(topic, [b"m%d" % i for i in range(20)])
    pub.mpub(other, [b"x"] * 3)
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "work")
    wait_until(lambda: (channel_stats(nsqd, topic, "work") or {}).get("client_count") == 1)
    consumer.rdy(4)
    held = [consumer.expect_message() for _ in range(4)]
    consumer.fin(held[0].id)
    consumer.req(held[1].id, 0)
    wait_until(lambda: channel_stats(nsqd, topic, "work")["requeue_count"] == 1)  # type: ignore[index]
    consumer.rdy(0)

    metrics = scrape(nsqd)
    t = topic_stats(nsqd, topic)
    c = channel_stats(nsqd, topic, "work")
    assert t is not None and c is not None
    tl = {"type": "topic", "topic": topic, "paused": "false"}
    cl = {"type": "channel", "topic": topic, "channel": "work", "paused": "false"}
    assert value(metrics, "nsq_topic_depth", **tl) == t["depth"]
    assert value(metrics, "nsq_topic_backend_depth", **tl) == t["backend_depth"]
    assert value(metrics, "nsq_topic_message_count", **tl) == t["message_count"] == 20
    assert value(metrics, "nsq_topic_channel_count", **tl) == 1
    for key in ("depth", "backend_depth", "in_flight_count", "deferred_count", "client_count"):
        assert value(metrics, f"nsq_channel_{key}", **cl) == c[key], key
    for key in ("message_count", "requeue_count", "timeout_count"):
        assert value(metrics, f"nsq_channel_{key}", **cl) == c[key], key
    assert c["in_flight_count"] >= 3 and c["backend_depth"] > 0  # memory and disk both used
    assert value(metrics, "nsq_topic_depth", type="topic", topic=other, paused="false") == 3

    (client,) = c["clients"]
    cli = {
        "topic": topic,
        "channel": "work",
        "deflate": "false",
        "snappy": "false",
        "tls": "false",
        "client_id": client["client_id"],
        "hostname": client["hostname"],
        "version": "V2",
        "remote_address": client["remote_address"],
    }
    assert value(metrics, "nsq_client_in_flight_count", **cli) == client["in_flight_count"]
    assert value(metrics, "nsq_client_finish_count", **cli) == 1
    assert value(metrics, "nsq_client_requeue_count", **cli) == 1
    assert value(metrics, "nsq_client_message_count", **cli) == client["message_count"]
    assert value(metrics, "nsq_client_connections") == 2
    assert value(metrics, "nsq_health") == 1
    assert value(metrics, "nsq_uptime_seconds") >= 0

    # types: counters are counters under the exporter's names (no _total), levels are gauges
    assert metrics["nsq_topic_message_count"][0] == "counter"
    assert metrics["nsq_channel_requeue_count"][0] == "counter"
    assert metrics["nsq_channel_depth"][0] == "gauge"
    body = http_ok(nsqd, "GET", "/metrics").decode()
    series = f'channel="work",paused="false",topic="{topic}",type="channel"'
    assert "# TYPE nsq_channel_requeue_count counter\n" in body
    assert f"nsq_channel_requeue_count{{{series}}} 1.0" in body
    assert "_total" not in body  # what dashboards built on nsq_exporter query
    consumer.close()
    pub.close()


def test_counters_stay_between_stats_readings_under_traffic(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=50")
    topic = unique("traffic")
    http_ok(nsqd, "POST", "/topic/create?" + q(topic=topic))
    http_ok(nsqd, "POST", "/channel/create?" + q(topic=topic, channel="c"))
    stop = threading.Event()

    def publish() -> None:
        conn = NsqConn(nsqd.tcp_address)
        for _ in range(400):  # bounded
            if stop.is_set():
                break
            conn.mpub(topic, [b"load"] * 10)
        conn.close()

    worker = threading.Thread(target=publish)
    worker.start()
    try:
        labels = {"type": "channel", "topic": topic, "channel": "c", "paused": "false"}
        last = 0.0
        for _ in range(10):
            before = channel_stats(nsqd, topic, "c")["message_count"]  # type: ignore[index]
            counted = value(scrape(nsqd), "nsq_channel_message_count", **labels)
            after = channel_stats(nsqd, topic, "c")["message_count"]  # type: ignore[index]
            assert before <= counted <= after
            assert counted >= last  # monotonic
            last = counted
    finally:
        stop.set()
        worker.join(30)
    final = channel_stats(nsqd, topic, "c")
    assert final is not None
    assert value(scrape(nsqd), "nsq_channel_message_count", **labels) == final["message_count"]
    assert value(scrape(nsqd), "nsq_channel_depth", **labels) == final["depth"]


def test_deleted_channel_series_disappear(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    nsqd = launch(daemons, tmp_path)
    topic = unique("gone")
    http_ok(nsqd, "POST", "/topic/create?" + q(topic=topic))
    http_ok(nsqd, "POST", "/channel/create?" + q(topic=topic, channel="doomed"))
    labels = {"type": "channel", "topic": topic, "channel": "doomed", "paused": "false"}
    assert value(scrape(nsqd), "nsq_channel_depth", **labels) == 0
    http_ok(nsqd, "POST", "/channel/delete?" + q(topic=topic, channel="doomed"))
    body = http_ok(nsqd, "GET", "/metrics").decode()
    assert '"doomed"' not in body
    http_ok(nsqd, "POST", "/topic/delete?" + q(topic=topic))
    assert topic not in http_ok(nsqd, "GET", "/metrics").decode()


def test_exclude_ephemeral_and_e2e_quantiles(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    nsqd = launch(
        daemons,
        tmp_path,
        "--metrics-exclude-ephemeral",
        "--e2e-processing-latency-percentile=0.5,0.99",
    )
    topic = unique("e2e")
    eph = unique("eph") + "#ephemeral"
    pub = NsqConn(nsqd.tcp_address)
    pub.pub(topic, b"one")
    pub.pub(eph, b"gone")
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    consumer.rdy(1)
    consumer.fin(consumer.expect_message().id)
    other = NsqConn(nsqd.tcp_address)
    other.sub(topic, "tmp#ephemeral")
    wait_until(lambda: channel_stats(nsqd, topic, "c")["e2e_processing_latency"]["count"] == 1)  # type: ignore[index]
    body = http_ok(nsqd, "GET", "/metrics").decode()
    assert "#ephemeral" not in body
    metrics = scrape(nsqd)
    labels = {"type": "channel", "topic": topic, "channel": "c", "paused": "false"}
    p99 = value(metrics, "nsq_channel_e2e_processing_latency_seconds", quantile="0.99", **labels)
    assert 0 < p99 < 60
    for conn in (pub, consumer, other):
        conn.close()


def test_metrics_can_be_turned_off(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    nsqd = launch(daemons, tmp_path, "--metrics=false")
    resp = http_request(nsqd, "GET", "/metrics")
    assert resp.status == 404 and resp.json() == {"message": "NOT_FOUND"}


def test_nsqlookupd_metrics(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    lookupd = start_nsqlookupd()
    daemons.append(lookupd)
    host, port = lookupd.tcp_address
    nsqd = launch(daemons, tmp_path, f"--lookupd-tcp-address={host}:{port}")
    topic = unique("lk")
    http_ok(nsqd, "POST", "/topic/create?" + q(topic=topic))
    http_ok(nsqd, "POST", "/channel/create?" + q(topic=topic, channel="a"))

    def registered() -> bool:
        metrics = scrape(lookupd)
        key = (("topic", topic),)
        channels = metrics.get("nsqlookupd_topic_channel_count", ("", {}))[1]
        producers = metrics.get("nsqlookupd_topic_producer_count", ("", {}))[1]
        return channels.get(key) == 1 and producers.get(key) == 1

    wait_until(registered, timeout=10)
    metrics = scrape(lookupd)
    assert value(metrics, "nsqlookupd_producer_count") == 1
    assert value(metrics, "nsqlookupd_topic_count") == 1
    assert metrics["nsqlookupd_uptime_seconds"][0] == "gauge"


def tcp_bytes(nsqd: DaemonProcess) -> tuple[float, float]:
    """nsqd-wide (received, sent) bytes on client TCP connections, from /metrics."""
    metrics = scrape(nsqd)
    assert metrics["nsq_tcp_bytes_received"][0] == "counter"
    assert metrics["nsq_tcp_bytes_sent"][0] == "counter"
    return value(metrics, "nsq_tcp_bytes_received"), value(metrics, "nsq_tcp_bytes_sent")


def test_tcp_bytes_count_payloads_and_survive_closed_connections(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(daemons, tmp_path)
    topic, count, size = unique("bytes"), 40, 1000
    received0, sent0 = tcp_bytes(nsqd)
    pub = NsqConn(nsqd.tcp_address)
    for index in range(count):
        pub.pub(topic, bytes([index]) * size)
    received1, sent1 = tcp_bytes(nsqd)
    assert received1 - received0 >= count * size  # every PUB body came in
    assert sent1 >= sent0

    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    consumer.rdy(count)
    for _ in range(count):
        msg = consumer.expect_message()
        assert len(msg.body) == size
        consumer.fin(msg.id)
    wait_until(lambda: channel_stats(nsqd, topic, "c")["in_flight_count"] == 0)  # type: ignore[index]
    received2, sent2 = tcp_bytes(nsqd)
    assert sent2 - sent1 >= count * (size + 30)  # each body in a frame with its 30-byte header
    assert received2 - received1 >= count * len(b"FIN %s\n" % (b"0" * 16))

    # closed connections stay counted: the totals never go down
    pub.close()
    consumer.close()
    wait_until(lambda: value(scrape(nsqd), "nsq_client_connections") == 0)
    received3, sent3 = tcp_bytes(nsqd)
    assert received3 >= received2 and sent3 >= sent2
    again = NsqConn(nsqd.tcp_address)
    again.pub(topic, b"x" * size)
    received4, sent4 = tcp_bytes(nsqd)
    assert received4 - received3 >= size and sent4 > sent3
    again.close()
