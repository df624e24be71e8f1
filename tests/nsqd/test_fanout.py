"""Fan-out from a topic to its channels: a publish is acknowledged once the topic
holds the message and the topic's pump copies it to the channels afterwards, as Go's
messagePump does. These are the edges that moving the copy past the acknowledgement could
change, each against a real nsqd process.
"""

from __future__ import annotations

import time
from pathlib import Path

from nsqpy.testing import DaemonProcess

from ..raw_v2 import (
    OK_FRAME,
    NsqConn,
    channel_stats,
    decode_message,
    http_ok,
    mpub_cmd,
    pub_cmd,
    q,
    topic_stats,
    wait_for,
    wait_until,
)
from .nsqd_storage_support import consume_all, launch, start_again

FRAME_MESSAGE = 2


def depth(nsqd: DaemonProcess, topic: str, channel: str) -> int:
    return int((channel_stats(nsqd, topic, channel) or {}).get("depth", -1))


def wait_depth(nsqd: DaemonProcess, topic: str, channel: str, expected: int) -> None:
    wait_for(lambda: depth(nsqd, topic, channel), lambda d: d == expected, 5, channel)


def consume(nsqd: DaemonProcess, topic: str, channel: str, count: int) -> list[bytes]:
    """``count`` bodies from ``channel``, in the order delivered, each FINished."""
    with NsqConn(nsqd.tcp_address) as conn:
        conn.sub(topic, channel)
        conn.rdy(count)
        got = []
        for _ in range(count):
            msg = conn.expect_message()
            conn.fin(msg.id)
            got.append(msg.body)
        conn.expect_nothing(0.05)
        return got


def create(nsqd: DaemonProcess, topic: str, *channels: str) -> None:
    http_ok(nsqd, "POST", "/topic/create?" + q(topic=topic))
    for channel in channels:
        http_ok(nsqd, "POST", "/channel/create?" + q(topic=topic, channel=channel))


