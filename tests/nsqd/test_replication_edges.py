"""Replicated topics at their edges, between real nsqd processes (docs/replication.md, "Faults
and their outcome"): a partition that heals after a takeover, a peer that falls behind and
catches up, a channel created while a node is down, and too few peers reachable mid-run."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from nsqpy.protocol import replica as r1
from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import NsqConn, dpub_cmd, http_request, mpub_cmd, pub_cmd, unique
from .test_replication import (
    Group,
    all_connected,
    consumer,
    create_channel,
    group_factory,
    held_for,
    peers_of,
    started,
    stats,
    survivors_in_order,
    wait_for,
)

__all__ = ["group_factory"]  # the fixture, used by name


def publish(node: DaemonProcess, topic: str, bodies: list[bytes]) -> None:
    pub = NsqConn(node.tcp_address)
    for body in bodies:
        pub.send(pub_cmd(topic, body))
        pub.expect_ok(timeout=10.0)
    pub.close()


def drain(conns: list[NsqConn], quiet: float) -> Counter[bytes]:
    """Every message the consumers get (each FINed) until none comes for ``quiet`` seconds
    on any of them; deliveries counted by body."""
    got: Counter[bytes] = Counter()
    deadline = time.monotonic() + 60  # bounded however the group behaves
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < quiet and time.monotonic() < deadline:
        for conn in conns:
            try:
                msg = conn.expect_message(timeout=0.1)
            except TimeoutError:
                continue
            conn.send(b"FIN " + msg.id + b"\n")
            got[msg.body] += 1
            idle_since = time.monotonic()
    return got


def nothing_held(nodes: list[DaemonProcess]) -> bool:
    return all(peer["held_copies"] == 0 for node in nodes for peer in peers_of(node).values())


def held_by_two_peers(
    group_factory: Callable[..., Group], count: int
) -> tuple[Group, list[DaemonProcess], str, str, list[bytes]]:
    """A group of three (acks 2, --sync-every=1) whose A published ``count`` messages to a
    new channel, each held by B and C."""
    group = group_factory(3, 2, "--sync-every=1")
    nodes = started(group, 3)
    topic, channel = unique("rep"), unique("ch")
    create_channel(nodes[0], topic, channel)
    bodies = [f"m{index}".encode() for index in range(count)]
    publish(nodes[0], topic, bodies)
    owner = group.address(0)
    wait_for(
        lambda: [held_for(p, owner) for p in nodes[1:]] == [count, count],
        what=f"{count} held for A",
    )
    return group, nodes, topic, channel, bodies


def test_a_partition_that_heals_after_a_takeover(group_factory: Callable[..., Group]) -> None:
    """A paused past --replica-timeout: the first of B and C by address takes over its 50
    unfinished messages while A still has them; the other sees that takeover in the first's
    stream and forgets its copies instead of taking them over too. Once A is back every
    message is delivered at least once; the duplicates are bounded by what was unfinished (A
    and the first deliver each at most once) and the group settles with nothing held once
    everything is finished."""
    group, nodes, topic, channel, bodies = held_by_two_peers(group_factory, 50)
    a = nodes[0]
    owner = group.address(0)
    os.kill(a.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        first, second = survivors_in_order(group, (1, 2))
        wait_for(
            lambda: peers_of(first)[owner]["taken_over"] == 50,
            timeout=20,
            what="A's 50 taken over by the first survivor",
        )
        time.sleep(max(0.0, 3.0 - (time.monotonic() - stopped_at)))  # 3 x --replica-timeout
        assert peers_of(second)[owner]["taken_over"] == 0  # its turn came after the takeover
    finally:
        os.kill(a.pid, signal.SIGCONT)
    wait_for(lambda: all_connected(nodes), timeout=20, what="the group linked again")
    conns = [consumer(node, topic, channel, rdy=100) for node in nodes]
    got = drain(conns, quiet=2.0)
    assert set(got) == set(bodies)  # nothing lost
    duplicates = sum(got.values()) - len(bodies)
    assert sum(got.values()) <= 50 * 2, got  # at most once by A and once by the first
    print(f"deliveries {sum(got.values())}, duplicates {duplicates}")
    wait_for(lambda: all_connected(nodes), what="every link connected")
    wait_for(lambda: nothing_held(nodes), timeout=20, what="every held copy dropped")


def test_a_peer_that_falls_behind_catches_up(group_factory: Callable[..., Group]) -> None:
    """C paused for less than --replica-timeout while A takes 200 publishes (B's ACKs make
    the OKs): C catches up from A's stream, holds what B holds, and takes nothing over."""
    group = group_factory(3, 2, "--sync-every=1")
    group.timeout = "2s"
    a, b, c = nodes = started(group, 3)
    topic, channel = unique("rep"), unique("ch")
    create_channel(a, topic, channel)
    owner, c_address = group.address(0), group.address(2)
    pub = NsqConn(a.tcp_address)
    during_pause, lag_seen = 0, 0
    os.kill(c.pid, signal.SIGSTOP)
    paused_at = time.monotonic()
    try:
        for index in range(200):
            pub.send(pub_cmd(topic, f"m{index}".encode()))
            pub.expect_ok(timeout=1.5)  # from B's ACK: C's silence holds nothing up
            if not lag_seen and time.monotonic() - paused_at < 0.4:
                during_pause += 1
            elif not lag_seen:
                lag_seen = peers_of(a)[c_address]["lag"]
                os.kill(c.pid, signal.SIGCONT)
        if not lag_seen:  # every publish came within the pause
            lag_seen = peers_of(a)[c_address]["lag"]
            time.sleep(max(0.0, 0.4 - (time.monotonic() - paused_at)))
    finally:
        os.kill(c.pid, signal.SIGCONT)
    assert during_pause >= 1 and lag_seen >= 1, (during_pause, lag_seen)
    wait_for(lambda: [held_for(p, owner) for p in (b, c)] == [200, 200], what="C caught up")
    assert [peers_of(p)[owner]["taken_over"] for p in (b, c)] == [0, 0]
    assert "took over" not in c.log + b.log
    assert all_connected(nodes)
    assert peers_of(a)[c_address]["lag"] == 0
    print(f"published during the pause {during_pause}, A's lag for C then {lag_seen}")


