"""Replicated topics between real nsqd processes (docs/replication.md): the OK rule, copies
held on the peers and dropped on FIN, takeover of a killed node's unfinished messages,
group-wide channels, and ``  R1`` refused without --replica-peer."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import (
    NsqConn,
    dpub_cmd,
    free_port,
    http_request,
    mpub_cmd,
    pub_cmd,
    unique,
    wait_until,
)

TIMEOUT = "1s"


def wait_for(check: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
    """:func:`wait_until` with room for a group's links and takeovers on a loaded machine."""
    return wait_until(check, timeout, what)


def stats(node: DaemonProcess) -> dict[str, Any]:
    response = http_request(node, "GET", "/stats?format=json")
    assert response.status == 200
    data: dict[str, Any] = json.loads(response.body)
    return data


def peers_of(node: DaemonProcess) -> dict[str, dict[str, Any]]:
    return {peer["address"]: peer for peer in stats(node)["replication"]["peers"]}


def all_connected(nodes: list[DaemonProcess]) -> bool:
    return all(
        all(peer["state"] == "connected" for peer in peers_of(node).values()) for node in nodes
    )


def held_for(node: DaemonProcess, owner: str) -> int:
    count: int = peers_of(node)[owner]["held_copies"]
    return count


class Group:
    """nsqd processes that name one another as --replica-peer, on ports chosen up front."""

    def __init__(self, base: Path, size: int, acks: int, *extra: str) -> None:
        self.base = base
        self.timeout = TIMEOUT
        self.ports = [free_port() for _ in range(size)]
        self.acks = acks
        self.extra = extra
        self.nodes: list[DaemonProcess | None] = [None] * size

    def address(self, index: int) -> str:
        return f"127.0.0.1:{self.ports[index]}"

    def start(self, index: int) -> DaemonProcess:
        peers = [f"--replica-peer={self.address(i)}" for i in range(len(self.ports)) if i != index]
        data = self.base / f"node{index}"
        data.mkdir(exist_ok=True)
        node = start_nsqd(
            data,
            f"--tcp-address={self.address(index)}",
            *peers,
            f"--replica-acks={self.acks}",
            f"--replica-timeout={self.timeout}",
            f"--node-id={index + 1}",  # distinct message IDs across the group
            *self.extra,
        )
        self.nodes[index] = node
        return node

    def node(self, index: int) -> DaemonProcess:
        node = self.nodes[index]
        assert node is not None
        return node

    def stop(self) -> None:
        for node in self.nodes:
            if node is not None:
                node.kill()


@pytest.fixture
def group_factory(tmp_path: Path) -> Iterator[Callable[..., Group]]:
    groups: list[Group] = []

    def make(size: int, acks: int, *extra: str) -> Group:
        base = tmp_path / f"group{len(groups)}"
        base.mkdir()
        group = Group(base, size, acks, *extra)
        groups.append(group)
        return group

    yield make
    for group in groups:
        group.stop()


def started(group: Group, count: int) -> list[DaemonProcess]:
    nodes = [group.start(i) for i in range(count)]
    wait_for(lambda: all_connected(nodes), what="every link connected")
    return nodes


def survivors_in_order(group: Group, indexes: tuple[int, ...]) -> list[DaemonProcess]:
    """The nodes in the order the survivors of a lost node rank themselves for its takeover
    (by address: host, then port)."""
    ordered = sorted(indexes, key=lambda i: ("127.0.0.1", group.ports[i]))
    return [group.node(i) for i in ordered]


def first_address(group: Group, node: DaemonProcess) -> str:
    return next(group.address(i) for i, n in enumerate(group.nodes) if n is node)


def create_channel(node: DaemonProcess, topic: str, channel: str) -> None:
    assert http_request(node, "POST", f"/topic/create?topic={topic}").status == 200
    path = f"/channel/create?topic={topic}&channel={channel}"
    assert http_request(node, "POST", path).status == 200


def consumer(node: DaemonProcess, topic: str, channel: str, rdy: int = 1) -> NsqConn:
    conn = NsqConn(node.tcp_address)
    conn.send(f"SUB {topic} {channel}\n".encode())
    conn.expect_ok()
    conn.send(f"RDY {rdy}\n".encode())
    return conn


