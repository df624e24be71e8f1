"""nsqd durability against a real nsqd process: crashes, clean restarts, full disks, the data
directory lock, ephemeral topics (which, as in Go, keep nothing across a restart).
"""

from __future__ import annotations

import json
import random
import re
import resource
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from nsqpy.testing import DaemonProcess

from ..raw_v2 import (
    Message,
    NsqConn,
    channel_stats,
    http_ok,
    http_request,
    mpub_cmd,
    pub_cmd,
    stats,
    topic_stats,
    wait_until,
)
from .nsqd_storage_support import (
    FileSizeLimitedNsqd,
    consume,
    consume_from,
    data_file,
    gather,
    launch,
    meta_file,
    parse_records,
    read_meta,
    run_nsqd_to_exit,
    start_again,
    subscriber,
)


def bodies(count: int, seed: int, prefix: bytes = b"") -> list[bytes]:
    """Distinct bodies of varied length and arbitrary bytes (newlines and NULs included)."""
    rng = random.Random(seed)
    return [
        prefix + b"%06d:" % i + rng.randbytes(rng.randrange(0, 300)) + b"\n\x00"
        for i in range(count)
    ]


def assert_same_bodies(received: list[Message], expected: list[bytes]) -> None:
    got = Counter(m.body for m in received)
    assert got == Counter(expected), (
        f"missing {len(Counter(expected) - got)}, unexpected {len(got - Counter(expected))}"
    )


def records_synced(directory: Path, queue: str) -> int:
    """How many records the queue's metadata file vouches for (fsynced before it was written).

    Nothing reads these queues in the crash tests, so every record from the start of file 0 up
    to the recorded write position counts.
    """
    if not meta_file(directory, queue).exists():
        return 0
    meta = read_meta(directory, queue)
    assert (meta.read_num, meta.read_pos) == (0, 0)
    synced = 0
    for num in range(meta.write_num + 1):
        data = data_file(directory, queue, num).read_bytes()
        if num == meta.write_num:
            data = data[: meta.write_pos]
        synced += len(parse_records(data))
    return synced


def listed_in_nsqd_dat(directory: Path, topic: str, with_channel: bool) -> bool:
    metadata = json.loads((directory / "nsqd.dat").read_bytes())
    for entry in metadata["topics"] or []:
        if entry["name"] == topic:
            return not with_channel or bool(entry["channels"])
    return False


def freeze_and_kill(nsqd: DaemonProcess, directory: Path, queue: str) -> int:
    """SIGSTOP, note how many records are synced, SIGKILL; returns the synced count."""
    assert nsqd.proc is not None
    nsqd.proc.send_signal(signal.SIGSTOP)
    try:
        return records_synced(directory, queue)
    finally:
        assert nsqd.kill() == -signal.SIGKILL


# ------------------------------------------------------------------------------ crashes


@pytest.mark.parametrize("queue_kind", ["topic", "channel"])
def test_sigkill_with_sync_every_1_keeps_every_acknowledged_message(
    tmp_path: Path, daemons: list[DaemonProcess], queue_kind: str
) -> None:
    """Every message nsqd answered OK for is on disk (the topic's queue, or the channel's when
    the topic has one) and comes back intact after SIGKILL and a restart."""
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=0", "--sync-every=1")
    http_ok(nsqd, "POST", "/topic/create?topic=crash")
    if queue_kind == "channel":
        http_ok(nsqd, "POST", "/channel/create?topic=crash&channel=c")
    # nsqd.dat is written in the background (as in Go): wait, so the restart recreates the topic
    # or channel by itself and its depth can be checked before anyone subscribes
    wait_until(lambda: listed_in_nsqd_dat(tmp_path, "crash", queue_kind == "channel"))
    queue = "crash" if queue_kind == "topic" else "crash:c"
    expected = bodies(300, seed=1)
    conn = NsqConn(nsqd.tcp_address)
    for body in expected[:100]:
        conn.pub("crash", body)
    for start in range(100, 300, 20):
        conn.mpub("crash", expected[start : start + 20])
    synced = freeze_and_kill(nsqd, tmp_path, queue)
    conn.close()
    print(f"\n[sync-every=1 {queue_kind}] acknowledged 300, synced per metadata at kill {synced}")

    start_again(nsqd)
    if queue_kind == "topic":
        assert (topic_stats(nsqd, "crash") or {}).get("depth") == 300
    else:
        assert (channel_stats(nsqd, "crash", "c") or {}).get("depth") == 300
    received = consume_from(nsqd, "crash", "c", 300)
    assert_same_bodies(received, expected)
    assert all(m.attempts == 1 for m in received)
    assert len({m.id for m in received}) == 300
    assert (channel_stats(nsqd, "crash", "c") or {}).get("depth") == 0