def has_channel(node: DaemonProcess, topic: str, channel: str) -> bool:
    topics = {t["topic_name"]: t for t in stats(node)["topics"]}
    return topic in topics and any(
        ch["channel_name"] == channel for ch in topics[topic]["channels"] or []
    )


def paused_channel(node: DaemonProcess, topic: str, channel: str) -> bool:
    topics = {t["topic_name"]: t for t in stats(node)["topics"]}
    return any(
        ch["channel_name"] == channel and ch["paused"] for ch in topics[topic]["channels"] or []
    )


def test_a_channel_created_while_a_node_is_down(group_factory: Callable[..., Group]) -> None:
    """C stopped; on A a topic and a paused channel created, and an old channel unpaused
    (A's stream moves on past what it keeps for C); C restarted on its disk: once linked
    again it has the group's state, and its own stale pause does not come back."""
    group = group_factory(3, 2)
    a, b, c = nodes = started(group, 3)
    old_topic, old_channel = unique("rep"), unique("ch")
    create_channel(a, old_topic, old_channel)
    pause_old = f"topic={old_topic}&channel={old_channel}"
    assert http_request(a, "POST", f"/channel/pause?{pause_old}").status == 200
    wait_for(partial(paused_channel, c, old_topic, old_channel), what="the old pause on C")
    c.stop()
    time.sleep(1.5)  # past --replica-timeout: A's stream keeps no events for C
    topic, channel = unique("rep"), unique("ch")
    create_channel(a, topic, channel)
    path = f"/channel/pause?topic={topic}&channel={channel}"
    assert http_request(a, "POST", path).status == 200
    assert http_request(a, "POST", f"/channel/unpause?{pause_old}").status == 200
    wait_for(partial(paused_channel, b, topic, channel), what="the paused channel on B")
    wait_for(lambda: not paused_channel(b, old_topic, old_channel), what="unpaused on B")
    publish(a, topic, [b"while C is down"])  # B's ACK trims A's stream past the ops
    c = group.start(2)
    nodes[2] = c
    wait_for(lambda: all_connected(nodes), what="C linked again")
    wait_for(partial(has_channel, c, topic, channel), what="the channel on C")
    wait_for(partial(paused_channel, c, topic, channel), what="its pause on C")
    wait_for(lambda: not paused_channel(c, old_topic, old_channel), what="unpaused on C")
    time.sleep(0.5)  # C's own view, from before, is not sent back to the others
    assert not any(paused_channel(node, old_topic, old_channel) for node in nodes)