def test_a_publish_is_held_by_the_peers_until_finished(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory(3, 2)
    a, b, c = started(group, 3)
    topic, channel = unique("rep"), unique("ch")
    create_channel(a, topic, channel)
    pub = NsqConn(a.tcp_address)
    pub.send(pub_cmd(topic, b"hello"))
    pub.expect_ok()
    owner = group.address(0)
    wait_for(lambda: [held_for(p, owner) for p in (b, c)] == [1, 1], what="copies held for A")
    sub = consumer(a, topic, channel)
    msg = sub.expect_message()
    assert msg.body == b"hello"
    sub.send(b"FIN " + msg.id + b"\n")
    wait_for(lambda: [held_for(p, owner) for p in (b, c)] == [0, 0], what="copies dropped")
    a_stats = stats(a)["replication"]
    assert a_stats["acks"] == 2 and a_stats["address"] == owner
    assert all(peer["state"] == "connected" for peer in a_stats["peers"])


def test_the_ok_waits_for_the_peers_write_not_its_sync_timeout(
    group_factory: Callable[..., Group],
) -> None:
    """Under the default --sync-every a peer ACKs what it has written, as nsqd's own OK does
    not wait for an fsync: with a 60 s --sync-timeout every OK still comes at once."""
    group = group_factory(2, 2, "--sync-timeout=60s")
    a, b = started(group, 2)
    topic = unique("rep")
    pub = NsqConn(a.tcp_address)
    for index in range(20):
        pub.send(pub_cmd(topic, b"m%d" % index))
        pub.expect_ok(timeout=5.0)
    wait_for(lambda: held_for(b, group.address(0)) == 20, what="20 copies held for A")


def test_too_few_peers_reachable_fails_then_recovers(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory(2, 2, "--sync-every=1")
    a = group.start(0)
    topic = unique("rep")
    refused = {
        "E_PUB_FAILED PUB failed replicas 1 < 2": pub_cmd(topic, b"one"),
        "E_MPUB_FAILED MPUB failed replicas 1 < 2": mpub_cmd(topic, [b"one", b"two"]),
        "E_DPUB_FAILED DPUB failed replicas 1 < 2": dpub_cmd(topic, 100, b"one"),
    }
    for error, publish in refused.items():
        pub = NsqConn(a.tcp_address)
        pub.send(publish)
        pub.expect_error(error)  # fatal, as Go's E_PUB_FAILED
    response = http_request(a, "POST", f"/pub?topic={topic}", b"one")
    assert (response.status, response.body) == (503, b'{"message":"NOT_ENOUGH_REPLICAS"}')
    assert http_request(a, "POST", f"/mpub?topic={topic}", b"one\ntwo").status == 503
    b = group.start(1)
    wait_for(lambda: all_connected([a, b]), what="A and B linked")
    pub = NsqConn(a.tcp_address)
    pub.send(pub_cmd(topic, b"two"))
    pub.expect_ok()
    assert http_request(a, "POST", f"/pub?topic={topic}", b"three").status == 200
    assert http_request(a, "POST", f"/mpub?topic={topic}", b"four\nfive").status == 200
    pub.send(mpub_cmd(topic, [b"six", b"seven"]))
    pub.expect_ok()
    pub.send(dpub_cmd(topic, 100, b"eight"))
    pub.expect_ok()


def test_a_waiting_publish_fails_when_its_peer_stops_answering(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory(2, 2, "--sync-every=1")
    a, b = started(group, 2)
    topic = unique("rep")
    pub = NsqConn(a.tcp_address)
    pub.send(pub_cmd(topic, b"before"))
    pub.expect_ok()
    os.kill(b.pid, signal.SIGSTOP)  # B still counts as reachable for --replica-timeout
    try:
        pub.send(pub_cmd(topic, b"while paused"))
        started_at = time.monotonic()
        # refused at once if B already counts as unreachable, else after --replica-timeout
        pub.expect_error("E_PUB_FAILED PUB failed replicas 1 < 2", timeout=10)
        assert time.monotonic() - started_at < 8  # about two --replica-timeout at most
    finally:
        os.kill(b.pid, signal.SIGCONT)
    wait_for(lambda: all_connected([a, b]), what="B back")
    pub = NsqConn(a.tcp_address)
    pub.send(pub_cmd(topic, b"after"))
    pub.expect_ok()


@pytest.mark.parametrize(
    ("durable", "publish"),
    [(False, "pub"), (True, "pub"), (False, "mpub"), (True, "mpub")],
    ids=["memory", "durable", "memory-mpub", "durable-mpub"],
)
def test_takeover_of_a_killed_node(
    group_factory: Callable[..., Group], durable: bool, publish: str
) -> None:
    # --sync-every=1: each ACK at once (with the default the peers ACK at --sync-timeout);
    # durable: --mem-queue-size=0 too, every copy on disk (held until finished);
    # mpub: in MPUBs of 10, which the owner streams as runs
    extra = ["--sync-every=1", *(["--mem-queue-size=0"] if durable else [])]
    group = group_factory(3, 2, *extra)
    a, b, c = started(group, 3)
    topic, channel = unique("rep"), unique("ch")
    create_channel(a, topic, channel)
    pub = NsqConn(a.tcp_address)
    for index in range(100 if publish == "pub" else 0):
        pub.send(pub_cmd(topic, f"m{index}".encode()))
        pub.expect_ok()
    for start in range(0, 100 if publish == "mpub" else 0, 10):
        pub.send(mpub_cmd(topic, [f"m{index}".encode() for index in range(start, start + 10)]))
        pub.expect_ok()
    sub = consumer(a, topic, channel, rdy=30)
    finished = set()
    for _ in range(30):
        msg = sub.expect_message()
        sub.send(b"FIN " + msg.id + b"\n")
        finished.add(msg.body)
    owner = group.address(0)
    wait_for(lambda: [held_for(p, owner) for p in (b, c)] == [70, 70], what="70 held for A")
    a.kill()
    # within a few --replica-timeout: the first survivor by address takes over A's 70
    # unfinished messages; the other forgets its copies once the first streams them as its own
    first, second = survivors_in_order(group, (1, 2))
    taken = [peers_of(p)[owner]["taken_over"] for p in (first, second)]
    wait_for(
        lambda: [peers_of(p)[owner]["taken_over"] for p in (first, second)] == [70, 0],
        timeout=10,
        what=f"A's 70 taken over by the first survivor (had {taken})",
    )
    wait_for(lambda: held_for(second, owner) == 0, what="the other's copies forgotten")
    assert held_for(second, first_address(group, first)) == 70  # held for the first now
    got: set[bytes] = set()
    conn = consumer(first, topic, channel, rdy=200)
    for _ in range(70):
        msg = conn.expect_message()
        conn.send(b"FIN " + msg.id + b"\n")
        got.add(msg.body)
    conn.expect_nothing(0.5)  # and nothing more: none of the 30 finished comes back
    time.sleep(1.5)  # past the other's own turn (2 x --replica-timeout): nothing to take over
    consumer(second, topic, channel, rdy=200).expect_nothing(0.5)
    expected = {f"m{index}".encode() for index in range(100)} - finished
    assert got == expected
    assert not got & finished


def test_a_channel_created_on_one_node_exists_on_every_node(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory(3, 2)
    a, b, c = started(group, 3)
    topic, channel = unique("rep"), unique("ch")
    create_channel(a, topic, channel)

    def has_channel(node: DaemonProcess) -> bool:
        topics = {t["topic_name"]: t for t in stats(node)["topics"]}
        return topic in topics and any(
            ch["channel_name"] == channel for ch in topics[topic]["channels"]
        )

    for node in (b, c):
        wait_for(partial(has_channel, node), what="the channel on a peer")
    assert http_request(b, "POST", f"/channel/pause?topic={topic}&channel={channel}").status == 200

    def paused(node: DaemonProcess) -> bool:
        topics = {t["topic_name"]: t for t in stats(node)["topics"]}
        return any(
            ch["channel_name"] == channel and ch["paused"] for ch in topics[topic]["channels"]
        )

    def unpaused(node: DaemonProcess) -> bool:
        return not paused(node)

    for node in (a, c):
        wait_for(partial(paused, node), what="the pause on a peer")
    # a pause then an unpause, at once: every node ends unpaused, and nothing bounces on
    path = f"topic={topic}&channel={channel}"
    assert http_request(a, "POST", f"/channel/unpause?{path}").status == 200
    assert http_request(a, "POST", f"/channel/pause?{path}").status == 200
    assert http_request(a, "POST", f"/channel/unpause?{path}").status == 200
    for node in (a, b, c):
        wait_for(partial(unpaused, node), what="unpaused everywhere")
    streams = [stats(node)["replication"]["last_seq"] for node in (a, b, c)]
    time.sleep(0.5)
    assert [stats(node)["replication"]["last_seq"] for node in (a, b, c)] == streams


def test_r1_magic_without_replica_peer_is_a_bad_protocol(tmp_path: Path) -> None:
    with start_nsqd(tmp_path) as node:
        conn = NsqConn(node.tcp_address, magic=b"  R1")
        conn.expect_error("E_BAD_PROTOCOL")
        assert "replication" not in stats(node)


def test_a_peer_that_does_not_replicate_shows_in_the_log(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "a").mkdir()
    with (
        start_nsqd(tmp_path / "plain") as plain,
        start_nsqd(
            tmp_path / "a", f"--replica-peer={plain.tcp}", f"--replica-timeout={TIMEOUT}"
        ) as node,
    ):
        wait_for(
            lambda: "not a replicating nsqd (E_BAD_PROTOCOL)" in node.log,
            what="the misconfigured peer logged",
        )
        time.sleep(1.5)  # several redials (backoff up to --replica-timeout/2)
        assert node.log.count("not a replicating nsqd") == 1  # said once, not every retry
        assert peers_of(node)[plain.tcp]["state"] == "unreachable"


def test_takeover_keeps_attempts_and_deferrals(group_factory: Callable[..., Group]) -> None:
    """In flight, requeued (attempts told to the peers) and deferred (REQ with a delay, DPUB)
    messages of a killed node: its peers deliver the first two, attempts not lower than A
    last told them, and keep the others deferred."""
    group = group_factory(2, 2, "--sync-every=1")
    a, b = started(group, 2)
    topic, channel = unique("rep"), unique("ch")
    create_channel(a, topic, channel)
    pub = NsqConn(a.tcp_address)
    for body in (b"in-flight", b"requeued", b"req-deferred"):
        pub.send(pub_cmd(topic, body))
        pub.expect_ok()
    pub.send(dpub_cmd(topic, 60000, b"dpub-deferred"))
    pub.expect_ok()
    sub = consumer(a, topic, channel, rdy=3)
    by_body = {}
    for _ in range(3):
        msg = sub.expect_message()
        by_body[msg.body] = msg
    sub.send(b"REQ " + by_body[b"requeued"].id + b" 0\n")
    sub.send(b"REQ " + by_body[b"req-deferred"].id + b" 60000\n")
    again = sub.expect_message()
    assert (again.body, again.attempts) == (b"requeued", 2)
    # a later publish's OK: B stored every event before it (the REQs' ATTEMPTS and DEFER)
    pub.send(pub_cmd(unique("marker"), b"marker"))
    pub.expect_ok()
    owner = group.address(0)
    assert held_for(b, owner) == 5
    a.kill()
    wait_for(lambda: peers_of(b)[owner]["taken_over"] == 5, timeout=10, what="taken over")
    conn = consumer(b, topic, channel, rdy=10)
    got = {}
    for _ in range(2):
        msg = conn.expect_message()
        got[msg.body] = msg.attempts
    conn.expect_nothing(0.5)
    assert got[b"in-flight"] >= 1
    assert got[b"requeued"] >= 2  # A counted 1 when it was requeued: never lower
    topics = {t["topic_name"]: t for t in stats(b)["topics"]}
    (channel_stats,) = [c for c in topics[topic]["channels"] if c["channel_name"] == channel]
    assert channel_stats["deferred_count"] == 2


def told_node_id(node: DaemonProcess) -> bool:
    return "has this node's --node-id 7" in node.log


def test_peers_sharing_a_node_id_are_refused(group_factory: Callable[..., Group]) -> None:
    """Message IDs are built from --node-id: two peers with one could mint the same ID, so
    they do not link, and a publish needing both is refused rather than risked."""
    group = group_factory(2, 2, "--node-id=7")  # (the last --node-id given wins)
    a, b = group.start(0), group.start(1)
    for node in (a, b):
        wait_for(partial(told_node_id, node), what="the shared --node-id logged")
    assert not all_connected([a, b])
    pub = NsqConn(a.tcp_address)
    pub.send(pub_cmd(unique("rep"), b"m"))
    pub.expect_error("E_PUB_FAILED PUB failed replicas 1 < 2")
    other = group_factory(2, 1)
    c, d = started(other, 2)
    assert "--node-id" not in c.log + d.log


def test_a_restarted_peer_catches_up_from_what_it_stored(
    group_factory: Callable[..., Group],
) -> None:
    """B killed and back on its disk within --replica-timeout: A resends from what B's
    WELCOME says it stored, so B holds every copy again (acks 1: A's OKs do not wait)."""
    group = group_factory(2, 1, "--sync-every=1")
    group.timeout = "5s"
    a, b = started(group, 2)
    topic, channel = unique("rep"), unique("ch")
    create_channel(a, topic, channel)
    pub = NsqConn(a.tcp_address)
    for index in range(20):
        pub.send(pub_cmd(topic, f"before{index}".encode()))
        pub.expect_ok()
    owner = group.address(0)
    wait_for(lambda: held_for(b, owner) == 20, what="20 held by B")
    b.kill()
    for index in range(30):
        pub.send(pub_cmd(topic, f"while-down{index}".encode()))
        pub.expect_ok()
    b = group.start(1)
    wait_for(lambda: held_for(b, owner) == 50, what="B caught up")
    assert "resumes at" not in b.log and "took over" not in b.log  # no gap, no takeover