def test_channel_created_while_messages_wait_in_the_topic_gets_them(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """Go copies at pump time, to the channels the topic has then: a channel created while a
    message still sits in the (paused) topic gets its copy too."""
    nsqd = launch(daemons, tmp_path)
    create(nsqd, "t", "a")
    http_ok(nsqd, "POST", "/topic/pause?" + q(topic="t"))
    with NsqConn(nsqd.tcp_address) as pub:
        pub.mpub("t", [b"m1", b"m2", b"m3"])
    assert (topic_stats(nsqd, "t") or {})["depth"] == 3
    assert depth(nsqd, "t", "a") == 0
    create(nsqd, "t", "b")
    http_ok(nsqd, "POST", "/topic/unpause?" + q(topic="t"))
    wait_depth(nsqd, "t", "b", 3)
    assert (topic_stats(nsqd, "t") or {})["depth"] == 0
    assert consume(nsqd, "t", "a", 3) == [b"m1", b"m2", b"m3"]
    assert consume(nsqd, "t", "b", 3) == [b"m1", b"m2", b"m3"]


def test_paused_channel_keeps_its_copy_while_the_others_deliver(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    nsqd = launch(daemons, tmp_path)
    create(nsqd, "t", "a", "b")
    http_ok(nsqd, "POST", "/channel/pause?" + q(topic="t", channel="a"))
    with NsqConn(nsqd.tcp_address) as paused, NsqConn(nsqd.tcp_address) as pub:
        paused.sub("t", "a")
        paused.rdy(10)
        pub.pub("t", b"only b now")
        assert consume(nsqd, "t", "b", 1) == [b"only b now"]
        paused.expect_nothing(0.2)
        assert depth(nsqd, "t", "a") == 1
        http_ok(nsqd, "POST", "/channel/unpause?" + q(topic="t", channel="a"))
        assert paused.expect_message().body == b"only b now"


def test_copies_are_independent_attempts_per_channel(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """One message object (and body) is shared by the channels' queues; a delivery, a REQ and
    a redelivery on one channel must not show on another channel's copy, in memory or on disk
    (--mem-queue-size=2: most copies overflow to the channels' disk queues)."""
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=2")
    create(nsqd, "t", "a", "b", "c")
    bodies = [b"body-%d" % i for i in range(6)]
    with NsqConn(nsqd.tcp_address) as pub:
        pub.mpub("t", bodies)
    for channel in ("a", "b", "c"):
        wait_depth(nsqd, "t", channel, 6)
    with NsqConn(nsqd.tcp_address) as conn:
        conn.sub("t", "a")
        conn.rdy(1)
        first = conn.expect_message()
        assert first.attempts == 1
        conn.req(first.id, 0)  # back into channel a's queue
        attempts = {}
        for _ in range(6):
            msg = conn.expect_message()
            conn.fin(msg.id)
            attempts[msg.id] = msg.attempts
        assert attempts[first.id] == 2
        assert sorted(attempts.values()) == [1, 1, 1, 1, 1, 2]
    for channel in ("b", "c"):
        with NsqConn(nsqd.tcp_address) as conn:
            conn.sub("t", channel)
            conn.rdy(6)
            got = [conn.expect_message() for _ in range(6)]
            assert [m.body for m in got] == bodies
            assert {m.attempts for m in got} == {1}
            assert len({m.id for m in got}) == 6


def test_dpub_defers_on_every_channel_also_after_waiting_in_a_paused_topic(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    nsqd = launch(daemons, tmp_path)
    create(nsqd, "t", "a", "b")
    with NsqConn(nsqd.tcp_address) as pub:
        pub.dpub("t", 300, b"later")
        for channel in ("a", "b"):
            assert (channel_stats(nsqd, "t", channel) or {})["deferred_count"] == 1
        http_ok(nsqd, "POST", "/topic/pause?" + q(topic="t"))
        pub.dpub("t", 300, b"later too")
    assert (topic_stats(nsqd, "t") or {})["depth"] == 1
    unpaused = time.monotonic()
    http_ok(nsqd, "POST", "/topic/unpause?" + q(topic="t"))

    def deferred_counts() -> list[int]:
        return [(channel_stats(nsqd, "t", c) or {}).get("deferred_count", -1) for c in "ab"]

    wait_for(deferred_counts, lambda counts: counts == [2, 2], 3, "deferred on a and b")
    with NsqConn(nsqd.tcp_address) as conn:
        conn.sub("t", "b")
        conn.rdy(2)
        conn.expect_nothing(0.1)
        got = {conn.expect_message(timeout=3).body, conn.expect_message(timeout=3).body}
        assert got == {b"later", b"later too"}
        assert time.monotonic() - unpaused >= 0.25  # the second deferral ran from the pump


def test_topic_deleted_while_messages_wait_in_it(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=10")
    create(nsqd, "t", "a", "b")
    http_ok(nsqd, "POST", "/topic/pause?" + q(topic="t"))
    with NsqConn(nsqd.tcp_address) as pub:
        pub.mpub("t", [b"old-%d" % i for i in range(50)])  # 10 in memory, 40 on disk
        assert (topic_stats(nsqd, "t") or {})["depth"] == 50
        http_ok(nsqd, "POST", "/topic/delete?" + q(topic="t"))
        assert topic_stats(nsqd, "t") is None
        create(nsqd, "t", "a")
        pub.pub("t", b"new")
    assert consume(nsqd, "t", "a", 1) == [b"new"]
    assert not list(tmp_path.glob("t.diskqueue*")) or depth(nsqd, "t", "a") == 0


def test_mpub_order_kept_through_topic_and_channel_overflow(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """Batches published while the topic is paused (memory, then its disk queue) and more
    published right after unpausing, while the pump still moves the first ones: every channel
    holds them in publish order, across both memory queues and disk queues (files of 2000
    bytes: a batch framed once for many queues must also be split across files)."""
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=25", "--max-bytes-per-file=2000")
    channels = [f"c{i}" for i in range(5)]
    create(nsqd, "t", *channels)
    http_ok(nsqd, "POST", "/topic/pause?" + q(topic="t"))
    expected = [b"%04d" % i for i in range(400)]
    with NsqConn(nsqd.tcp_address) as pub:
        for start in range(0, 200, 50):
            pub.mpub("t", expected[start : start + 50])
        http_ok(nsqd, "POST", "/topic/unpause?" + q(topic="t"))
        for start in range(200, 400, 50):
            pub.send(mpub_cmd("t", expected[start : start + 50]))
        for _ in range(200, 400, 50):
            pub.expect_ok()
    for channel in channels:
        wait_depth(nsqd, "t", channel, 400)
    for channel in channels:
        assert consume(nsqd, "t", channel, 400) == expected


def test_ephemeral_channel_gets_copies_and_drops_its_overflow(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=10")
    create(nsqd, "t", "durable")
    with NsqConn(nsqd.tcp_address) as eph, NsqConn(nsqd.tcp_address) as pub:
        eph.sub("t", "e#ephemeral")
        pub.mpub("t", [b"%d" % i for i in range(30)])
        wait_depth(nsqd, "t", "durable", 30)
        wait_depth(nsqd, "t", "e#ephemeral", 10)  # no disk: the rest is dropped, as Go
        eph.rdy(30)
        got = [eph.expect_message().body for _ in range(10)]
        assert got == [b"%d" % i for i in range(10)]
    wait_until(lambda: channel_stats(nsqd, "t", "e#ephemeral") is None, what="ephemeral gone")
    with NsqConn(nsqd.tcp_address) as pub:
        pub.pub("t", b"after")
    wait_depth(nsqd, "t", "durable", 31)


def test_ok_precedes_the_message_it_delivers_on_the_same_connection(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """A client subscribed to the topic it publishes to reads the PUB's (and MPUB's) OK before
    the message itself, also with other channels to copy to."""
    nsqd = launch(daemons, tmp_path)
    create(nsqd, "t", "ch", "other1", "other2")
    with NsqConn(nsqd.tcp_address) as conn:
        conn.sub("t", "ch")
        conn.rdy(10)
        conn.send(pub_cmd("t", b"mine"))
        assert conn.read_frame_bytes() == OK_FRAME
        kind, data = conn.read_frame()
        assert (kind, decode_message(data).body) == (FRAME_MESSAGE, b"mine")
        conn.send(mpub_cmd("t", [b"x", b"y"]))
        assert conn.read_frame_bytes() == OK_FRAME
        assert [decode_message(conn.read_frame()[1]).body for _ in range(2)] == [b"x", b"y"]


def test_disk_backed_ok_means_on_every_channels_disk(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """--mem-queue-size=0 --sync-every=1: what was acknowledged survives kill -9 on every
    channel, also what waited in the (paused) topic's own disk queue at the kill."""
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=0", "--sync-every=1")
    create(nsqd, "t", "a", "b", "c")
    direct = [b"direct-%d" % i for i in range(20)]
    held = [b"held-%d" % i for i in range(20)]
    with NsqConn(nsqd.tcp_address) as pub:
        pub.mpub("t", direct[:10])
        for body in direct[10:]:
            pub.pub("t", body)
        http_ok(nsqd, "POST", "/topic/pause?" + q(topic="t"))
        pub.mpub("t", held)
    nsqd.kill()
    start_again(nsqd)
    http_ok(nsqd, "POST", "/topic/unpause?" + q(topic="t"))
    for channel in ("a", "b", "c"):
        wait_depth(nsqd, "t", channel, 40)
        assert consume(nsqd, "t", channel, 40) == direct + held


def test_disk_backed_topic_with_many_channels_keeps_every_acknowledged_message(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """--mem-queue-size=0 with the default --sync-every and more channels than
    DIRECT_CHANNELS: a publish is acknowledged in the topic's disk queue and copied later.
    A kill -9 right after the OKs loses nothing on any channel (a copy made again after the
    restart may come twice: at least once)."""
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=0")
    channels = [f"c{i}" for i in range(6)]
    create(nsqd, "t", *channels)
    bodies = [b"m-%05d" % i for i in range(3000)]
    with NsqConn(nsqd.tcp_address) as pub:
        for start in range(0, len(bodies) - 100, 500):
            pub.mpub("t", bodies[start : start + 500])
        for body in bodies[2500:]:
            pub.pub("t", body)
    nsqd.kill()
    start_again(nsqd)
    for channel in channels:
        got = [msg.body for msg in consume_all(nsqd, "t", channel, timeout=20.0)]
        assert list(dict.fromkeys(got)) == bodies, channel  # all, first copies in order


def test_a_copy_read_again_after_kill_is_not_sent_while_its_twin_is_in_flight(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """After a kill -9 the topic's pump copies again what it had copied since the topic's
    last metadata write, so a channel can hold two copies with one ID. A consumer with room
    for both gets only one while it is in flight: every FIN succeeds and nothing stays in
    flight (two copies in flight under one ID would keep one slot of RDY forever)."""
    # a memory queue of one: the rest overflows to the topic's disk queue, which the pump
    # reads; no timed sync before the kill, so the topic's read position stays unrecorded
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=1", "--sync-timeout=60s")
    create(nsqd, "t", "a")
    bodies = [b"m-%03d" % i for i in range(100)]
    with NsqConn(nsqd.tcp_address) as pub:
        pub.mpub("t", bodies)
    wait_depth(nsqd, "t", "a", 100)  # copied to the channel's disk queue by the pump
    nsqd.kill()
    start_again(nsqd)
    wait_depth(nsqd, "t", "a", 198)  # the 99 on the topic's disk were copied once more
    with NsqConn(nsqd.tcp_address) as conn:
        conn.sub("t", "a")
        conn.rdy(1000)
        first = [conn.expect_message() for _ in range(99)]
        conn.expect_nothing(0.3)
        # (m-000 lived in the memory queues, which a kill -9 loses)
        assert sorted(m.body for m in first) == bodies[1:]
        for msg in first:
            conn.fin(msg.id)
        conn.expect_nothing(0.3)  # no E_FIN_FAILED, and the twins were not sent
    stats = channel_stats(nsqd, "t", "a") or {}
    assert (stats.get("depth"), stats.get("in_flight_count")) == (0, 0)


def test_held_channels_deliver_their_own_copies(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """--mem-queue-size=0 --sync-every=1 holds each channel's messages on disk until finished;
    a message fanned out to two subscribed channels is held and delivered as two copies: a REQ
    on one changes nothing on the other, and both end empty."""
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=0", "--sync-every=1")
    create(nsqd, "t", "a", "b")
    with NsqConn(nsqd.tcp_address) as a, NsqConn(nsqd.tcp_address) as b:
        for conn, channel in ((a, "a"), (b, "b")):
            conn.sub("t", channel)
            conn.rdy(10)
        with NsqConn(nsqd.tcp_address) as pub:
            pub.mpub("t", [b"h%d" % i for i in range(5)])
        got_a = [a.expect_message() for _ in range(5)]
        got_b = [b.expect_message() for _ in range(5)]
        assert [m.body for m in got_a] == [m.body for m in got_b] == [b"h%d" % i for i in range(5)]
        assert {m.attempts for m in got_a + got_b} == {1}
        a.req(got_a[0].id, 0)
        again = a.expect_message()
        assert (again.id, again.attempts) == (got_a[0].id, 2)
        for msg in [again, *got_a[1:]]:
            a.fin(msg.id)
        for msg in got_b:
            b.fin(msg.id)
        b.expect_nothing(0.2)

    def in_flight() -> list[int]:
        return [(channel_stats(nsqd, "t", c) or {}).get("in_flight_count", -1) for c in "ab"]

    wait_for(in_flight, lambda counts: counts == [0, 0], 3, "nothing in flight")
    assert depth(nsqd, "t", "a") == depth(nsqd, "t", "b") == 0