def test_a_lost_peer_fails_mpub_then_recovers(group_factory: Callable[..., Group]) -> None:
    """A linked group loses B: /mpub answers 503 once B counts as unreachable, 200 again
    once B is back, and what was acknowledged is delivered."""
    group = group_factory(2, 2, "--sync-every=1")
    a, b = started(group, 2)
    topic, channel = unique("rep"), unique("ch")
    create_channel(a, topic, channel)
    assert http_request(a, "POST", f"/mpub?topic={topic}", b"one\ntwo").status == 200
    b.kill()

    def mpub_status() -> int | None:
        status = http_request(a, "POST", f"/mpub?topic={topic}", b"lost\nlost", timeout=10).status
        return status if status == 503 else None  # a 200 is also delivered: counted below

    wait_for(mpub_status, timeout=20, what="/mpub refused with 503")
    response = http_request(a, "POST", f"/mpub?topic={topic}", b"three\nfour")
    assert (response.status, response.body) == (503, b'{"message":"NOT_ENOUGH_REPLICAS"}')
    b = group.start(1)
    wait_for(lambda: all_connected([a, b]), what="B back")
    assert http_request(a, "POST", f"/mpub?topic={topic}", b"five\nsix").status == 200
    got = drain([consumer(a, topic, channel, rdy=100)], quiet=1.0)
    assert {b"one", b"two", b"five", b"six"} <= set(got)
    assert not {b"three", b"four"} & set(got)


def test_a_channel_created_before_a_node_first_joins(group_factory: Callable[..., Group]) -> None:
    """C starts long after A and B made a channel: A's first link to C announces it."""
    group = group_factory(3, 2)
    a, b = group.start(0), group.start(1)
    wait_for(lambda: peers_of(a)[group.address(1)]["state"] == "connected", what="A-B linked")
    time.sleep(1.5)  # past --replica-timeout: A's stream keeps no events for C
    topic, channel = unique("rep"), unique("ch")
    create_channel(a, topic, channel)
    publish(a, topic, [b"before C"])  # B's ACK trims A's stream past the ops
    c = group.start(2)
    wait_for(lambda: all_connected([a, b, c]), what="C linked")
    wait_for(partial(has_channel, c, topic, channel), what="the channel on C")


def lose(group: Group, index: int) -> None:
    """The node killed -9 and its data path deleted: the machine and its disk are gone."""
    group.node(index).kill()
    shutil.rmtree(group.base / f"node{index}")


