"""Graceful drain on SIGTERM (--drain-timeout) against real nsqd and nsqlookupd processes."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from nsqpy.testing import DaemonProcess, start_nsqadmin, start_nsqlookupd

from ..raw_v2 import NsqConn, channel_stats, http_request, q, unique, wait_for, wait_until
from .support import launch


def lookup_producers(lookupd: DaemonProcess, topic: str) -> list[object]:
    resp = http_request(lookupd, "GET", "/lookup?" + q(topic=topic))
    if resp.status == 404:
        return []
    producers = resp.json()["producers"]
    assert isinstance(producers, list)
    return producers


def tcp_ports_listed(daemon: DaemonProcess, path: str) -> list[int]:
    """The nsqd TCP ports in nsqlookupd's ``/nodes`` (``producers``) or nsqadmin's
    ``/api/nodes`` (``nodes``)."""
    resp = http_request(daemon, "GET", path)
    assert resp.status == 200, resp.body
    body = resp.json()
    return sorted(int(node["tcp_port"]) for node in body.get("producers", body.get("nodes")))


def test_draining_nsqd_leaves_lookupd_nodes(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    """A draining nsqd is leaving: it closes its lookupd connections and stays away, so
    lookupd's /nodes (and nsqadmin's node list, built from it) stop listing it at once, not
    only its topics. Found by the chaos harness."""
    lookupd = start_nsqlookupd()
    daemons.append(lookupd)
    lookupd_tcp = "{}:{}".format(*lookupd.tcp_address)
    lookupd_http = "{}:{}".format(*lookupd.http_address)
    admin = start_nsqadmin(f"--lookupd-http-address={lookupd_http}")
    daemons.append(admin)
    (tmp_path / "drains").mkdir()
    (tmp_path / "stays").mkdir()
    nsqd = launch(
        daemons, tmp_path / "drains", "--drain-timeout=30s", f"--lookupd-tcp-address={lookupd_tcp}"
    )
    other = launch(daemons, tmp_path / "stays", f"--lookupd-tcp-address={lookupd_tcp}")
    both = sorted([nsqd.tcp_address[1], other.tcp_address[1]])
    wait_until(lambda: tcp_ports_listed(lookupd, "/nodes") == both, timeout=10, what="listed")
    wait_until(lambda: tcp_ports_listed(admin, "/api/nodes") == both, timeout=10)

    topic = unique("leaving")
    NsqConn(nsqd.tcp_address).pub(topic, b"held")
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    consumer.rdy(1)
    held = consumer.expect_message()  # in flight: the drain waits for it
    assert nsqd.proc is not None
    nsqd.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: http_request(nsqd, "GET", "/ping").status == 503, timeout=5)

    alone = [other.tcp_address[1]]
    wait_for(lambda: tcp_ports_listed(lookupd, "/nodes"), alone.__eq__, 5, "left /nodes")
    wait_for(lambda: tcp_ports_listed(admin, "/api/nodes"), alone.__eq__, 5, "left nsqadmin")
    time.sleep(1.0)  # ten reconnect delays: a draining nsqd must not come back
    assert tcp_ports_listed(lookupd, "/nodes") == alone
    assert nsqd.proc.poll() is None  # still draining, still delivering

    consumer.fin(held.id)
    assert nsqd.proc.wait(15) == 0
    consumer.close()


def test_drain_with_slow_consumer_and_lookupd(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    lookupd = start_nsqlookupd()
    daemons.append(lookupd)
    host, port = lookupd.tcp_address
    nsqd = launch(daemons, tmp_path, "--drain-timeout=20s", f"--lookupd-tcp-address={host}:{port}")
    topic = unique("drain")
    bodies = [b"d%02d" % i for i in range(15)]
    NsqConn(nsqd.tcp_address).mpub(topic, bodies)
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "slow")
    wait_until(lambda: lookup_producers(lookupd, topic), timeout=10)
    consumer.rdy(1)
    received = [consumer.expect_message()]

    assert nsqd.proc is not None
    nsqd.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: http_request(nsqd, "GET", "/ping").status == 503, timeout=5)
    assert http_request(nsqd, "GET", "/ping").body == b"DRAINING"
    wait_until(lambda: not lookup_producers(lookupd, topic), timeout=10, what="unregistered")

    publisher = NsqConn(nsqd.tcp_address)
    publisher.send(b"PUB " + topic.encode() + b"\n" + len(b"late").to_bytes(4, "big") + b"late")
    publisher.expect_error("E_PUB_FAILED PUB failed draining")
    mpub = NsqConn(nsqd.tcp_address)
    mpub.send(
        b"MPUB "
        + topic.encode()
        + b"\n"
        + (4 + 4 + 1 + 4 + 1).to_bytes(4, "big")
        + (2).to_bytes(4, "big")
        + (1).to_bytes(4, "big")
        + b"x"
        + (1).to_bytes(4, "big")
        + b"y"
    )
    mpub.expect_error("E_MPUB_FAILED MPUB failed draining")
    resp = http_request(nsqd, "POST", "/pub?" + q(topic=topic), b"late")
    assert resp.status == 503 and resp.json() == {"message": "DRAINING"}

    # the slow consumer still gets everything, one at a time
    consumer.fin(received[0].id)
    while len(received) < len(bodies):
        msg = consumer.expect_message(timeout=10, skip_heartbeats=True)
        time.sleep(0.02)
        consumer.fin(msg.id)
        received.append(msg)
    assert [m.body for m in received] == bodies
    assert nsqd.proc.wait(15) == 0  # exits by itself once the channel is empty
    consumer.close()

    nsqd.start()  # nothing left behind, and nothing lost
    c = wait_until(lambda: channel_stats(nsqd, topic, "slow"))
    assert c is not None and c["depth"] == 0


def test_drain_timeout_persists_what_is_left(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    nsqd = launch(daemons, tmp_path, "--drain-timeout=600ms")
    topic = unique("left")
    NsqConn(nsqd.tcp_address).mpub(topic, [b"a", b"b", b"c"])
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "stuck")
    consumer.rdy(1)
    held = consumer.expect_message()  # never finished
    assert nsqd.proc is not None
    started = time.monotonic()
    nsqd.proc.send_signal(signal.SIGTERM)
    try:
        code = nsqd.proc.wait(15)
    except subprocess.TimeoutExpired:
        raise AssertionError("nsqd did not stop after the drain timeout") from None
    assert code == 0
    assert time.monotonic() - started >= 0.5  # it waited for the drain
    consumer.close()
    nsqd.start()
    c = wait_until(lambda: channel_stats(nsqd, topic, "stuck"))
    assert c is not None and c["depth"] == 3  # the in-flight one and the two queued, persisted
    again = NsqConn(nsqd.tcp_address)
    again.sub(topic, "stuck")
    again.rdy(3)
    got = sorted(again.expect_message().body for _ in range(3))
    assert got == [b"a", b"b", b"c"] and held.body in got
    again.close()


def test_second_signal_ends_drain_and_default_is_immediate(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    nsqd = launch(daemons, tmp_path / "a", "--drain-timeout=60s")
    topic = unique("twice")
    NsqConn(nsqd.tcp_address).pub(topic, b"x")
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    consumer.rdy(1)
    consumer.expect_message()
    assert nsqd.proc is not None
    nsqd.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: http_request(nsqd, "GET", "/ping").status == 503)
    nsqd.proc.send_signal(signal.SIGINT)
    assert nsqd.proc.wait(15) == 0
    consumer.close()

    plain = launch(daemons, tmp_path / "b")
    NsqConn(plain.tcp_address).pub(topic, b"x")
    held = NsqConn(plain.tcp_address)
    held.sub(topic, "c")
    held.rdy(1)
    held.expect_message()
    started = time.monotonic()
    assert plain.stop() == 0
    assert time.monotonic() - started < 5  # Go's behaviour: no waiting for in-flight messages
    held.close()
