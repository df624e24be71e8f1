"""Server-side max attempts and dead-lettering against real nsqd processes."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from nsqpy.testing import DaemonProcess

from ..raw_v2 import (
    Message,
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


def get_json(nsqd: DaemonProcess, path: str) -> dict[str, Any]:
    resp = http_request(nsqd, "GET", path)
    assert resp.status == 200, (path, resp.status, resp.body)
    result = resp.json()
    assert isinstance(result, dict)
    return result


def drain_all(conn: NsqConn, count: int, timeout: float = 10.0) -> list[Message]:
    """Receive ``count`` messages (RDY count) and FIN each."""
    conn.rdy(count)
    got = [conn.expect_message(timeout=timeout) for _ in range(count)]
    for msg in got:
        conn.fin(msg.id)
    return got


def test_boundary_attempts_n_delivered_then_dead_lettered(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(daemons, tmp_path, "--max-attempts=3")
    topic = unique("dl")
    body = b"\x00poison\xff body stays byte for byte"
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "work")
    NsqConn(nsqd.tcp_address).pub(topic, body)
    consumer.rdy(1)
    seen = []
    for _ in range(3):  # attempts 1, 2, 3 are delivered: N is allowed
        msg = consumer.expect_message()
        seen.append(msg.attempts)
        consumer.req(msg.id, 0)
    assert seen == [1, 2, 3]
    consumer.expect_nothing(0.3, allow_heartbeats=True)  # attempt 4 never happens
    wait_until(lambda: (channel_stats(nsqd, topic, "work") or {}).get("dead_letter_count") == 1)
    stats = channel_stats(nsqd, topic, "work")
    assert stats is not None
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0 and stats["max_attempts"] == 3
    dead_topic = topic_stats(nsqd, topic + ".dead")
    assert dead_topic is not None and dead_topic["depth"] == 1

    dead = NsqConn(nsqd.tcp_address)
    dead.sub(topic + ".dead", "triage")
    (msg,) = drain_all(dead, 1)
    assert msg.body == body
    assert msg.attempts == 1  # a fresh start in the dead-letter topic
    history = get_json(nsqd, "/dead_letter?" + q(id=msg.id.decode()))
    assert history["original_topic"] == topic
    assert history["original_channel"] == "work"
    assert history["attempts"] == 3
    assert history["topic"] == topic + ".dead"
    assert len(history["original_id"]) == 16
    listed = get_json(nsqd, "/dead_letter?" + q(topic=topic + ".dead"))["messages"]
    assert [e["id"] for e in listed] == [msg.id.decode()]
    labels = {"type": "channel", "topic": topic, "channel": "work", "paused": "false"}
    assert value(scrape(nsqd), "nsq_channel_dead_letter_count", **labels) == 1
    for conn in (consumer, dead):
        conn.close()


def test_timeouts_and_deferred_req_count_as_attempts(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(daemons, tmp_path, "--max-attempts=2", "--msg-timeout=200ms")
    topic = unique("dlt")
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    NsqConn(nsqd.tcp_address).pub(topic, b"slow")
    consumer.rdy(1)
    first = consumer.expect_message()
    assert first.attempts == 1  # let it time out
    second = consumer.expect_message(timeout=5)
    assert second.attempts == 2
    consumer.req(second.id, 60_000)  # a deferred REQ at the limit dead-letters at once
    wait_until(lambda: (channel_stats(nsqd, topic, "c") or {}).get("dead_letter_count") == 1)
    c = channel_stats(nsqd, topic, "c")
    assert c is not None and c["deferred_count"] == 0 and c["timeout_count"] == 1
    assert (topic_stats(nsqd, topic + ".dead") or {}).get("depth") == 1
    consumer.close()


def test_default_is_go_behaviour(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    nsqd = launch(daemons, tmp_path)
    topic = unique("nodl")
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    NsqConn(nsqd.tcp_address).pub(topic, b"again")
    consumer.rdy(1)
    for attempt in range(1, 8):
        msg = consumer.expect_message()
        assert msg.attempts == attempt
        consumer.req(msg.id, 0)
    c = channel_stats(nsqd, topic, "c")
    assert c is not None and "dead_letter_count" not in c and "max_attempts" not in c
    assert topic_stats(nsqd, topic + ".dead") is None
    consumer.close()


def test_per_channel_settings_persist_and_validate(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(daemons, tmp_path)
    topic = unique("pc")
    http_ok(nsqd, "POST", "/topic/create?" + q(topic=topic))
    for channel in ("strict", "lenient"):
        http_ok(nsqd, "POST", "/channel/create?" + q(topic=topic, channel=channel))
    path = "/channel/config?" + q(
        topic=topic, channel="strict", max_attempts="1", dead_letter_topic_suffix="_poison"
    )
    resp = http_request(nsqd, "POST", path)
    assert resp.status == 200, resp.body
    assert resp.json() == {
        "max_attempts": 1,
        "dead_letter_topic_suffix": "_poison",
        "dead_letter_count": 0,
    }
    bad = [
        q(topic=topic, channel="strict", max_attempts="-1"),
        q(topic=topic, channel="strict", max_attempts="x"),
        q(topic=topic, channel="strict", dead_letter_topic_suffix="bad suffix"),
        q(topic=topic, channel="strict", dead_letter_topic_suffix="." * 64),
    ]
    for params in bad:
        assert http_request(nsqd, "POST", "/channel/config?" + params).status == 400, params
    missing = http_request(nsqd, "POST", "/channel/config?" + q(topic=topic, channel="nope"))
    assert missing.status == 404

    nsqd.stop()
    nsqd.restart()  # the setting lives in nsqpy.channel_config.json, nsqd.dat is Go's
    assert (tmp_path / "nsqpy.channel_config.json").exists()
    strict = NsqConn(nsqd.tcp_address)
    strict.sub(topic, "strict")
    lenient = NsqConn(nsqd.tcp_address)
    lenient.sub(topic, "lenient")
    NsqConn(nsqd.tcp_address).pub(topic, b"once")
    for conn in (strict, lenient):
        conn.rdy(1)
        conn.req(conn.expect_message().id, 0)
    again = lenient.expect_message()
    assert again.attempts == 2  # lenient has no limit
    lenient.fin(again.id)
    strict.expect_nothing(0.3, allow_heartbeats=True)
    wait_until(lambda: (topic_stats(nsqd, topic + "_poison") or {}).get("depth") == 1)
    assert topic_stats(nsqd, topic + ".dead") is None
    got = get_json(nsqd, "/channel/config?" + q(topic=topic, channel="lenient"))
    assert got["max_attempts"] == 0
    for conn in (strict, lenient):
        conn.close()


def test_dead_letters_survive_clean_restart(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    nsqd = launch(daemons, tmp_path, "--max-attempts=1")
    topic = unique("rs")
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    NsqConn(nsqd.tcp_address).mpub(topic, [b"a", b"b", b"c"])
    consumer.rdy(3)
    for _ in range(3):
        consumer.req(consumer.expect_message().id, 0)
    wait_until(lambda: (topic_stats(nsqd, topic + ".dead") or {}).get("depth") == 3)
    consumer.close()
    nsqd.stop()
    nsqd.restart()
    dead = NsqConn(nsqd.tcp_address)
    dead.sub(topic + ".dead", "c")
    msgs = drain_all(dead, 3)
    assert sorted(m.body for m in msgs) == [b"a", b"b", b"c"]
    for msg in msgs:  # the history too
        assert get_json(nsqd, "/dead_letter?" + q(id=msg.id.decode()))["original_topic"] == topic
    dead.close()


def test_sigkill_loses_nothing(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    """Dead-letter while nsqd is killed: every message is afterwards in the dead-letter topic or
    still in its channel, and none was dead-lettered twice."""
    args = ("--max-attempts=1", "--mem-queue-size=0", "--sync-every=1")
    nsqd = launch(daemons, tmp_path, *args)
    topic = unique("kill")
    bodies = [b"k%03d" % i for i in range(60)]
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    NsqConn(nsqd.tcp_address).mpub(topic, bodies)
    consumer.rdy(5)
    for _ in range(30):
        consumer.req(consumer.expect_message().id, 0)
    wait_until(lambda: (channel_stats(nsqd, topic, "c") or {}).get("dead_letter_count") == 30)
    assert nsqd.proc is not None
    nsqd.proc.send_signal(signal.SIGKILL)
    nsqd.proc.wait(10)

    nsqd.restart()
    c = wait_until(lambda: channel_stats(nsqd, topic, "c"))
    d = wait_until(lambda: topic_stats(nsqd, topic + ".dead"))
    assert c is not None and d is not None
    left, dead_count = c["depth"], d["depth"]
    assert dead_count >= 30  # acknowledged by the counter before the kill: on disk
    consumer.close()
    original = NsqConn(nsqd.tcp_address)
    original.sub(topic, "c")
    remaining = drain_all(original, left) if left else []
    dead = NsqConn(nsqd.tcp_address)
    dead.sub(topic + ".dead", "c")
    dead_letters = drain_all(dead, dead_count)
    dead_bodies = [m.body for m in dead_letters]
    assert len(dead_bodies) == len(set(dead_bodies))  # none dead-lettered twice
    assert set(dead_bodies) | {m.body for m in remaining} == set(bodies)  # none lost
    for conn in (original, dead):
        conn.close()