def test_sync_every_1_makes_each_write_durable_before_acknowledging_the_next(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """go-diskqueue's ioLoop syncs (fsync + metadata) right after a write when the count reaches
    --sync-every, before it takes the next write; so with --sync-every=1, once PUB k+1 has been
    acknowledged, message k survives a power cut, not only a killed process."""
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=0", "--sync-every=1")
    conn = NsqConn(nsqd.tcp_address)
    behind = []
    for k in range(1, 31):
        conn.pub("durable", b"%03d" % k + bytes(100))
        behind.append(k - records_synced(tmp_path, "durable"))
    conn.close()
    assert max(behind[1:]) <= 1, f"acknowledged but not yet synced, per PUB: {behind}"


def test_sigkill_with_default_sync_loses_at_most_the_unsynced_messages(
    tmp_path: Path, daemons: list[DaemonProcess], record_property: Callable[[str, object], None]
) -> None:
    """With --sync-every=2500 and --sync-timeout=2s some acknowledged messages are not yet
    covered by an fsync and the metadata when nsqd dies. The test counts them (the process is
    frozen with SIGSTOP, the metadata read, then SIGKILL) and reports how many were lost; a
    killed process cannot lose what it had written to the kernel, so expect 0, never more."""
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=0")
    http_ok(nsqd, "POST", "/topic/create?topic=crash")
    wait_until(lambda: listed_in_nsqd_dat(tmp_path, "crash", with_channel=False))
    expected = bodies(4000, seed=2)
    conn = NsqConn(nsqd.tcp_address)
    for start in range(0, 3000, 100):
        conn.mpub("crash", expected[start : start + 100])
    # let the sync after --sync-every=2500 writes happen, then add writes it does not cover
    wait_until(lambda: records_synced(tmp_path, "crash") >= 2500, what="the first sync")
    for start in range(3000, 4000, 100):
        conn.mpub("crash", expected[start : start + 100])
    synced = freeze_and_kill(nsqd, tmp_path, "crash")
    conn.close()

    start_again(nsqd)
    depth = (topic_stats(nsqd, "crash") or {}).get("depth", 0)
    assert depth <= 4000
    received = consume_from(nsqd, "crash", "c", depth)
    got = Counter(m.body for m in received)
    assert not got - Counter(expected), "messages that were never published came back"
    assert max(got.values(), default=1) == 1, "duplicates"
    lost = 4000 - len(received)
    unsynced = 4000 - synced
    record_property("lost", lost)
    record_property("unsynced", unsynced)
    print(f"\n[default sync] acknowledged 4000, unsynced at kill {unsynced}, lost {lost}")
    assert lost <= unsynced
    assert (channel_stats(nsqd, "crash", "c") or {}).get("depth") == 0


# ------------------------------------------------------------------------------ clean restart

DEFER_MS = 4000


def test_clean_restart_keeps_memory_in_flight_and_deferred_messages(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """SIGTERM with messages in a topic's and a channel's memory queue, in flight, deferred by
    DPUB and by REQ: after the restart all come back, with their attempts; the deferred ones
    are still deferred (nsqpy keeps the remaining deferral; Go would deliver them at once)."""
    nsqd = launch(daemons, tmp_path)
    http_ok(nsqd, "POST", "/topic/create?topic=live")
    http_ok(nsqd, "POST", "/channel/create?topic=live&channel=c")
    live = bodies(10, seed=3, prefix=b"live")
    held = bodies(5, seed=4, prefix=b"held")
    publisher = NsqConn(nsqd.tcp_address)
    for body in live:
        publisher.pub("live", body)
    for body in held:
        publisher.pub("held", body)  # a topic without channels keeps them in memory
    publisher.dpub("held", DEFER_MS, b"held deferred")

    consumer = subscriber(nsqd, "live", "c")
    consumer.rdy(3)
    in_flight = [consumer.expect_message() for _ in range(3)]
    consumer.rdy(0)
    deferral_started = time.monotonic()
    consumer.req(in_flight[0].id, DEFER_MS)  # REQ with a delay: deferred, attempts stays 1
    publisher.dpub("live", DEFER_MS, b"live deferred 1")
    publisher.dpub("live", DEFER_MS, b"live deferred 2")
    wait_until(lambda: (channel_stats(nsqd, "live", "c") or {}).get("deferred_count") == 3)
    before = channel_stats(nsqd, "live", "c") or {}
    assert (before["depth"], before["in_flight_count"]) == (7, 2)
    assert (topic_stats(nsqd, "held") or {})["depth"] == 6

    assert nsqd.stop() == 0
    stopped = time.monotonic()
    consumer.close()
    publisher.close()
    # a deferral that had this long left at shutdown must still have at least this long left
    remaining_at_least = DEFER_MS / 1000 - (stopped - deferral_started)
    assert remaining_at_least > 2, "shutdown took too long for this test to mean anything"

    restarting = time.monotonic()
    start_again(nsqd)
    after = channel_stats(nsqd, "live", "c") or {}
    assert (after["depth"], after["in_flight_count"], after["deferred_count"]) == (9, 0, 3)
    assert (topic_stats(nsqd, "held") or {})["depth"] == 6

    live_conn = subscriber(nsqd, "live", "c")
    subscribing_held = time.monotonic()
    held_conn = subscriber(nsqd, "held", "c")
    live_conn.rdy(100)
    held_conn.rdy(100)
    prompt = gather([live_conn, held_conn], 9 + 5, timeout=3)
    in_flight_bodies = {m.body for m in in_flight[1:]}
    live_got = [m for index, m, _ in prompt if index == 0]
    held_got = [m for index, m, _ in prompt if index == 1]
    assert_same_bodies(live_got, live[3:] + sorted(in_flight_bodies))
    assert_same_bodies(held_got, held)
    for msg in live_got:  # attempts survive: in-flight ones were delivered once already
        assert msg.attempts == (2 if msg.body in in_flight_bodies else 1), msg
    assert all(m.attempts == 1 for m in held_got)

    late = gather([live_conn, held_conn], 4, timeout=DEFER_MS / 1000 + 3)
    by_body = {msg.body: (index, msg, at) for index, msg, at in late}
    assert set(by_body) == {
        in_flight[0].body,
        b"live deferred 1",
        b"live deferred 2",
        b"held deferred",
    }
    for body in (in_flight[0].body, b"live deferred 1", b"live deferred 2"):
        index, msg, at = by_body[body]
        assert index == 0
        assert at - restarting >= remaining_at_least - 0.05, f"{body!r} came early"
        assert msg.attempts == (2 if body == in_flight[0].body else 1)
    # a topic's deferred message starts its deferral when a channel receives it
    index, msg, at = by_body[b"held deferred"]
    assert index == 1 and msg.attempts == 1
    assert at - subscribing_held >= DEFER_MS / 1000 - 0.05, "held deferred came early"
    live_conn.close()
    held_conn.close()
    for topic, channel in (("live", "c"), ("held", "c")):
        final = channel_stats(nsqd, topic, channel) or {}
        assert (final["depth"], final["deferred_count"]) == (0, 0)


def test_deferred_messages_are_due_at_once_when_only_the_disk_queue_survives(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """Without nsqpy.deferred.json (e.g. the directory went through a Go nsqd) the deferred
    messages still come back from the disk queue, due at once, as Go delivers them."""
    nsqd = launch(daemons, tmp_path)
    http_ok(nsqd, "POST", "/topic/create?topic=t")
    http_ok(nsqd, "POST", "/channel/create?topic=t&channel=c")
    conn = NsqConn(nsqd.tcp_address)
    conn.dpub("t", 60_000, b"deferred a")
    conn.dpub("t", 60_000, b"deferred b")
    conn.close()
    wait_until(lambda: (channel_stats(nsqd, "t", "c") or {}).get("deferred_count") == 2)
    assert nsqd.stop() == 0
    side_file = tmp_path / "nsqpy.deferred.json"
    assert side_file.exists()
    side_file.unlink()

    start_again(nsqd)
    assert (channel_stats(nsqd, "t", "c") or {})["deferred_count"] == 0
    received = consume_from(nsqd, "t", "c", 2, timeout=3)
    assert sorted(m.body for m in received) == [b"deferred a", b"deferred b"]


# ------------------------------------------------------------------------------ scenario 74


def test_startup_scenario_74(tmp_path: Path, daemons: list[DaemonProcess]) -> None:
    """TestStartup: 300 x 256 B through a topic with mem-queue 100 and 10 KiB files, half
    consumed, clean restart: topic depth 0, channel depth 150, the other half readable."""
    flags = ("--mem-queue-size=100", "--max-bytes-per-file=10240")
    nsqd = launch(daemons, tmp_path, *flags)
    assert (tmp_path / "nsqd.dat").read_bytes() == b'{"topics":null,"version":"1.3.0"}'
    expected = [b"%03d" % i + bytes(253) for i in range(300)]
    conn = NsqConn(nsqd.tcp_address)
    for body in expected:
        conn.pub("startup", body)
    conn.close()
    assert (topic_stats(nsqd, "startup") or {})["depth"] == 300

    consumer = subscriber(nsqd, "startup", "ch1")
    first_half = consume(consumer, 150)
    wait_until(lambda: (channel_stats(nsqd, "startup", "ch1") or {}).get("depth") == 150)
    consumer.close()
    metadata = json.loads((tmp_path / "nsqd.dat").read_bytes())
    assert [t["name"] for t in metadata["topics"]] == ["startup"]
    assert nsqd.stop() == 0

    start_again(nsqd)
    assert (topic_stats(nsqd, "startup") or {})["depth"] == 0
    assert (channel_stats(nsqd, "startup", "ch1") or {})["depth"] == 150
    second_half = consume_from(nsqd, "startup", "ch1", 150)
    assert_same_bodies(first_half + second_half, expected)
    wait_until(lambda: (channel_stats(nsqd, "startup", "ch1") or {}).get("depth") == 0)
    final_topic = topic_stats(nsqd, "startup") or {}
    assert (final_topic["depth"], final_topic["backend_depth"]) == (0, 0)


# ------------------------------------------------------------------------------ data path lock


def test_second_nsqd_on_a_locked_data_path_exits_without_touching_it(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    first = launch(daemons, tmp_path, "--mem-queue-size=0")
    NsqConn(first.tcp_address).pub("t", b"before")
    wait_until(lambda: b'"name":"t"' in (tmp_path / "nsqd.dat").read_bytes())
    files_before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    code, stderr = run_nsqd_to_exit(tmp_path)
    assert code == 1, stderr
    assert "failed to lock data-path" in stderr
    assert "TCP: listening" not in stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files_before

    conn = NsqConn(first.tcp_address)  # the first one is unaffected
    conn.pub("t", b"after")
    conn.close()
    assert first.stop() == 0
    second = launch(daemons, tmp_path)  # the lock goes with the first process
    received = consume_from(second, "t", "c", 2)
    assert sorted(m.body for m in received) == [b"after", b"before"]


def test_locked_data_path_message_matches_go(tmp_path: Path, daemons: list[DaemonProcess]) -> None:
    launch(daemons, tmp_path)
    code, stderr = run_nsqd_to_exit(tmp_path)
    assert code == 1
    line = (
        r"\[nsqd\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} FATAL: failed to instantiate nsqd - "
        r"failed to lock data-path: cannot flock directory "
        + re.escape(str(tmp_path))
        + r" - resource temporarily unavailable \(possibly in use by another instance of nsqd\)"
    )
    assert re.fullmatch(line, stderr.strip()), stderr


# ------------------------------------------------------------------------------ ephemeral


def test_ephemeral_topics_and_channels_never_touch_disk(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=2")
    listener = subscriber(nsqd, "t", "c#ephemeral")  # RDY 0: nothing is taken off the queues
    other = subscriber(nsqd, "x#ephemeral", "y#ephemeral")
    conn = NsqConn(nsqd.tcp_address)
    for i in range(10):  # far beyond mem-queue-size: ephemeral overflow is dropped
        conn.pub("e#ephemeral", b"e%d" % i)
        conn.pub("t", b"t%d" % i)
        conn.pub("x#ephemeral", b"x%d" % i)
    conn.close()
    assert (topic_stats(nsqd, "e#ephemeral") or {})["depth"] == 2
    assert (channel_stats(nsqd, "t", "c#ephemeral") or {})["depth"] == 2
    assert (channel_stats(nsqd, "x#ephemeral", "y#ephemeral") or {})["depth"] == 2

    def on_disk() -> list[str]:
        return sorted(p.name for p in tmp_path.iterdir())

    wait_until(
        lambda: (
            (tmp_path / "nsqd.dat").read_bytes()
            == b'{"topics":[{"name":"t","paused":false,"channels":null}],"version":"1.3.0"}'
        ),
        what="nsqd.dat without the ephemeral topics and channels",
    )
    assert not [name for name in on_disk() if "ephemeral" in name]
    listener.close()
    other.close()
    assert nsqd.stop() == 0
    assert not [name for name in on_disk() if "ephemeral" in name]
    assert set(on_disk()) <= {"nsqd.dat", "t.diskqueue.meta.dat"}

    start_again(nsqd)
    assert [t["topic_name"] for t in stats(nsqd)["topics"]] == ["t"]
    assert (topic_stats(nsqd, "t") or {})["channels"] == []


# ------------------------------------------------------------------------------ full disk

LIMIT = 8192  # bytes any one file may reach: the "disk" is full at 8 KiB per file
BODY = bytes(500)


def launch_limited(
    daemons: list[DaemonProcess], data_path: Path, limit: int, *args: str
) -> FileSizeLimitedNsqd:
    nsqd = FileSizeLimitedNsqd(limit, data_path, *args)
    daemons.append(nsqd)
    start_again(nsqd)
    return nsqd


def publish_until_refused(
    nsqd: DaemonProcess, topic: str, make_body: Callable[[int], bytes]
) -> tuple[list[bytes], str]:
    """PUB until nsqd refuses; returns (acknowledged bodies, the error text after PUB failed)."""
    conn = NsqConn(nsqd.tcp_address)
    acknowledged = []
    try:
        for i in range(100):  # 8 KiB / ~530 B records: refused long before this
            body = make_body(i)
            conn.send(pub_cmd(topic, body))
            frame_type, data = conn.read_frame()
            if frame_type == 0:
                assert data == b"OK"
                acknowledged.append(body)
                continue
            assert frame_type == 1
            prefix = b"E_PUB_FAILED PUB failed "
            assert data.startswith(prefix), data
            conn.expect_closed()  # E_PUB_FAILED is fatal
            return acknowledged, data[len(prefix) :].decode()
    finally:
        conn.close()
    raise AssertionError("nsqd never refused a write")


def health(nsqd: DaemonProcess) -> tuple[int, bytes, str, bytes]:
    """(/ping status, /ping body, /stats JSON health, /stats text)."""
    ping = http_request(nsqd, "GET", "/ping")
    stats_text = http_request(nsqd, "GET", "/stats")
    assert stats_text.status == 200
    return ping.status, ping.body, stats(nsqd)["health"], stats_text.body


def assert_unhealthy(nsqd: DaemonProcess, error: str) -> None:
    ping_status, ping_body, json_health, text = health(nsqd)
    assert (ping_status, ping_body) == (500, f"NOK - {error}".encode())
    assert json_health == f"NOK - {error}"
    assert f"\nHealth: NOK - {error}\n".encode() in text


def assert_healthy(nsqd: DaemonProcess) -> None:
    ping_status, ping_body, json_health, text = health(nsqd)
    assert (ping_status, ping_body, json_health) == (200, b"OK", "OK")
    assert b"\nHealth: OK\n" in text


@pytest.mark.parametrize("queue_kind", ["topic", "channel"])
def test_failed_disk_write_makes_nsqd_unhealthy_until_a_write_succeeds(
    tmp_path: Path, daemons: list[DaemonProcess], queue_kind: str
) -> None:
    nsqd = launch_limited(daemons, tmp_path, LIMIT, "--mem-queue-size=0")
    if queue_kind == "channel":
        http_ok(nsqd, "POST", "/topic/create?topic=full")
        http_ok(nsqd, "POST", "/channel/create?topic=full&channel=c")
    assert_healthy(nsqd)

    acknowledged, error = publish_until_refused(nsqd, "full", lambda i: b"%04d" % i + BODY)
    assert acknowledged, "the first writes fit"
    assert error
    assert_unhealthy(nsqd, error)

    conn = NsqConn(nsqd.tcp_address)
    conn.send(mpub_cmd("full", [b"m1" + BODY, b"m2" + BODY]))
    conn.expect_error(f"E_MPUB_FAILED MPUB failed {error}")
    conn.close()
    resp = http_request(nsqd, "POST", "/pub?topic=full", b"h" + BODY)
    assert (resp.status, resp.body) == (503, b'{"message":"EXITING"}')
    assert_unhealthy(nsqd, error)

    NsqConn(nsqd.tcp_address).pub("elsewhere", b"x" * 100)  # another file: fits
    assert_healthy(nsqd)
    assert nsqd.proc is not None and nsqd.proc.poll() is None


def test_full_disk_never_loses_an_acknowledged_message(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    nsqd = launch_limited(daemons, tmp_path, LIMIT, "--mem-queue-size=0")
    acknowledged, error = publish_until_refused(nsqd, "full", lambda i: b"a%04d" % i + BODY)
    refused = [b"r1" + BODY, b"r2" + BODY, b"r3" + BODY]  # may be partly stored, never acked
    conn = NsqConn(nsqd.tcp_address)
    conn.send(mpub_cmd("full", refused))
    conn.expect_error(f"E_MPUB_FAILED MPUB failed {error}")
    conn.close()
    assert_unhealthy(nsqd, error)

    nsqd.set_limit(resource.RLIM_INFINITY)  # space is freed: the same queue takes writes again
    later = [b"later%d" % i + BODY for i in range(5)]
    conn = NsqConn(nsqd.tcp_address)
    for body in later:
        conn.pub("full", body)
    conn.close()
    assert_healthy(nsqd)

    assert nsqd.kill() == -signal.SIGKILL
    nsqd.limit = resource.RLIM_INFINITY
    start_again(nsqd)
    depth = (topic_stats(nsqd, "full") or {})["depth"]
    received = Counter(m.body for m in consume_from(nsqd, "full", "c", depth))
    assert max(received.values()) == 1, "duplicates"
    assert not Counter(acknowledged + later) - received, "acknowledged messages were lost"
    assert not received - Counter(acknowledged + later + refused), "garbage came back"
