"""Bounded queues (--max-queue-bytes, --queue-full-policy; nsqio/nsq#549) and
--max-defer-timeout (nsqio/nsq#1499) against real nsqd processes.

Every body here is 10 bytes, so every message takes 40 queue bytes (4-byte record length +
26-byte message header + body) in memory or on disk; a cap of 400 holds exactly 10.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from nsqpy.testing import DaemonProcess

from ..raw_v2 import (
    Message,
    NsqConn,
    channel_stats,
    dpub_cmd,
    http_ok,
    http_request,
    mpub_cmd,
    pub_cmd,
    q,
    topic_stats,
    unique,
    wait_until,
)
from .support import launch, scrape, value

RECORD = 40  # queue bytes of one message with a 10-byte body


def body(i: int) -> bytes:
    return b"m%09d" % i


def chan(nsqd: DaemonProcess, topic: str, channel: str) -> dict[str, Any]:
    stats = channel_stats(nsqd, topic, channel)
    assert stats is not None
    return stats


def create_channel(nsqd: DaemonProcess, topic: str, channel: str = "c") -> None:
    http_ok(nsqd, "POST", "/topic/create?" + q(topic=topic))
    http_ok(nsqd, "POST", "/channel/create?" + q(topic=topic, channel=channel))


def receive(conn: NsqConn, count: int) -> list[Message]:
    return [conn.expect_message() for _ in range(count)]


def config(nsqd: DaemonProcess, topic: str, channel: str, **params: str) -> dict[str, Any]:
    method = "POST" if params else "GET"
    resp = http_request(
        nsqd, method, "/channel/config?" + q(topic=topic, channel=channel, **params)
    )
    assert resp.status == 200, resp.body
    result = resp.json()
    assert isinstance(result, dict)
    return result


def test_refuse_policy_on_tcp_and_http(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    # 4 messages in memory, the rest on disk in files of 2 records: queue bytes span files
    nsqd = launch(
        daemons, tmp_path, "--max-queue-bytes=400", "--mem-queue-size=4", "--max-bytes-per-file=100"
    )
    topic = unique("refuse")
    create_channel(nsqd, topic)
    producer = NsqConn(nsqd.tcp_address)
    for i in range(10):
        producer.pub(topic, body(i))
    stats = chan(nsqd, topic, "c")
    assert (stats["depth"], stats["backend_depth"], stats["queue_bytes"]) == (10, 6, 400)
    assert (stats["max_queue_bytes"], stats["queue_full_policy"]) == (400, "refuse")

    full = "queue full (channel c: 400 + {} > 400 bytes)"
    producer.send(pub_cmd(topic, body(10)))
    producer.expect_error("E_PUB_FAILED PUB failed " + full.format(RECORD))  # fatal, as Go's
    producer = NsqConn(nsqd.tcp_address)
    producer.send(mpub_cmd(topic, [body(11), body(12)]))
    producer.expect_error("E_MPUB_FAILED MPUB failed " + full.format(2 * RECORD))
    producer = NsqConn(nsqd.tcp_address)
    producer.send(dpub_cmd(topic, 1000, body(13)))
    producer.expect_error("E_DPUB_FAILED DPUB failed " + full.format(RECORD))
    resp = http_request(nsqd, "POST", "/pub?" + q(topic=topic), body(14))
    assert (resp.status, resp.body) == (503, b'{"message":"QUEUE_FULL"}')
    resp = http_request(nsqd, "POST", "/mpub?" + q(topic=topic), body(15) + b"\n" + body(16))
    assert (resp.status, resp.body) == (503, b'{"message":"QUEUE_FULL"}')

    refused = 1 + 2 + 1 + 1 + 2
    stats = chan(nsqd, topic, "c")
    assert (stats["depth"], stats["queue_bytes"], stats["message_count"]) == (10, 400, 10)
    assert (stats["queue_refused_count"], stats["queue_dropped_count"]) == (refused, 0)
    topic_now = topic_stats(nsqd, topic)
    assert topic_now is not None
    assert (topic_now["message_count"], topic_now["queue_refused_count"]) == (10, refused)
    metrics = scrape(nsqd)
    labels = {"type": "channel", "topic": topic, "channel": "c", "paused": "false"}
    assert value(metrics, "nsq_channel_queue_refused_count", **labels) == refused
    assert value(metrics, "nsq_channel_queue_bytes", **labels) == 400
    assert value(metrics, "nsq_channel_max_queue_bytes", **labels) == 400
    assert metrics["nsq_channel_queue_dropped_count"][0] == "counter"
    topic_labels = {"type": "topic", "topic": topic, "paused": "false"}
    assert value(metrics, "nsq_topic_queue_refused_count", **topic_labels) == refused

    # one consumed: room for exactly one more, nothing else was stored meanwhile
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    consumer.rdy(1)
    first = consumer.expect_message()
    consumer.rdy(0)  # before FIN, or FIN pulls the next message
    consumer.fin(first.id)
    wait_until(lambda: chan(nsqd, topic, "c")["queue_bytes"] == 400 - RECORD)
    producer = NsqConn(nsqd.tcp_address)
    producer.pub(topic, body(17))
    producer.send(pub_cmd(topic, body(18)))
    producer.expect_error("E_PUB_FAILED PUB failed " + full.format(RECORD))
    consumer.rdy(20)
    rest = {m.body for m in receive(consumer, 10)}
    assert rest | {first.body} == {body(i) for i in range(10)} | {body(17)}
    consumer.expect_nothing(0.2, allow_heartbeats=True)


def test_an_admitted_mpub_is_stored_on_tcp_and_http(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(daemons, tmp_path, "--max-queue-bytes=4000")
    topic = unique("admitted")
    create_channel(nsqd, topic)
    producer = NsqConn(nsqd.tcp_address)
    producer.mpub(topic, [body(0), body(1), body(2)])
    http_ok(nsqd, "POST", "/mpub?" + q(topic=topic), body(3) + b"\n" + body(4))
    stats = chan(nsqd, topic, "c")
    assert (stats["depth"], stats["queue_bytes"]) == (5, 5 * RECORD)
    topic_now = topic_stats(nsqd, topic)
    assert topic_now is not None and topic_now["message_count"] == 5
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    consumer.rdy(10)
    assert {m.body for m in receive(consumer, 5)} == {body(i) for i in range(5)}


def test_topic_queue_without_channels_is_capped_too(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(daemons, tmp_path, "--max-queue-bytes=80", "--mem-queue-size=1")
    topic = unique("lonely")
    producer = NsqConn(nsqd.tcp_address)
    producer.pub(topic, body(0))
    producer.pub(topic, body(1))
    producer.send(pub_cmd(topic, body(2)))
    producer.expect_error(f"E_PUB_FAILED PUB failed queue full (topic {topic}: 80 + 40 > 80 bytes)")
    stats = topic_stats(nsqd, topic)
    assert stats is not None
    assert (stats["depth"], stats["backend_depth"], stats["queue_bytes"]) == (2, 1, 80)
    assert stats["queue_refused_count"] == 1
    # a message bigger than the cap is refused under drop-oldest as well
    (tmp_path / "other").mkdir()
    other = launch(
        daemons, tmp_path / "other", "--max-queue-bytes=45", "--queue-full-policy=drop-oldest"
    )
    producer = NsqConn(other.tcp_address)
    producer.pub(topic, body(0))
    producer.send(pub_cmd(topic, b"x" * 16))
    producer.expect_error(f"E_PUB_FAILED PUB failed queue full (topic {topic}: 40 + 46 > 45 bytes)")
    stats = topic_stats(other, topic)
    assert stats is not None and (stats["depth"], stats["queue_dropped_count"]) == (1, 0)


def test_a_refusing_channel_stops_the_others_dropping(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(daemons, tmp_path)
    topic = unique("mixed")
    create_channel(nsqd, topic, "lossy")
    create_channel(nsqd, topic, "strict")
    config(nsqd, topic, "lossy", max_queue_bytes="80", queue_full_policy="drop-oldest")
    config(nsqd, topic, "strict", max_queue_bytes="200")
    producer = NsqConn(nsqd.tcp_address)
    for i in range(5):
        producer.pub(topic, body(i))
    assert chan(nsqd, topic, "lossy")["queue_dropped_count"] == 3
    producer.send(pub_cmd(topic, body(5)))
    producer.expect_error(
        "E_PUB_FAILED PUB failed queue full (channel strict: 200 + 40 > 200 bytes)"
    )
    lossy, strict = chan(nsqd, topic, "lossy"), chan(nsqd, topic, "strict")
    assert (lossy["queue_dropped_count"], lossy["depth"], lossy["queue_refused_count"]) == (3, 2, 0)
    assert (strict["queue_refused_count"], strict["depth"]) == (1, 5)


def test_drop_oldest_while_a_consumer_is_mid_batch(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(
        daemons,
        tmp_path,
        "--max-queue-bytes=400",
        "--queue-full-policy=drop-oldest",
        "--mem-queue-size=4",
        "--max-bytes-per-file=100",
    )
    topic = unique("drop")
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    consumer.rdy(5)
    producer = NsqConn(nsqd.tcp_address)
    for i in range(5):
        producer.pub(topic, body(i))
    batch = receive(consumer, 5)  # in flight, not finished: they are not in the queue
    assert [m.body for m in batch] == [body(i) for i in range(5)]
    for i in range(5, 25):
        producer.pub(topic, body(i))  # every publish is accepted
    stats = chan(nsqd, topic, "c")
    assert (stats["in_flight_count"], stats["depth"], stats["queue_bytes"]) == (5, 10, 400)
    assert stats["queue_dropped_count"] == 10  # m5..m14, the oldest queued

    # a requeued in-flight message enters the full queue anyway (it was accepted) ...
    consumer.rdy(0)
    consumer.req(batch[0].id, 0)
    wait_until(lambda: chan(nsqd, topic, "c")["depth"] == 11)
    assert chan(nsqd, topic, "c")["queue_bytes"] == 440  # above the cap until the next publish
    # ... at the back, as for delivery; the next publish drops the two oldest at the front
    # (m15, m16)
    producer.pub(topic, body(25))
    stats = chan(nsqd, topic, "c")
    assert (stats["depth"], stats["queue_bytes"], stats["queue_dropped_count"]) == (10, 400, 12)
    for msg in batch[1:]:
        consumer.fin(msg.id)  # in flight all along: finished normally, never dropped
    consumer.rdy(20)
    rest = receive(consumer, 10)
    assert sorted(m.body for m in rest) == [body(0)] + [body(i) for i in range(17, 26)]
    consumer.expect_nothing(0.2, allow_heartbeats=True)  # no E_FIN_FAILED either
    stats = chan(nsqd, topic, "c")
    assert (stats["depth"], stats["in_flight_count"], stats["queue_bytes"]) == (0, 10, 0)
    # published 26 = 4 finished from the batch + 9 new ones delivered now + 12 dropped, and m0
    # delivered again
    assert stats["message_count"] == 26 + 1 - 1  # the requeue is not a new message


def test_cap_lowered_below_depth(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    nsqd = launch(daemons, tmp_path, "--mem-queue-size=4", "--max-bytes-per-file=100")
    drop, hold = unique("lower"), unique("hold")
    producer = NsqConn(nsqd.tcp_address)
    for topic in (drop, hold):
        create_channel(nsqd, topic)
        for i in range(10):
            producer.pub(topic, body(i))
    assert "max_queue_bytes" not in chan(nsqd, drop, "c")  # no cap: Go's keys only

    # drop-oldest: the queue is trimmed at once to the new cap
    got = config(nsqd, drop, "c", max_queue_bytes="120", queue_full_policy="drop-oldest")
    assert (got["max_queue_bytes"], got["queue_bytes"], got["queue_dropped_count"]) == (120, 120, 7)
    assert chan(nsqd, drop, "c")["depth"] == 3
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(drop, "c")
    consumer.rdy(10)
    assert sorted(m.body for m in receive(consumer, 3)) == [body(7), body(8), body(9)]

    # refuse: nothing is dropped, publishes wait until consumers bring it under the cap
    got = config(nsqd, hold, "c", max_queue_bytes="120", queue_full_policy="refuse")
    assert (got["queue_bytes"], got["queue_dropped_count"]) == (400, 0)
    producer.send(pub_cmd(hold, body(10)))
    producer.expect_error("E_PUB_FAILED PUB failed queue full (channel c: 400 + 40 > 120 bytes)")
    reader = NsqConn(nsqd.tcp_address)
    reader.sub(hold, "c")
    reader.rdy(8)
    taken = receive(reader, 8)
    reader.rdy(0)
    for msg in taken:
        reader.fin(msg.id)
    wait_until(lambda: chan(nsqd, hold, "c")["queue_bytes"] == 80, what="two left")
    producer = NsqConn(nsqd.tcp_address)
    producer.pub(hold, body(11))
    assert chan(nsqd, hold, "c")["queue_refused_count"] == 1

    for bad in (
        {"max_queue_bytes": "-1"},
        {"max_queue_bytes": "lots"},
        {"queue_full_policy": "drop-newest"},
    ):
        path = "/channel/config?" + q(topic=hold, channel="c", **bad)
        assert http_request(nsqd, "POST", path).status == 400, bad
    assert config(nsqd, hold, "c")["max_queue_bytes"] == 120  # unchanged by the bad requests


def test_restart_keeps_settings_and_counts(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    nsqd = launch(daemons, tmp_path)
    strict, lossy = unique("strict"), unique("lossy")
    for topic in (strict, lossy):
        create_channel(nsqd, topic)
    config(nsqd, strict, "c", max_queue_bytes="80")
    config(nsqd, lossy, "c", max_queue_bytes="80", queue_full_policy="drop-oldest")
    producer = NsqConn(nsqd.tcp_address)
    for i in range(3):
        producer.pub(lossy, body(i))
    producer.pub(strict, body(0))
    producer.pub(strict, body(1))
    producer.send(pub_cmd(strict, body(2)))
    producer.expect_error("E_PUB_FAILED PUB failed queue full (channel c: 80 + 40 > 80 bytes)")

    nsqd.stop()
    nsqd.restart()
    assert (tmp_path / "nsqpy.queue_limits.json").exists()
    got = config(nsqd, strict, "c")
    assert (got["max_queue_bytes"], got["queue_full_policy"]) == (80, "refuse")
    assert (got["queue_bytes"], got["queue_refused_count"]) == (80, 1)
    got = config(nsqd, lossy, "c")
    assert (got["queue_full_policy"], got["queue_dropped_count"], got["queue_bytes"]) == (
        "drop-oldest",
        1,
        80,
    )
    strict_topic = topic_stats(nsqd, strict)
    assert strict_topic is not None and strict_topic["queue_refused_count"] == 1
    producer = NsqConn(nsqd.tcp_address)
    producer.send(pub_cmd(strict, body(3)))  # the cap still holds
    producer.expect_error("E_PUB_FAILED PUB failed queue full (channel c: 80 + 40 > 80 bytes)")
    assert config(nsqd, strict, "c")["queue_refused_count"] == 2

    # a deleted channel takes its setting and counts with it
    http_ok(nsqd, "POST", "/channel/delete?" + q(topic=lossy, channel="c"))
    create_channel(nsqd, lossy)
    assert "max_queue_bytes" not in chan(nsqd, lossy, "c")
    nsqd.stop()
    nsqd.restart()
    assert "max_queue_bytes" not in chan(nsqd, lossy, "c")
    assert config(nsqd, strict, "c")["queue_refused_count"] == 2


def test_sigkill_loses_only_counted_drops(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    nsqd = launch(
        daemons,
        tmp_path,
        "--max-queue-bytes=400",
        "--queue-full-policy=drop-oldest",
        "--mem-queue-size=0",
        "--sync-every=1",
        "--max-bytes-per-file=200",
    )
    topic = unique("kill")
    create_channel(nsqd, topic)
    producer = NsqConn(nsqd.tcp_address)
    published = [body(i) for i in range(30)]
    for data in published:
        producer.pub(topic, data)  # every one acknowledged
    assert chan(nsqd, topic, "c")["queue_dropped_count"] == 20
    # disk usage follows: files the drops consumed are deleted (6 files were written, 5 records
    # each; the newest 10 records are the last 2)
    assert (tmp_path / f"{topic}:c.diskqueue.000005.dat").exists()
    wait_until(lambda: len(list(tmp_path.glob(f"{topic}:c.diskqueue.0*.dat"))) == 2)
    assert nsqd.proc is not None
    nsqd.proc.send_signal(signal.SIGKILL)
    nsqd.proc.wait(10)

    nsqd.restart()
    stats = chan(nsqd, topic, "c")
    dropped = stats["queue_dropped_count"]
    assert dropped == 20  # counted before each publish was answered
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub(topic, "c")
    consumer.rdy(100)
    got = [m.body for m in receive(consumer, stats["depth"])]
    consumer.expect_nothing(0.2, allow_heartbeats=True)
    assert len(got) == len(set(got)) and set(got) <= set(published)
    assert set(published[20:]) <= set(got)  # the newest ten: never dropped, never lost
    lost = set(published) - set(got)
    assert lost <= set(published[:20]) and len(lost) <= dropped  # only counted drops are gone


def test_max_defer_timeout(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    nsqd = launch(daemons, tmp_path, "--max-defer-timeout=2s", "--max-req-timeout=1s")
    topic = unique("defer")
    producer = NsqConn(nsqd.tcp_address)
    producer.dpub(topic, 1500, body(0))  # above --max-req-timeout: deferral has its own bound
    producer.dpub(topic, 2000, body(1))
    producer.send(dpub_cmd(topic, 2001, body(2)))
    producer.expect_error("E_INVALID DPUB timeout 2001 out of range 0-2000")
    assert http_request(nsqd, "POST", "/pub?" + q(topic=topic, defer="2000"), body(3)).status == 200
    resp = http_request(nsqd, "POST", "/pub?" + q(topic=topic, defer="2001"), body(4))
    assert (resp.status, resp.body) == (400, b'{"message":"INVALID_DEFER"}')
    assert http_request(nsqd, "GET", "/config/max_defer_timeout").json() == 2_000_000_000

    # unset: Go's behaviour, DPUB bounded by --max-req-timeout
    (tmp_path / "plain").mkdir()
    plain = launch(daemons, tmp_path / "plain", "--max-req-timeout=1s")
    producer = NsqConn(plain.tcp_address)
    producer.dpub(topic, 1000, body(5))
    producer.send(dpub_cmd(topic, 1001, body(6)))
    producer.expect_error("E_INVALID DPUB timeout 1001 out of range 0-1000")
    resp = http_request(plain, "POST", "/pub?" + q(topic=topic, defer="1001"), body(7))
    assert (resp.status, resp.body) == (400, b'{"message":"INVALID_DEFER"}')


def test_queue_bytes_bookkeeping(tmp_path: Path) -> None:
    """The two halves of a queue's bytes on their own: the memory queue's running total under
    every deque edit, and a disk queue's unread bytes across finished files."""
    from nsqpy.nsqd.beyond.queue_limits import SizedQueue, disk_bytes
    from nsqpy.nsqd.diskqueue import DiskQueue
    from nsqpy.nsqd.message import Message as NsqdMessage

    def msg(size: int) -> NsqdMessage:
        return NsqdMessage(b"0123456789abcdef", b"x" * size, 1)

    def exact(queue: SizedQueue) -> int:
        return sum(30 + len(m.body) for m in queue)

    queue = SizedQueue(1000, "refuse", [msg(1), msg(2)])
    assert queue.nbytes == exact(queue) == 63
    a, b = msg(10), msg(20)
    queue.append(a)
    queue.appendleft(b)
    queue.extend([msg(3), msg(4)])
    queue += [msg(5)]
    assert queue.nbytes == exact(queue)
    queue.popleft()
    queue.pop()
    queue.remove(a)
    queue.extendleft([msg(6)])
    queue.insert(1, msg(7))
    del queue[0]
    queue[0] = msg(8)
    assert queue.nbytes == exact(queue) and len(queue) == 5
    queue.clear()
    assert queue.nbytes == 0

    disk = DiskQueue("q", str(tmp_path), 100, 26, 1000, 1000, 2.0, lambda level, line: None)
    records = [b"r" * 36] * 7  # 40 bytes each with the length: two per 100-byte file
    for record in records:
        disk.put(record)
    memory = SizedQueue(1000, "refuse")
    assert disk.positions().write_file_num == 3
    assert disk_bytes(disk, memory) == disk_bytes(disk) == 7 * 40
    for left in range(6, -1, -1):
        assert disk.get() == records[0]
        assert disk_bytes(disk, memory) == disk_bytes(disk) == left * 40
    disk.close()
