"""Replication in text ``/stats`` and ``/metrics`` of real nsqd processes (docs/replication.md):
a ``Replication:`` block and ``nsq_replication_*`` series only with --replica-peer, showing
each peer's state, the copies held for it and those taken over after it is gone."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import NsqConn, free_port, http_request, pub_cmd, unique, wait_until

#: short, so that a killed node is taken over within the test's bounds
REPLICA_TIMEOUT = "1s"


def get_text(node: DaemonProcess, path: str) -> str:
    response = http_request(node, "GET", path)
    assert response.status == 200
    return response.body.decode()


def peer_stats(node: DaemonProcess, peer: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(get_text(node, "/stats?format=json"))
    return next(p for p in body["replication"]["peers"] if p["address"] == peer)


class Pair:
    """Two nsqd naming each other as --replica-peer, on TCP ports chosen up front."""

    def __init__(self, base: Path) -> None:
        self.ports = [free_port(), free_port()]
        self.nodes: list[DaemonProcess] = []
        for index in (0, 1):
            data = base / f"node{index}"
            data.mkdir()
            self.nodes.append(
                start_nsqd(
                    data,
                    f"--tcp-address={self.address(index)}",
                    f"--replica-peer={self.address(1 - index)}",
                    "--replica-acks=2",
                    f"--replica-timeout={REPLICA_TIMEOUT}",
                    f"--node-id={index + 1}",
                )
            )

    def address(self, index: int) -> str:
        return f"127.0.0.1:{self.ports[index]}"

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()


def linked(pair: Pair, index: int) -> bool:
    return peer_stats(pair.nodes[index], pair.address(1 - index))["state"] == "connected"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    running = Pair(tmp_path)
    try:
        wait_until(lambda: all(linked(running, i) for i in (0, 1)), 15.0, "both links up")
        yield running
    finally:
        running.stop()


def publish_three(pair: Pair) -> None:
    """Three messages owned by node 0 on a topic with a channel (so node 1 holds copies)."""
    owner = pair.nodes[0]
    topic = unique("vis")
    assert http_request(owner, "POST", f"/topic/create?topic={topic}").status == 200
    assert http_request(owner, "POST", f"/channel/create?topic={topic}&channel=c").status == 200
    conn = NsqConn(owner.tcp_address)
    for body in (b"one", b"two", b"three"):
        conn.send(pub_cmd(topic, body))
        conn.expect_ok()
    wait_until(lambda: peer_stats(pair.nodes[1], pair.address(0))["held_copies"] == 3, 15.0)


def peer_line(text: str, peer: str) -> str:
    block = text.partition("\nReplication:\n")[2]
    return next(line for line in block.splitlines() if line.startswith(f"   [{peer} "))


def test_text_stats_ends_with_the_replication_block(pair: Pair) -> None:
    publish_three(pair)
    holder, owner = pair.nodes[1], pair.address(0)
    incarnation = json.loads(get_text(holder, "/stats?format=json"))["replication"]["incarnation"]
    text = get_text(holder, "/stats")
    # After Go's layout, which is unchanged: the producers come last before the block.
    assert text.index("\nProducers:") < text.index("\nReplication:\n")
    assert f"   node: {pair.address(1)} incarnation: {incarnation} acks: 2 seq: " in text
    line = peer_line(text, owner)
    assert re.search(r"state: connected +acked: \d+ +lag: \d+ +held: 3 +taken-over: 0$", line)

    pair.nodes[0].kill()
    wait_until(lambda: peer_stats(holder, owner)["taken_over"] == 3, 15.0, "takeover")
    line = peer_line(get_text(holder, "/stats"), owner)
    assert re.search(r"state: unreachable +acked: \d+ +lag: \d+ +held: 0 +taken-over: 3$", line)


def test_metrics_show_each_peer(pair: Pair) -> None:
    publish_three(pair)
    holder, owner = pair.nodes[1], pair.address(0)
    body = get_text(holder, "/metrics")
    assert "# TYPE nsq_replication_acks gauge\nnsq_replication_acks 2.0\n" in body
    assert "# TYPE nsq_replication_peer_up gauge\n" in body
    assert f'nsq_replication_peer_up{{peer="{owner}"}} 1.0\n' in body
    assert f'nsq_replication_held_copies{{peer="{owner}"}} 3.0\n' in body
    assert "# TYPE nsq_replication_taken_over_total counter\n" in body
    assert f'nsq_replication_taken_over_total{{peer="{owner}"}} 0.0\n' in body
    assert re.search(rf'^nsq_replication_peer_lag_events{{peer="{owner}"}} \d', body, re.M)
    # node 0 sees node 1 behind its stream by nothing once every PUB was acknowledged
    owner_body = get_text(pair.nodes[0], "/metrics")
    assert f'nsq_replication_peer_lag_events{{peer="{pair.address(1)}"}} 0.0\n' in owner_body

    pair.nodes[0].kill()
    wait_until(lambda: peer_stats(holder, owner)["taken_over"] == 3, 15.0, "takeover")
    body = get_text(holder, "/metrics")
    assert f'nsq_replication_peer_up{{peer="{owner}"}} 0.0\n' in body
    assert f'nsq_replication_held_copies{{peer="{owner}"}} 0.0\n' in body
    assert f'nsq_replication_taken_over_total{{peer="{owner}"}} 3.0\n' in body


def test_a_node_without_replication_shows_none_of_it(tmp_path: Path) -> None:
    node = start_nsqd(tmp_path)
    try:
        topic = unique("vis")
        assert http_request(node, "POST", f"/pub?topic={topic}", b"x").status == 200
        assert "Replication" not in get_text(node, "/stats")
        assert "nsq_replication" not in get_text(node, "/metrics")
        assert "replication" not in json.loads(get_text(node, "/stats?format=json"))
    finally:
        node.kill()
