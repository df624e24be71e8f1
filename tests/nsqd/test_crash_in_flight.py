"""With --mem-queue-size=0 and --sync-every=1 a SIGKILL loses no acknowledged message,
whether it waits in the channel, is in flight, deferred (REQ with a delay, DPUB) or requeued.

The consumers and the publisher are the suite's raw V2 client (tests/raw_v2.py); nsqd is a real
process killed with SIGKILL and restarted on the same data directory.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from nsqpy.testing import DaemonProcess

from ..raw_v2 import Message, NsqConn, channel_stats, http_ok, wait_until
from .nsqd_storage_support import gather, launch, read_meta, start_again

DURABLE = ("--mem-queue-size=0", "--sync-every=1", "--msg-timeout=1s")
LONG_MS = 60_000  # deferrals and msg_timeouts that do not end during the test


def listed_with_channel(directory: Path, topic: str) -> bool:
    metadata = json.loads((directory / "nsqd.dat").read_bytes())
    return any(t["name"] == topic and t["channels"] for t in metadata["topics"] or [])


def take(conn: NsqConn, count: int, seen: dict[bytes, int]) -> list[Message]:
    """Read ``count`` messages, noting the highest attempts each body was delivered with."""
    got = [conn.expect_message() for _ in range(count)]
    for msg in got:
        seen[msg.body] = max(seen.get(msg.body, 0), msg.attempts)
    return got


def channel_state(nsqd: DaemonProcess) -> tuple[int, int, int]:
    found = channel_stats(nsqd, "crash", "c") or {}
    return found.get("depth", -1), found.get("in_flight_count", -1), found.get("deferred_count", -1)


def consume_until_all(
    nsqd: DaemonProcess, wanted: Iterable[bytes], timeout: float
) -> list[Message]:
    """Subscribe and FIN everything until every body in ``wanted`` has arrived (or time is up);
    returns every delivery, duplicates included."""
    missing = set(wanted)
    conn = NsqConn(nsqd.tcp_address)
    conn.sub("crash", "c")
    conn.rdy(100)
    received: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while missing and time.monotonic() < deadline:
            try:
                arrived = gather(
                    [conn], 1, timeout=max(0.05, min(1.0, deadline - time.monotonic()))
                )
            except AssertionError:
                continue  # nothing within the slice; look again until the deadline
            for _, msg, _ in arrived:
                received.append(msg)
                missing.discard(msg.body)
    finally:
        conn.close()
    return received


def test_sigkill_loses_no_acknowledged_message_in_flight_deferred_or_requeued(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    nsqd = launch(daemons, tmp_path, *DURABLE)
    http_ok(nsqd, "POST", "/topic/create?topic=crash")
    http_ok(nsqd, "POST", "/channel/create?topic=crash&channel=c")
    wait_until(lambda: listed_with_channel(tmp_path, "crash"))
    publisher = NsqConn(nsqd.tcp_address)
    published = [b"pub-%03d" % i for i in range(60)]
    for body in published:
        publisher.pub("crash", body)

    seen: dict[bytes, int] = {}  # body -> highest attempts a consumer saw before the kill
    holder = NsqConn(nsqd.tcp_address)  # keeps a full RDY window in flight
    holder.identify(msg_timeout=LONG_MS)
    holder.sub("crash", "c")
    holder.rdy(20)
    window = take(holder, 20, seen)
    for msg in window[:5]:  # requeued at once: redelivered to the holder, attempts 2
        holder.req(msg.id, 0)
    take(holder, 5, seen)
    for msg in window[5:9]:  # deferred by REQ: the window refills from the queue
        holder.req(msg.id, LONG_MS)
    take(holder, 4, seen)
    finished = window[9:12]
    for msg in finished:
        holder.fin(msg.id)
    take(holder, 3, seen)

    dropper = NsqConn(nsqd.tcp_address)  # lets its messages time out (--msg-timeout=1s)
    dropper.sub("crash", "c")
    dropper.rdy(10)
    take(dropper, 10, seen)
    dropper.rdy(0)
    wait_until(
        lambda: (channel_stats(nsqd, "crash", "c") or {}).get("timeout_count") == 10,
        timeout=5,
        what="the dropper's messages timing out and being requeued",
    )

    deferred_bodies = [b"dpub-%02d" % i for i in range(10)]
    for body in deferred_bodies:
        publisher.dpub("crash", LONG_MS, body)
    waiting_bodies = [b"late-%02d" % i for i in range(20)]
    for body in waiting_bodies:
        publisher.pub("crash", body)
    # 60 - 27 taken by the holder - 10 by the dropper + 10 timed out + 20 late ones
    wait_until(lambda: channel_state(nsqd) == (53, 20, 14), what="the state before the kill")

    assert nsqd.kill() == -signal.SIGKILL
    holder.close()
    dropper.close()
    publisher.close()
    start_again(nsqd)

    acknowledged = published + deferred_bodies + waiting_bodies
    must_return = set(acknowledged) - {m.body for m in finished}
    received = consume_until_all(nsqd, must_return, timeout=15)
    got = {m.body for m in received}
    lost = sorted(must_return - got)
    assert not lost, f"{len(lost)} acknowledged messages lost: {lost[:10]}"
    assert got <= set(acknowledged), "messages that were never published came back"
    for msg in received:
        assert msg.attempts >= seen.get(msg.body, 1), (
            f"{msg.body!r} came back with attempts {msg.attempts}, "
            f"a consumer had seen {seen[msg.body]}"
        )


def test_clean_restart_in_durable_mode_keeps_deferrals_and_attempts(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """SIGTERM keeps nsqpy's restart behaviour in this mode too: in-flight messages come back
    with their attempts, deferred ones (REQ and DPUB) stay deferred, nothing is delivered twice."""
    defer_ms = 3000
    nsqd = launch(daemons, tmp_path, *DURABLE)
    http_ok(nsqd, "POST", "/topic/create?topic=crash")
    http_ok(nsqd, "POST", "/channel/create?topic=crash&channel=c")
    publisher = NsqConn(nsqd.tcp_address)
    for i in range(10):
        publisher.pub("crash", b"pub-%d" % i)
    consumer = NsqConn(nsqd.tcp_address)
    consumer.identify(msg_timeout=LONG_MS)
    consumer.sub("crash", "c")
    consumer.rdy(4)
    seen: dict[bytes, int] = {}
    in_flight = take(consumer, 4, seen)
    consumer.rdy(0)
    consumer.req(in_flight[0].id, defer_ms)
    publisher.dpub("crash", defer_ms, b"dpub")
    wait_until(lambda: channel_state(nsqd) == (6, 3, 2), what="the state before the shutdown")
    assert nsqd.stop() == 0
    consumer.close()
    publisher.close()

    start_again(nsqd)
    restarted = time.monotonic()
    assert channel_state(nsqd) == (9, 0, 2)
    conn = NsqConn(nsqd.tcp_address)
    conn.sub("crash", "c")
    conn.rdy(100)
    prompt = gather([conn], 9, timeout=3)
    prompt_bodies = sorted(m.body for _, m, _ in prompt)
    assert prompt_bodies == sorted(b"pub-%d" % i for i in range(1, 10))
    for _, msg, _ in prompt:
        assert msg.attempts == (2 if msg.body in seen else 1), msg
    late = gather([conn], 2, timeout=defer_ms / 1000 + 3)
    assert sorted(m.body for _, m, _ in late) == [b"dpub", in_flight[0].body]
    assert all(at - restarted > 0.5 for _, _, at in late), "deferred messages came early"
    conn.expect_nothing(0.5)
    conn.close()
    assert channel_state(nsqd) == (0, 0, 0)


def test_a_long_deferral_does_not_hold_back_the_committed_position(
    tmp_path: Path, daemons: list[DaemonProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message REQ'd for a minute at the head of the held records is stored again at the
    tail once the committed position keeps more than NSQPY_HELD_RELOCATE_AFTER records, so
    the metadata moves on (files can go), and the message still survives a SIGKILL."""
    monkeypatch.setenv("NSQPY_HELD_RELOCATE_AFTER", "50")
    nsqd = launch(daemons, tmp_path, *DURABLE)
    http_ok(nsqd, "POST", "/topic/create?topic=crash")
    http_ok(nsqd, "POST", "/channel/create?topic=crash&channel=c")
    wait_until(lambda: listed_with_channel(tmp_path, "crash"))
    publisher = NsqConn(nsqd.tcp_address)
    publisher.pub("crash", b"deferred")
    consumer = NsqConn(nsqd.tcp_address)
    consumer.identify(msg_timeout=LONG_MS)
    consumer.sub("crash", "c")
    consumer.rdy(1)
    first = consumer.expect_message()
    consumer.req(first.id, LONG_MS)
    later = [b"later-%03d" % i for i in range(200)]
    publisher.mpub("crash", later)
    consumer.rdy(50)
    for _ in later:
        consumer.fin(consumer.expect_message().id)
    wait_until(
        lambda: read_meta(tmp_path, "crash:c").read_pos > 0,
        what="the committed read position leaving the deferred message's first record",
    )
    assert channel_state(nsqd)[2] == 1

    assert nsqd.kill() == -signal.SIGKILL
    consumer.close()
    publisher.close()
    start_again(nsqd)
    received = consume_until_all(nsqd, [b"deferred"], timeout=10)
    assert b"deferred" in {m.body for m in received}
    again = [m for m in received if m.body != b"deferred"]
    assert len(again) < len(later), "a restart delivered every finished message again"