def finish(node: DaemonProcess, topic: str, channel: str, count: int) -> set[bytes]:
    """Consume and FIN ``count`` messages from ``node``; their bodies."""
    conn = consumer(node, topic, channel, rdy=count)
    finished = set()
    for _ in range(count):
        msg = conn.expect_message(timeout=10.0)
        conn.send(b"FIN " + msg.id + b"\n")
        finished.add(msg.body)
    conn.send(b"CLS\n")
    conn.close()
    return finished


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
def test_a_blank_disk_rejoin_gets_its_copies_back(
    group_factory: Callable[..., Group], durable: bool
) -> None:
    """B lost (killed, its disk deleted) and back empty: A's snapshot gives it the copies it
    should hold: queued, in flight, deferred, and those published while it was away. Then C
    and A are lost too, and B alone delivers every message A acknowledged and nobody
    finished, each once; no finished one comes back."""
    extra = ("--sync-every=1", "--mem-queue-size=0") if durable else ()
    group = group_factory(3, 2, *extra)
    a, b, c = started(group, 3)
    topic, channel = unique("rep"), unique("ch")
    create_channel(a, topic, channel)
    owner = group.address(0)
    publish(a, topic, [f"before{index}".encode() for index in range(20)])
    finished = finish(a, topic, channel, 5)
    lose(group, 1)
    publish(a, topic, [f"away{index}".encode() for index in range(20)])  # C's ACKs
    deferrer = NsqConn(a.tcp_address)
    deferrer.send(dpub_cmd(topic, 2000, b"deferred"))
    deferrer.expect_ok()
    holder = consumer(a, topic, channel, rdy=2)  # two in flight, never finished
    in_flight = {holder.expect_message(timeout=10.0).body for _ in range(2)}
    wait_for(lambda: held_for(c, owner) == 36, what="36 held by C")
    b = group.start(1)
    wait_for(lambda: all_connected([a, b, c]), what="B linked again")
    wait_for(lambda: held_for(b, owner) == 36, what="A's snapshot held by B")
    assert "snapshot of 36 copies" in a.log
    assert held_for(c, owner) == 36  # the snapshot's PUTs of what C holds add nothing
    lose(group, 2)
    lose(group, 0)
    wait_for(lambda: peers_of(b)[owner]["taken_over"] == 36, timeout=20, what="B took over")
    got = drain([consumer(b, topic, channel, rdy=100)], quiet=2.5)
    expected = {f"before{index}".encode() for index in range(20)} - finished
    expected |= {f"away{index}".encode() for index in range(20)} | {b"deferred"}
    assert in_flight <= expected
    assert got == Counter(dict.fromkeys(expected, 1))


def test_a_paused_node_does_not_take_over_its_peers_when_it_resumes(
    group_factory: Callable[..., Group],
) -> None:
    """A stopped (SIGSTOP) past --replica-timeout holds 10 copies for B. On SIGCONT its own
    clock says B has been silent that long, but the silence was A's: it takes nothing over,
    links again and still holds B's copies; B took over A's run (which owned nothing)."""
    group = group_factory(2, 1, "--sync-every=1")
    a, b = started(group, 2)
    topic, channel = unique("rep"), unique("ch")
    create_channel(b, topic, channel)
    publish(b, topic, [f"m{index}".encode() for index in range(10)])
    b_address = group.address(1)
    wait_for(lambda: held_for(a, b_address) == 10, what="10 held by A")
    os.kill(a.pid, signal.SIGSTOP)
    try:
        time.sleep(2.5)  # 2.5 x --replica-timeout
    finally:
        os.kill(a.pid, signal.SIGCONT)
    wait_for(lambda: all_connected([a, b]), what="linked again")
    time.sleep(1.5)  # past another --replica-timeout: B spoke meanwhile
    assert peers_of(a)[b_address]["taken_over"] == 0
    assert held_for(a, b_address) == 10
    assert "took over" not in a.log
    assert "silence meanwhile is not judged" in a.log


class FakePeer:
    """A replication peer on a loopback port that is not an nsqd: it answers each link's
    HELLO with WELCOME (stored 0), then ``after_welcome(conn, stop)`` decides what it does;
    links counts the links it was dialled, bytes_in what each of them carried."""

    def __init__(self, after_welcome: Callable[[socket.socket, threading.Event], int]) -> None:
        self.after_welcome = after_welcome
        self.links: list[int] = []
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port: int = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FakePeer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.listener.close()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.links.append(0)
            with conn, contextlib.suppress(OSError):
                conn.settimeout(2.0)
                conn.recv(4096)  # the magic and HELLO
                conn.sendall(r1.welcome({"incarnation": "fake", "stored": 0}))
                self.links[-1] = self.after_welcome(conn, self.stop)


def drop_at_once(conn: socket.socket, stop: threading.Event) -> int:
    return 0


def read_without_acking(conn: socket.socket, stop: threading.Event) -> int:
    carried = 0
    conn.settimeout(0.2)
    while not stop.is_set():
        try:
            data = conn.recv(65536)
        except TimeoutError:
            continue
        except OSError:  # reset: the node closed the link with data unread
            break
        if not data:
            break
        carried += len(data)
    return carried


def test_a_peer_that_drops_each_link_at_once_is_dialled_with_backoff(tmp_path: Path) -> None:
    """A peer that welcomes the link and closes it at once (as one with a full disk does,
    its store refusing the first write) is dialled again with a growing delay, not every
    RECONNECT_MIN: over 3 s, a handful of links, and the failure logged once."""
    with FakePeer(drop_at_once) as peer:
        node = start_nsqd(
            tmp_path, f"--replica-peer=127.0.0.1:{peer.port}", "--replica-acks=1", "--node-id=7"
        )
        try:
            time.sleep(3.0)
        finally:
            node.kill()
    assert 3 <= len(peer.links) <= 8, peer.links  # 0.05, 0.1, 0.2, 0.4, 0.8, 1.6 s apart
    assert node.log.count("failed: ConnectionResetError") == 1, node.log


def test_a_peer_that_never_acknowledges_is_cut_loose(tmp_path: Path) -> None:
    """A peer that reads the stream but never ACKs: once over --replica-max-lag of the
    stream waits for it and it has acknowledged nothing for --replica-timeout/2, the node
    closes its link and lets go of those events; the peer dials in again and gets the
    stream anew from a snapshot."""
    max_lag = 256 * 1024
    with FakePeer(read_without_acking) as peer:
        node = start_nsqd(
            tmp_path,
            f"--replica-peer=127.0.0.1:{peer.port}",
            "--replica-acks=1",
            f"--replica-max-lag={max_lag}",
            "--replica-timeout=1s",
            "--node-id=5",
        )
        try:
            topic = unique("rep")
            body = b"x" * 1000
            pub = NsqConn(node.tcp_address)
            for _ in range(8):  # 8 x 100 KB in MPUBs, over three times the bound
                pub.send(mpub_cmd(topic, [body] * 100))
                pub.expect_ok(timeout=10.0)
            wait_for(lambda: len(peer.links) >= 2, what="the peer cut loose and linked again")
            assert "unacknowledged: cut loose" in node.log
            wait_for(lambda: "snapshot of 800 copies" in node.log, what="the snapshot sent")
        finally:
            node.kill()
    assert max(peer.links) > max_lag, peer.links  # a link is cut only once over the bound


def test_a_restarted_owner_is_taken_over_by_one_survivor(
    group_factory: Callable[..., Group],
) -> None:
    """A killed and restarted on its disk (a new incarnation) with 20 unfinished messages:
    its old run is taken over by the first survivor by address only (the other forgets its
    copies), so each message is delivered at most twice (by A, and by that survivor)."""
    group, (a, b, c), topic, channel, bodies = held_by_two_peers(group_factory, 20)
    owner = group.address(0)
    a.kill()
    a = group.start(0)
    first, second = survivors_in_order(group, (1, 2))
    wait_for(lambda: peers_of(first)[owner]["taken_over"] == 20, what="taken over by the first")
    time.sleep(2.5)  # past the second's own turn
    assert peers_of(second)[owner]["taken_over"] == 0
    conns = [consumer(node, topic, channel, rdy=100) for node in (a, b, c)]
    got = drain(conns, quiet=1.5)
    assert set(got) == set(bodies)
    assert max(got.values()) <= 2, got


def topic_depth(node: DaemonProcess, topic: str) -> int:
    topics = {t["topic_name"]: t for t in stats(node)["topics"]}
    return int(topics[topic]["message_count"]) if topic in topics else 0


def test_a_connection_runs_its_next_commands_while_a_publish_waits_for_its_peers(
    group_factory: Callable[..., Group],
) -> None:
    """B stopped (within --replica-timeout): A's OK to a PUB waits for B's ACK, but the
    connection goes on: PUBs to another topic are put meanwhile. The replies keep the
    commands' order: nothing comes while the first OK waits, not even the error of a later
    FIN; once B is back: OK, OK, the FIN's error, OK. A command that must have the
    connection alone (CLS) runs once every earlier reply is out."""
    group = group_factory(2, 2, "--sync-every=1")
    group.timeout = "5s"
    a, b = started(group, 2)
    first, second = unique("rep"), unique("rep")
    conn = NsqConn(a.tcp_address)
    conn.pub(first, b"warm up")  # both topics exist on both nodes before B stops
    conn.pub(second, b"warm up")
    conn.sub(first, "ch")  # RDY 0: subscribed, so a FIN fails without closing
    os.kill(b.pid, signal.SIGSTOP)
    try:
        conn.send(pub_cmd(first, b"one"))
        conn.send(pub_cmd(second, b"two"))
        conn.send(b"FIN " + b"0" * 16 + b"\n")  # not in flight: E_FIN_FAILED, not fatal
        conn.send(pub_cmd(second, b"three"))
        conn.send(b"CLS\n")
        wait_for(lambda: topic_depth(a, second) == 3, what="the later PUBs put meanwhile")
        conn.expect_nothing(0.3)
    finally:
        os.kill(b.pid, signal.SIGCONT)
    conn.expect_ok(timeout=10.0)
    conn.expect_ok()
    conn.expect_error(b"E_FIN_FAILED FIN 0000000000000000 failed ID not in flight", fatal=False)
    conn.expect_ok()
    assert conn.expect_response() == b"CLOSE_WAIT"
    conn.close()


def test_a_fatal_error_after_a_waiting_publish_comes_after_its_ok(
    group_factory: Callable[..., Group],
) -> None:
    """A PUB whose OK waits for the peer, then a command nsqd closes the connection for:
    the OK first, then the error, then the close."""
    group = group_factory(2, 2, "--sync-every=1")
    group.timeout = "5s"
    a, b = started(group, 2)
    topic = unique("rep")
    conn = NsqConn(a.tcp_address)
    conn.pub(topic, b"warm up")
    os.kill(b.pid, signal.SIGSTOP)
    try:
        conn.send(pub_cmd(topic, b"one"))
        conn.send(b"BOGUS\n")
        conn.expect_nothing(0.3)
    finally:
        os.kill(b.pid, signal.SIGCONT)
    conn.expect_ok(timeout=10.0)
    conn.expect_error(b"E_INVALID invalid command BOGUS")


def test_a_snapshot_larger_than_the_max_lag_reaches_a_peer_that_acknowledges(
    group_factory: Callable[..., Group],
) -> None:
    """--replica-max-lag below one MPUB and below the snapshot: B, acknowledging as it
    goes, is never cut loose; lost and back blank, it takes in A's whole snapshot."""
    group = group_factory(2, 1, "--sync-every=1", f"--replica-max-lag={64 * 1024}")
    a, b = started(group, 2)
    topic, channel = unique("rep"), unique("ch")
    create_channel(a, topic, channel)
    owner = group.address(0)
    pub = NsqConn(a.tcp_address)
    for batch in range(5):  # 5 MPUBs of 100 KB, each over the bound
        pub.send(mpub_cmd(topic, [b"%04d" % (batch * 100 + i) + b"x" * 996 for i in range(100)]))
        pub.expect_ok(timeout=10.0)
    wait_for(lambda: held_for(b, owner) == 500, what="500 held by B")
    # and acknowledged (B's index may run ahead of its ACK, which waits for the fsync): A
    # keeps nothing for it, so its loss below leaves no unacknowledged lag to cut it loose
    b_address = group.address(1)
    wait_for(lambda: peers_of(a)[b_address]["lag"] == 0, what="B acknowledged all")
    lose(group, 1)
    b = group.start(1)
    wait_for(lambda: all_connected([a, b]), what="B linked again")
    wait_for(lambda: held_for(b, owner) == 500, timeout=20, what="A's snapshot held by B")
    assert "snapshot of 500 copies" in a.log
    assert "cut loose" not in a.log
