"""nsqd TCP protocol V2, black box: the scenarios of Go's protocol_v2_test.go and the protocol's
quirks (only FIN, REQ and TOUCH errors leave the connection open; every other error closes it).

Every test speaks raw bytes to a real nsqd process. Daemons are shared per flag set within the
module; every test uses its own topic and channel names.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import (
    BE32,
    CLOSE_WAIT_FRAME,
    HEARTBEAT_FRAME,
    OK_FRAME,
    ConnectionClosed,
    NsqConn,
    channel_stats,
    dpub_cmd,
    frame,
    http_ok,
    identify_cmd,
    mpub_cmd,
    mpub_inner,
    pub_cmd,
    stats,
    topic_stats,
    unique,
    wait_until,
)
from .conftest import (
    DEFAULT_IDENTIFY_JSON,
    IDENTIFY_KEYS,
    MASTER_TOPOLOGY_SUFFIX,
    DaemonPool,
    connect,
    create_channel,
    http_pub,
    wait_channel,
)

# Flag sets. Timing daemons use short configured intervals instead of long sleeps.
SHORT_CLIENT_TIMEOUT = ("--client-timeout=150ms",)
LIMITS = (
    "--max-heartbeat-interval=300s",
    "--max-msg-size=100",
    "--max-body-size=1000",
    "--max-rdy-count=50",
    "--max-req-timeout=1m",
)
BIG_BUFFERS = (
    "--max-output-buffer-size=524288",
    "--max-output-buffer-timeout=1s",
    "--max-rdy-count=10000",
)
FAST_TIMEOUTS = (
    "--msg-timeout=150ms",
    "--queue-scan-interval=20ms",
    "--queue-scan-refresh-interval=100ms",
)
ONE_CONSUMER = ("--max-channel-consumers=1",)
TINY_MEM_QUEUE = ("--mem-queue-size=2",)

MSG_ID_HEX = b"0123456789abcdef"


@pytest.fixture(scope="module")
def short_timeout(nsqd_pool: DaemonPool) -> DaemonProcess:
    return nsqd_pool.get(*SHORT_CLIENT_TIMEOUT)


@pytest.fixture(scope="module")
def limits(nsqd_pool: DaemonPool) -> DaemonProcess:
    return nsqd_pool.get(*LIMITS)


@pytest.fixture(scope="module")
def big_buffers(nsqd_pool: DaemonPool) -> DaemonProcess:
    return nsqd_pool.get(*BIG_BUFFERS)


@pytest.fixture(scope="module")
def fast_timeouts(nsqd_pool: DaemonPool) -> DaemonProcess:
    return nsqd_pool.get(*FAST_TIMEOUTS)


def subscribed(daemon: DaemonProcess, topic: str, channel: str, **identify: Any) -> NsqConn:
    conn = connect(daemon)
    if identify:
        conn.identify_json(**identify)
    conn.sub(topic, channel)
    return conn


def wait_scanned(daemon: DaemonProcess, topic: str, clients: int) -> None:
    """Wait until channel ``ch`` of ``topic`` is in /stats with its ``clients`` consumers.

    nsqd's queue scanner peeks every channel on each tick, so from then on the channel's
    in-flight timeouts and deferred messages are served at the configured scan interval.
    """
    wait_channel(daemon, topic, "ch", timeout=10.0, client_count=clients)


def assert_message_id(msg_id: bytes) -> None:
    assert len(msg_id) == 16
    assert all(c in b"0123456789abcdef" for c in msg_id), msg_id


# --------------------------------------------------------------------------- magic, framing


def test_01_bad_magic_gets_e_bad_protocol_and_close(nsqd: DaemonProcess) -> None:
    with connect(nsqd, magic=b"  V1") as conn:
        conn.expect_frame(bytes.fromhex("00000012 00000001") + b"E_BAD_PROTOCOL")
        conn.expect_closed()


@pytest.mark.parametrize("magic", [b"V2  ", b"  v2", b"\x00\x00\x00\x00", b"GET "])
def test_01_other_bad_magics(nsqd: DaemonProcess, magic: bytes) -> None:
    with connect(nsqd, magic=magic) as conn:
        conn.expect_frame(frame(1, b"E_BAD_PROTOCOL"))
        conn.expect_closed()


def test_01_short_magic_then_close_gets_no_answer(nsqd: DaemonProcess) -> None:
    with connect(nsqd, magic=b"  V") as conn:
        conn.sock.shutdown(1)  # SHUT_WR: the server sees EOF before 4 bytes
        conn.expect_closed()


def test_magic_may_arrive_in_pieces(nsqd: DaemonProcess) -> None:
    with connect(nsqd, magic=None) as conn:
        for byte in b"  V2":
            conn.send(bytes([byte]))
            time.sleep(0.01)
        conn.send(b"IDENTIFY\n")
        conn.send(BE32.pack(2) + b"{}")
        conn.expect_frame(OK_FRAME)


def test_magic_and_commands_in_one_write(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd, magic=None) as conn:
        conn.send(
            b"  V2" + identify_cmd({}) + pub_cmd(topic, b"a") + b"NOP\n" + pub_cmd(topic, b"b")
        )
        conn.expect_frame(OK_FRAME)
        conn.expect_frame(OK_FRAME)
        conn.expect_frame(OK_FRAME)


# --------------------------------------------------------------------------- IDENTIFY


def test_02_basic_v2(nsqd: DaemonProcess) -> None:
    topic = unique()
    before = time.time_ns()
    http_pub(nsqd, topic, b"test body")
    after = time.time_ns()
    with connect(nsqd) as conn:
        conn.send(identify_cmd({"client_id": "test", "feature_negotiation": True}))
        raw = conn.read_frame_bytes()
        assert raw[4:8] == b"\x00\x00\x00\x00"
        assert json.loads(raw[8:])["version"] == "1.3.0"
        conn.send(f"SUB {topic} ch\n".encode())
        conn.expect_frame(OK_FRAME)
        conn.send(b"RDY 1\n")
        msg = conn.expect_message()
        assert msg.attempts == 1
        assert msg.body == b"test body"
        assert_message_id(msg.id)
        assert before - 10**9 <= msg.timestamp <= after + 10**9


def test_02_identify_response_bytes_and_key_order(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(identify_cmd({"client_id": "test", "feature_negotiation": True}))
        raw = conn.read_frame_bytes()
    data = raw[8:]
    assert raw[:8] == BE32.pack(len(data) + 4) + b"\x00\x00\x00\x00"
    assert data in (DEFAULT_IDENTIFY_JSON, DEFAULT_IDENTIFY_JSON[:-1] + MASTER_TOPOLOGY_SUFFIX)
    keys = list(json.loads(data))
    assert keys[: len(IDENTIFY_KEYS)] == IDENTIFY_KEYS


def test_03_identify_without_feature_negotiation_is_ok(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(identify_cmd({"client_id": "x"}))
        conn.expect_frame(OK_FRAME)
        assert conn.is_open()


def test_03_identify_feature_negotiation_false_is_ok(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(identify_cmd({"feature_negotiation": False, "snappy": True}))
        conn.expect_frame(OK_FRAME)


def test_identify_may_be_repeated_before_sub(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        assert conn.identify() == b"OK"
        assert conn.identify_json(msg_timeout=5000)["msg_timeout"] == 5000
        assert conn.identify_json()["msg_timeout"] == 5000  # 0 keeps the previous value
        conn.sub(unique(), "ch")


def test_identify_echoes_client_settings(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        resp = conn.identify_json(
            msg_timeout=2000,
            sample_rate=10,
            output_buffer_size=1024,
            output_buffer_timeout=100,
            heartbeat_interval=2000,
        )
    assert resp["msg_timeout"] == 2000
    assert resp["sample_rate"] == 10
    assert resp["output_buffer_size"] == 1024
    assert resp["output_buffer_timeout"] == 100


def test_identify_unknown_fields_are_ignored(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(identify_cmd({"short_id": "a", "long_id": "b", "whatever": [1, {"x": 2}]}))
        conn.expect_frame(OK_FRAME)


def test_identify_deflate_level_reported_even_without_deflate(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        resp = conn.identify_json(deflate_level=9)
    assert resp["deflate"] is False
    assert resp["deflate_level"] == 6  # min(6, --max-deflate-level=6)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"heartbeat_interval":"1000"}',
        b'{"heartbeat_interval":1.5}',
        b'{"feature_negotiation":"yes"}',
        b'{"client_id":5}',
        b"{",
    ],
)
def test_identify_bad_json(nsqd: DaemonProcess, body: bytes) -> None:
    with connect(nsqd) as conn:
        conn.send(b"IDENTIFY\n" + BE32.pack(len(body)) + body)
        conn.expect_error("E_BAD_BODY IDENTIFY failed to decode JSON body")


@pytest.mark.parametrize("size", [0, -1])
def test_identify_invalid_body_size(nsqd: DaemonProcess, size: int) -> None:
    with connect(nsqd) as conn:
        conn.send(b"IDENTIFY\n" + BE32.pack(size))
        conn.expect_error(f"E_BAD_BODY IDENTIFY invalid body size {size}")


def test_identify_body_too_big(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(b"IDENTIFY\n" + BE32.pack(5242881))
        conn.expect_error("E_BAD_BODY IDENTIFY body too big 5242881 > 5242880")


# --------------------------------------------------------------------------- fan-out


def test_04_multiple_consumers_get_the_same_message(nsqd: DaemonProcess) -> None:
    topic = unique()
    create_channel(nsqd, topic, "ch1")
    create_channel(nsqd, topic, "ch2")
    http_pub(nsqd, topic, b"fan out")
    conns = [subscribed(nsqd, topic, ch) for ch in ("ch1", "ch2")]
    try:
        msgs = []
        for conn in conns:
            conn.rdy(1)
            msgs.append(conn.expect_message())
        assert msgs[0].id == msgs[1].id
        assert msgs[0].body == msgs[1].body == b"fan out"
        assert msgs[0].attempts == msgs[1].attempts == 1
        assert msgs[0].timestamp == msgs[1].timestamp
    finally:
        for conn in conns:
            conn.close()


def test_messages_published_before_any_channel_wait_in_the_topic(nsqd: DaemonProcess) -> None:
    topic = unique()
    for i in range(3):
        http_pub(nsqd, topic, b"m%d" % i)
    t = topic_stats(nsqd, topic)
    assert t is not None and t["depth"] == 3 and t["channels"] == []
    with subscribed(nsqd, topic, "ch") as conn:
        conn.rdy(3)
        bodies = sorted(conn.expect_message().body for _ in range(3))
    assert bodies == [b"m0", b"m1", b"m2"]


def test_publish_to_own_subscription_gets_ok_before_the_message(nsqd: DaemonProcess) -> None:
    """Go answers a PUB/MPUB before its message pump delivers the message on that connection."""
    topic = unique()
    with subscribed(nsqd, topic, "ch") as conn:
        conn.rdy(3)
        conn.pub(topic, b"mine")  # expects OK as the very next frame
        assert conn.expect_message().body == b"mine"
        conn.mpub(topic, [b"a", b"b"])
        assert [conn.expect_message().body for _ in range(2)] == [b"a", b"b"]
        conn.rdy(5)
        conn.send(pub_cmd(topic, b"c") + pub_cmd(topic, b"d"))  # both in one read
        frames = [conn.read_frame() for _ in range(4)]
        oks = [i for i, (kind, _) in enumerate(frames) if kind == 0]
        bodies = [(i, data[26:]) for i, (kind, data) in enumerate(frames) if kind == 2]
        assert [body for _, body in bodies] == [b"c", b"d"]
        assert oks[0] < bodies[0][0] and oks[1] < bodies[1][0]


def test_fin_run_with_a_failing_id_keeps_order(nsqd: DaemonProcess) -> None:
    """FINs in one read: the refill after a good FIN comes before the error of a bad one."""
    topic = unique()
    create_channel(nsqd, topic, "ch")
    for body in (b"m0", b"m1", b"m2", b"m3"):
        http_pub(nsqd, topic, body)
    with subscribed(nsqd, topic, "ch") as conn:
        conn.rdy(2)
        first, second = conn.expect_message(), conn.expect_message()
        bad = b"0" * 16
        conn.send(b"FIN " + first.id + b"\nFIN " + bad + b"\nFIN " + second.id + b"\n")
        assert conn.expect_message().body == b"m2"
        conn.expect_error(b"E_FIN_FAILED FIN " + bad + b" failed ID not in flight", fatal=False)
        assert conn.expect_message().body == b"m3"
        conn.send(b"FIN " + first.id + b"\nFIN " + second.id + b"\n")  # already finished
        for msg_id in (first.id, second.id):
            conn.expect_error(
                b"E_FIN_FAILED FIN " + msg_id + b" failed ID not in flight", fatal=False
            )
        ch = wait_channel(nsqd, topic, "ch", in_flight_count=2)
        assert ch["depth"] == 0 and ch["message_count"] == 4
        conn.send(b"FIN " + b"x" * 15 + b"\r\n")  # a 15-byte ID once the CR is stripped
        conn.expect_error("E_INVALID invalid message ID")


def test_message_ids_are_unique_within_a_topic(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as producer:
        producer.send(mpub_cmd(topic, [b"%d" % i for i in range(50)]))
        producer.expect_ok()
    with subscribed(nsqd, topic, "ch") as conn:
        conn.rdy(50)
        ids = [conn.expect_message().id for _ in range(50)]
    assert len(set(ids)) == 50
    for msg_id in ids:
        assert_message_id(msg_id)


# --------------------------------------------------------------------------- heartbeats


def test_05_client_timeout_closes_idle_connection(short_timeout: DaemonProcess) -> None:
    # --client-timeout=150ms: heartbeat every 75 ms, closed after two missed heartbeats
    with connect(short_timeout) as conn:
        conn.send(identify_cmd({}))
        conn.expect_frame(OK_FRAME)
        conn.send(f"SUB {unique()} ch\n".encode())
        conn.expect_ok(skip_heartbeats=True)
        start = time.monotonic()
        heartbeats = 0
        closed = False
        while time.monotonic() - start < 3.0:
            try:
                data = conn.read_frame_bytes(timeout=3.0)
            except ConnectionClosed:
                closed = True
                break
            assert data == HEARTBEAT_FRAME
            heartbeats += 1
        elapsed = time.monotonic() - start
    assert closed
    assert 1 <= heartbeats <= 4
    assert elapsed < 1.5


def test_quirk16_heartbeats_start_before_identify(short_timeout: DaemonProcess) -> None:
    with connect(short_timeout) as conn:
        start = time.monotonic()
        conn.expect_frame(HEARTBEAT_FRAME, timeout=2.0)
        assert time.monotonic() - start < 1.0
        conn.expect_closed(allow_heartbeats=True)


def test_06_answering_heartbeats_keeps_the_connection(short_timeout: DaemonProcess) -> None:
    with connect(short_timeout) as conn:
        conn.identify()
        conn.sub(unique(), "ch", skip_heartbeats=True)
        conn.rdy(1)
        conn.expect_frame(HEARTBEAT_FRAME, timeout=2.0)
        conn.send(b"NOP\n")
        end = time.monotonic() + 0.6  # four client timeouts
        while time.monotonic() < end:
            try:
                data = conn.read_frame_bytes(timeout=end - time.monotonic())
            except TimeoutError:
                break
            assert data == HEARTBEAT_FRAME
            conn.send(b"NOP\n")
        assert conn.is_open(skip_heartbeats=True)


def test_07_sub_refused_with_heartbeats_disabled(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        resp = conn.identify_json(heartbeat_interval=-1)
        assert resp["max_rdy_count"] == 2500
        conn.send(f"SUB {unique()} ch\n".encode())
        conn.expect_error("E_INVALID cannot SUB with heartbeats disabled")


def test_08_heartbeats_disabled_means_no_timeout(short_timeout: DaemonProcess) -> None:
    with connect(short_timeout) as conn:
        conn.send(identify_cmd({"heartbeat_interval": -1}))
        conn.expect_ok(skip_heartbeats=True)
        conn.expect_nothing(0.45)  # three client timeouts, and no heartbeats either
        assert conn.is_open()


def test_09_max_heartbeat_interval_valid(limits: DaemonProcess) -> None:
    with connect(limits) as conn:
        resp = conn.identify_json(heartbeat_interval=300000)
        assert resp["version"] == "1.3.0"
    with connect(limits) as conn:
        conn.identify_json(heartbeat_interval=1000)


def test_10_max_heartbeat_interval_invalid(limits: DaemonProcess) -> None:
    with connect(limits) as conn:
        conn.send(identify_cmd({"heartbeat_interval": 300001, "feature_negotiation": True}))
        conn.expect_error("E_BAD_BODY IDENTIFY heartbeat interval (300001) is invalid")


@pytest.mark.parametrize("interval", [1, 999, -2])
def test_heartbeat_interval_below_one_second_is_invalid(nsqd: DaemonProcess, interval: int) -> None:
    with connect(nsqd) as conn:
        conn.send(identify_cmd({"heartbeat_interval": interval}))
        conn.expect_error(f"E_BAD_BODY IDENTIFY heartbeat interval ({interval}) is invalid")


def test_identified_heartbeat_interval_is_used(short_timeout: DaemonProcess) -> None:
    # IDENTIFY resets the ticker: with 1000 ms heartbeats the 75 ms default no longer applies
    with connect(short_timeout) as conn:
        conn.send(identify_cmd({"heartbeat_interval": 1000}))
        conn.expect_ok(skip_heartbeats=True)
        conn.expect_nothing(0.5)
        conn.expect_frame(HEARTBEAT_FRAME, timeout=1.5)


# --------------------------------------------------------------------------- pause


def test_11_paused_channel_delivers_nothing_until_unpaused(nsqd: DaemonProcess) -> None:
    topic = unique()
    http_pub(nsqd, topic, b"test body")
    with subscribed(nsqd, topic, "ch") as conn:
        conn.rdy(1)
        msg = conn.expect_message()
        assert msg.body == b"test body"
        conn.fin(msg.id)
        conn.rdy(1)
        http_ok(nsqd, "POST", f"/channel/pause?topic={topic}&channel=ch")
        http_pub(nsqd, topic, b"test body2")
        conn.expect_nothing(0.3)
        ch = wait_channel(nsqd, topic, "ch", depth=1)
        assert ch["paused"] is True
        http_ok(nsqd, "POST", f"/channel/unpause?topic={topic}&channel=ch")
        msg2 = conn.expect_message()
        assert msg2.body == b"test body2"
        assert msg2.attempts == 1


def test_paused_topic_holds_messages(nsqd: DaemonProcess) -> None:
    topic = unique()
    with subscribed(nsqd, topic, "ch") as conn:
        conn.rdy(1)
        http_ok(nsqd, "POST", f"/topic/pause?topic={topic}")
        http_pub(nsqd, topic, b"held")
        conn.expect_nothing(0.3)
        t = topic_stats(nsqd, topic)
        assert t is not None and t["paused"] is True and t["depth"] == 1
        http_ok(nsqd, "POST", f"/topic/unpause?topic={topic}")
        assert conn.expect_message().body == b"held"


# --------------------------------------------------------------------------- bad commands


def test_12_empty_command(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(b"\n\n")
        conn.expect_error("E_INVALID invalid command ")


def test_25_fatal_error_bytes(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(b"ASDF\n")
        conn.expect_frame(bytes.fromhex("00000022 00000001") + b"E_INVALID invalid command ASDF")
        conn.expect_closed()


def test_51_invalid_command(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(b"INVALID_COMMAND\n")
        conn.expect_error("E_INVALID invalid command INVALID_COMMAND")


@pytest.mark.parametrize(
    "line,name",
    [
        (b"nop", b"nop"),
        (b"Pub t", b"Pub"),
        (b"NOP\r\r", b"NOP\r"),
        (b" NOP", b""),
        (b"NOP\x00", b"NOP\x00"),
    ],
)
def test_command_names_are_exact(nsqd: DaemonProcess, line: bytes, name: bytes) -> None:
    with connect(nsqd) as conn:
        conn.send(line + b"\n")
        conn.expect_error(b"E_INVALID invalid command " + name)


def test_crlf_line_endings_are_accepted(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as conn:
        conn.send(b"NOP\r\n" + f"PUB {topic}\r\n".encode() + BE32.pack(1) + b"x")
        conn.expect_ok()
        conn.send(f"SUB {topic} ch\r\n".encode())
        conn.expect_ok()
        conn.send(b"RDY 1\r\n")
        assert conn.expect_message().body == b"x"


def test_longest_command_line_is_read(nsqd: DaemonProcess) -> None:
    # Go reads lines through a 16 KiB buffer: 16383 bytes + "\n" still fit
    with connect(nsqd) as conn:
        conn.send(b"A" * 16383 + b"\n")
        conn.expect_error(b"E_INVALID invalid command " + b"A" * 16383)


def test_over_long_command_line_closes_silently(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(b"A" * 20000)
        conn.expect_closed()


def test_commands_before_an_over_long_line_are_executed(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as conn:
        conn.send(pub_cmd(topic, b"x") + b"B" * 17000)
        conn.expect_frame(OK_FRAME)
        conn.expect_closed()
    t = topic_stats(nsqd, topic)
    assert t is not None and t["message_count"] == 1


# --------------------------------------------------------------------------- size limits


def test_13_pub_under_the_size_limit(limits: DaemonProcess) -> None:
    with connect(limits) as conn:
        conn.send(pub_cmd(unique(), b"x" * 95))
        conn.expect_frame(OK_FRAME)


def test_13_pub_exactly_at_the_size_limit(limits: DaemonProcess) -> None:
    with connect(limits) as conn:
        conn.send(pub_cmd(unique(), b"x" * 100))
        conn.expect_frame(OK_FRAME)


def test_14_pub_message_too_big(limits: DaemonProcess) -> None:
    with connect(limits) as conn:
        conn.send(pub_cmd(unique(), b"x" * 105))
        conn.expect_error("E_BAD_MESSAGE PUB message too big 105 > 100")


def test_15_pub_empty_body(limits: DaemonProcess) -> None:
    with connect(limits) as conn:
        conn.send(f"PUB {unique()}\n".encode() + BE32.pack(0))
        conn.expect_error("E_BAD_MESSAGE PUB invalid message body size 0")


def test_pub_negative_body_size(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(f"PUB {unique()}\n".encode() + b"\xff\xff\xff\xff")
        conn.expect_error("E_BAD_MESSAGE PUB invalid message body size -1")


def test_16_mpub_under_the_limits(limits: DaemonProcess) -> None:
    topic = unique()
    with connect(limits) as conn:
        conn.send(mpub_cmd(topic, [b"x" * 100] * 5))
        conn.expect_frame(OK_FRAME)
    t = topic_stats(limits, topic)
    assert t is not None and t["message_count"] == 5 and t["depth"] == 5


def test_17_mpub_body_too_big(limits: DaemonProcess) -> None:
    with connect(limits) as conn:
        conn.send(mpub_cmd(unique(), [b"x" * 100] * 11))
        conn.expect_error("E_BAD_BODY MPUB body too big 1148 > 1000")


def test_18_mpub_empty_message(limits: DaemonProcess) -> None:
    topic = unique()
    with connect(limits) as conn:
        conn.send(mpub_cmd(topic, [b"x" * 100] * 5 + [b""]))
        conn.expect_error("E_BAD_MESSAGE MPUB invalid message(5) body size 0")
    t = topic_stats(limits, topic)
    assert t is None or t["message_count"] == 0  # all or nothing


def test_19_mpub_message_too_big(limits: DaemonProcess) -> None:
    with connect(limits) as conn:
        conn.send(mpub_cmd(unique(), [b"x" * 101] * 5))
        conn.expect_error("E_BAD_MESSAGE MPUB message too big 101 > 100")


@pytest.mark.parametrize("count", [0, -1, 200])
def test_mpub_invalid_message_count(limits: DaemonProcess, count: int) -> None:
    # max count = (max_body_size - 4) / 5 = 199
    inner = BE32.pack(count) + BE32.pack(1) + b"x"
    with connect(limits) as conn:
        conn.send(f"MPUB {unique()}\n".encode() + BE32.pack(len(inner)) + inner)
        conn.expect_error(f"E_BAD_BODY MPUB invalid message count {count}")


@pytest.mark.parametrize("size", [0, -1])
def test_mpub_invalid_body_size(nsqd: DaemonProcess, size: int) -> None:
    with connect(nsqd) as conn:
        conn.send(f"MPUB {unique()}\n".encode() + BE32.pack(size))
        conn.expect_error(f"E_BAD_BODY MPUB invalid body size {size}")


def test_mpub_reads_count_messages_not_the_declared_size(nsqd: DaemonProcess) -> None:
    # Go reads exactly `count` inner messages and never uses the outer size as a limit
    topic = unique()
    inner = mpub_inner([b"abc", b"defg"])
    with connect(nsqd) as conn:
        conn.send(f"MPUB {topic}\n".encode() + BE32.pack(len(inner) - 3) + inner)
        conn.expect_frame(OK_FRAME)
        assert conn.is_open()
    t = topic_stats(nsqd, topic)
    assert t is not None and t["message_count"] == 2


def test_mpub_delivers_every_message_once(nsqd: DaemonProcess) -> None:
    topic = unique()
    bodies = [b"body %d" % i for i in range(20)]
    with subscribed(nsqd, topic, "ch") as consumer, connect(nsqd) as producer:
        producer.send(mpub_cmd(topic, bodies))
        producer.expect_ok()
        consumer.rdy(20)
        got = sorted(consumer.expect_message().body for _ in range(20))
    assert got == sorted(bodies)


def test_insufficient_parameters(nsqd: DaemonProcess) -> None:
    cases = [
        (b"PUB\n" + BE32.pack(1) + b"x", "E_INVALID PUB insufficient number of parameters"),
        (
            b"MPUB\n" + BE32.pack(5) + mpub_inner([b"x"]),
            "E_INVALID MPUB insufficient number of parameters",
        ),
        (b"DPUB t\n" + BE32.pack(1) + b"x", "E_INVALID DPUB insufficient number of parameters"),
        (b"SUB t\n", "E_INVALID SUB insufficient number of parameters"),
        (b"SUB\n", "E_INVALID SUB insufficient number of parameters"),
    ]
    for data, error in cases:
        with connect(nsqd) as conn:
            conn.send(data)
            conn.expect_error(error)


def test_pub_params_are_checked_before_the_body_arrives(nsqd: DaemonProcess) -> None:
    # Go validates the topic before it reads the body size: no body is needed for the error
    with connect(nsqd) as conn:
        conn.send(b"PUB bad!\n")
        conn.expect_error('E_BAD_TOPIC PUB topic name "bad!" is not valid')
    with connect(nsqd) as conn:
        conn.send(b"MPUB\n")
        conn.expect_error("E_INVALID MPUB insufficient number of parameters")


# --------------------------------------------------------------------------- DPUB


def test_20_dpub_defers_in_each_channel(nsqd: DaemonProcess) -> None:
    topic = unique()
    with subscribed(nsqd, topic, "ch") as consumer, connect(nsqd) as producer:
        producer.send(dpub_cmd(topic, 1000, b"x" * 100))
        producer.expect_frame(OK_FRAME)
        ch = wait_channel(nsqd, topic, "ch", deferred_count=1)
        assert ch["message_count"] == 1
        assert ch["depth"] == 0
        consumer.rdy(1)
        consumer.expect_nothing(0.3)


def test_dpub_message_is_delivered_when_due(fast_timeouts: DaemonProcess) -> None:
    topic = unique()
    with subscribed(fast_timeouts, topic, "ch") as consumer, connect(fast_timeouts) as producer:
        consumer.rdy(1)
        wait_scanned(fast_timeouts, topic, clients=1)
        start = time.monotonic()
        producer.send(dpub_cmd(topic, 300, b"later"))
        producer.expect_ok()
        msg = consumer.expect_message(timeout=3.0)
        elapsed = time.monotonic() - start
        assert msg.body == b"later"
        assert msg.attempts == 1
        assert 0.25 <= elapsed < 2.0


def test_dpub_zero_is_immediate(nsqd: DaemonProcess) -> None:
    topic = unique()
    with subscribed(nsqd, topic, "ch") as consumer, connect(nsqd) as producer:
        consumer.rdy(1)
        producer.send(dpub_cmd(topic, 0, b"now"))
        producer.expect_ok()
        assert consumer.expect_message(timeout=2.0).body == b"now"


def test_21_dpub_timeout_out_of_range(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(dpub_cmd(unique(), 3600100, b"x"))
        conn.expect_error("E_INVALID DPUB timeout 3600100 out of range 0-3600000")


def test_dpub_timeout_at_the_max_is_accepted(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(dpub_cmd(unique(), 3600000, b"x"))
        conn.expect_frame(OK_FRAME)


@pytest.mark.parametrize("raw", ["-5", "+5", "1.5", "abc", "5ms"])
def test_22_dpub_timeout_must_be_digits(nsqd: DaemonProcess, raw: str) -> None:
    with connect(nsqd) as conn:
        conn.send(dpub_cmd(unique(), raw, b"x"))
        conn.expect_error(f"E_INVALID DPUB could not parse timeout {raw}")


def test_dpub_body_errors_say_dpub(limits: DaemonProcess) -> None:
    with connect(limits) as conn:
        conn.send(dpub_cmd(unique(), 10, b"x" * 101))
        conn.expect_error("E_BAD_MESSAGE DPUB message too big 101 > 100")
    with connect(limits) as conn:
        conn.send(f"DPUB {unique()} 10\n".encode() + BE32.pack(0))
        conn.expect_error("E_BAD_MESSAGE DPUB invalid message body size 0")
    with connect(limits) as conn:
        conn.send(dpub_cmd("bad!", 10, b"x"))
        conn.expect_error('E_BAD_TOPIC DPUB topic name "bad!" is not valid')


# --------------------------------------------------------------------------- TOUCH and timeouts


def test_23_touch_keeps_a_message_in_flight(fast_timeouts: DaemonProcess) -> None:
    topic = unique()
    with subscribed(fast_timeouts, topic, "ch") as conn:
        wait_scanned(fast_timeouts, topic, clients=1)
        http_pub(fast_timeouts, topic, b"touch me")
        conn.rdy(1)
        msg = conn.expect_message()
        end = time.monotonic() + 0.4  # well past the 150 ms timeout
        while time.monotonic() < end:
            time.sleep(0.04)
            conn.send(b"TOUCH " + msg.id + b"\n")
        conn.fin(msg.id)
        assert conn.is_open()  # no E_FIN_FAILED / E_TOUCH_FAILED came before the OK
    ch = channel_stats(fast_timeouts, topic, "ch")
    assert ch is not None
    assert ch["timeout_count"] == 0
    assert ch["in_flight_count"] == 0


def test_untouched_message_times_out_and_is_redelivered(fast_timeouts: DaemonProcess) -> None:
    topic = unique()
    with subscribed(fast_timeouts, topic, "ch") as conn:
        wait_scanned(fast_timeouts, topic, clients=1)
        http_pub(fast_timeouts, topic, b"slow")
        conn.rdy(1)
        first = conn.expect_message()
        again = conn.expect_message(timeout=3.0)
        assert again.id == first.id
        assert again.attempts == 2
        assert again.timestamp == first.timestamp
        conn.fin(again.id)
        assert conn.is_open()
    ch = channel_stats(fast_timeouts, topic, "ch")
    assert ch is not None
    assert ch["timeout_count"] >= 1
    assert ch["requeue_count"] == 0  # quirk 5: timeouts are not requeues


def test_39_client_msg_timeout(fast_timeouts: DaemonProcess) -> None:
    topic = unique()
    with connect(fast_timeouts) as conn:
        assert conn.identify_json(msg_timeout=1000)["msg_timeout"] == 1000
        conn.sub(topic, "ch")
        wait_scanned(fast_timeouts, topic, clients=1)
        http_pub(fast_timeouts, topic, b"x")
        conn.rdy(1)
        msg = conn.expect_message()
        conn.rdy(0)
        time.sleep(0.5)  # the server default (150 ms) would have timed it out by now
        ch = channel_stats(fast_timeouts, topic, "ch")
        assert ch is not None and ch["timeout_count"] == 0 and ch["in_flight_count"] == 1
        ch = wait_channel(fast_timeouts, topic, "ch", timeout=3.0, timeout_count=1)
        assert ch["requeue_count"] == 0
        assert ch["in_flight_count"] == 0
        assert ch["depth"] == 1
        conn.fin(msg.id)
        conn.expect_error(b"E_FIN_FAILED FIN " + msg.id + b" failed ID not in flight", fatal=False)
        assert conn.is_open()


def test_in_flight_timeouts_with_two_timeouts_and_a_refused_fin(
    fast_timeouts: DaemonProcess,
) -> None:
    """A message of a longer client timeout delivered first, and one put back after another
    client's FIN of it, do not hold up the timeouts of the server default's messages."""
    topic = unique()
    with connect(fast_timeouts) as slow, connect(fast_timeouts) as fast:
        assert slow.identify_json(msg_timeout=3000)["msg_timeout"] == 3000
        slow.sub(topic, "ch")
        fast.sub(topic, "ch")
        wait_scanned(fast_timeouts, topic, clients=2)
        for body in (b"m1", b"m2", b"m3"):
            http_pub(fast_timeouts, topic, body)
        slow.rdy(1)
        first = slow.expect_message()
        slow.rdy(0)
        fast.rdy(2)
        second, third = fast.expect_message(), fast.expect_message()
        fast.rdy(0)
        assert [first.body, second.body, third.body] == [b"m1", b"m2", b"m3"]
        slow.fin(second.id)  # refused: fast owns it
        slow.expect_error(
            b"E_FIN_FAILED FIN " + second.id + b" failed client does not own message", fatal=False
        )
        # the default 150 ms: both of fast's time out long before slow's 3 s
        ch = wait_channel(fast_timeouts, topic, "ch", timeout=2.0, timeout_count=2)
        assert ch["in_flight_count"] == 1
        ch = wait_channel(fast_timeouts, topic, "ch", timeout=5.0, timeout_count=3)
        assert ch["in_flight_count"] == 0 and ch["depth"] == 3


def test_quirk4_disconnect_does_not_requeue_in_flight(fast_timeouts: DaemonProcess) -> None:
    topic = unique()
    conn = connect(fast_timeouts)
    conn.identify_json(msg_timeout=1000)
    conn.sub(topic, "ch")
    wait_scanned(fast_timeouts, topic, clients=1)
    http_pub(fast_timeouts, topic, b"x")
    conn.rdy(1)
    conn.expect_message()
    conn.close()
    ch = wait_channel(fast_timeouts, topic, "ch", client_count=0)
    assert ch["in_flight_count"] == 1
    assert ch["depth"] == 0
    ch = wait_channel(fast_timeouts, topic, "ch", timeout=3.0, timeout_count=1)
    assert ch["in_flight_count"] == 0
    assert ch["depth"] == 1
    assert ch["requeue_count"] == 0


# --------------------------------------------------------------------------- RDY


def test_24_max_rdy_count(limits: DaemonProcess) -> None:
    topic = unique()
    http_pub(limits, topic, b"x")
    with connect(limits) as conn:
        assert conn.identify_json()["max_rdy_count"] == 50
        conn.sub(topic, "ch")
        conn.send(b"RDY 50\n")
        assert conn.expect_message().body == b"x"
        conn.send(b"RDY 51\n")
        conn.expect_error("E_INVALID RDY count 51 out of range 0-50")


@pytest.mark.parametrize("raw", [b"-1", b"+1", b"1.0", b"one", b"1x", b"0x1"])
def test_rdy_count_must_be_digits(nsqd: DaemonProcess, raw: bytes) -> None:
    with subscribed(nsqd, unique(), "ch") as conn:
        conn.send(b"RDY " + raw + b"\n")
        conn.expect_error(b"E_INVALID RDY could not parse count " + raw)


def test_rdy_count_wraps_like_go_uint64(nsqd: DaemonProcess) -> None:
    with subscribed(nsqd, unique(), "ch") as conn:
        conn.send(b"RDY 18446744073709551615\n")
        conn.expect_error("E_INVALID RDY count -1 out of range 0-2500")


def test_rdy_count_is_the_first_param_even_if_empty(nsqd: DaemonProcess) -> None:
    # "RDY  1" splits into ["RDY", "", "1"]: the count is "", which Go parses as 0
    topic = unique()
    with subscribed(nsqd, topic, "ch") as conn:
        http_pub(nsqd, topic, b"a")
        conn.send(b"RDY  1\n")
        conn.expect_nothing(0.3)
        assert conn.is_open()


def test_rdy_without_count_means_one(nsqd: DaemonProcess) -> None:
    topic = unique()
    with subscribed(nsqd, topic, "ch") as conn:
        http_pub(nsqd, topic, b"a")
        http_pub(nsqd, topic, b"b")
        conn.send(b"RDY\n")
        conn.expect_message()
        conn.expect_nothing(0.3)


def test_rdy_empty_count_means_zero(nsqd: DaemonProcess) -> None:
    topic = unique()
    with subscribed(nsqd, topic, "ch") as conn:
        http_pub(nsqd, topic, b"a")
        conn.send(b"RDY \n")
        conn.expect_nothing(0.3)
        assert conn.is_open()


def test_rdy_limits_in_flight(nsqd: DaemonProcess) -> None:
    topic = unique()
    with subscribed(nsqd, topic, "ch") as conn, connect(nsqd) as producer:
        producer.send(mpub_cmd(topic, [b"%d" % i for i in range(5)]))
        producer.expect_ok()
        conn.rdy(2)
        first = [conn.expect_message(), conn.expect_message()]
        conn.expect_nothing(0.3)
        conn.fin(first[0].id)
        conn.expect_message()
        conn.expect_nothing(0.2)


# --------------------------------------------------------------------------- output buffering


def test_26_output_buffering_delays_delivery(big_buffers: DaemonProcess) -> None:
    topic = unique()
    http_pub(big_buffers, topic, b"x" * (256 * 1024 - 1024))
    with connect(big_buffers) as conn:
        start = time.monotonic()
        resp = conn.identify_json(output_buffer_size=256 * 1024, output_buffer_timeout=500)
        assert resp["output_buffer_size"] == 262144
        assert resp["output_buffer_timeout"] == 500
        conn.sub(topic, "ch")
        conn.rdy(10)
        msg = conn.expect_message(timeout=3.0)
        elapsed = time.monotonic() - start
    assert len(msg.body) == 261120
    assert elapsed >= 0.49
    assert elapsed < 2.5


def test_rdy_one_flushes_immediately(big_buffers: DaemonProcess) -> None:
    topic = unique()
    http_pub(big_buffers, topic, b"x")
    with connect(big_buffers) as conn:
        conn.identify_json(output_buffer_size=256 * 1024, output_buffer_timeout=1000)
        conn.sub(topic, "ch")
        start = time.monotonic()
        conn.rdy(1)  # the client becomes not-ready after one message: flushed at once
        conn.expect_message(timeout=3.0)
        assert time.monotonic() - start < 0.5


def test_27_output_buffering_validity(big_buffers: DaemonProcess) -> None:
    with connect(big_buffers) as conn:
        resp = conn.identify_json(output_buffer_size=512 * 1024, output_buffer_timeout=1000)
        assert (resp["output_buffer_size"], resp["output_buffer_timeout"]) == (524288, 1000)
        resp = conn.identify_json(output_buffer_size=-1, output_buffer_timeout=-1)
        assert resp["output_buffer_timeout"] == 0
        conn.identify_json(output_buffer_size=0, output_buffer_timeout=0)
        conn.send(identify_cmd({"output_buffer_size": 512 * 1024 + 1, "output_buffer_timeout": 0}))
        conn.expect_error("E_BAD_BODY IDENTIFY output buffer size (524289) is invalid")


def test_28_output_buffer_timeout_validity(big_buffers: DaemonProcess) -> None:
    with connect(big_buffers) as conn:
        conn.send(identify_cmd({"output_buffer_size": 0, "output_buffer_timeout": 1001}))
        conn.expect_error("E_BAD_BODY IDENTIFY output buffer timeout (1001) is invalid")


@pytest.mark.parametrize(
    "settings,error",
    [
        ({"output_buffer_timeout": 24}, "output buffer timeout (24) is invalid"),
        ({"output_buffer_size": 63}, "output buffer size (63) is invalid"),
        ({"output_buffer_size": 65537}, "output buffer size (65537) is invalid"),
        ({"sample_rate": 100}, "sample rate (100) is invalid"),
        ({"sample_rate": -1}, "sample rate (-1) is invalid"),
        ({"msg_timeout": 999}, "msg timeout (999) is invalid"),
        ({"msg_timeout": 900001}, "msg timeout (900001) is invalid"),
        ({"msg_timeout": -1}, "msg timeout (-1) is invalid"),
        # validation order: heartbeat, output buffer timeout then size, sample rate, msg timeout
        (
            {"heartbeat_interval": 5, "output_buffer_timeout": 5, "sample_rate": 100},
            "heartbeat interval (5) is invalid",
        ),
        (
            {"output_buffer_size": 5, "output_buffer_timeout": 5, "msg_timeout": 5},
            "output buffer timeout (5) is invalid",
        ),
        ({"output_buffer_size": 5, "sample_rate": 100}, "output buffer size (5) is invalid"),
        ({"sample_rate": 100, "msg_timeout": 5}, "sample rate (100) is invalid"),
    ],
)
def test_29_identify_validation(nsqd: DaemonProcess, settings: dict[str, int], error: str) -> None:
    with connect(nsqd) as conn:
        conn.send(identify_cmd({"feature_negotiation": True, **settings}))
        conn.expect_error("E_BAD_BODY IDENTIFY " + error)


# --------------------------------------------------------------------------- sampling


def test_38_sampling(big_buffers: DaemonProcess) -> None:
    topic = unique()
    create_channel(big_buffers, topic, "ch")
    with connect(big_buffers) as producer:
        for batch in range(10):
            producer.send(mpub_cmd(topic, [b"%d" % (batch * 1000 + i) for i in range(1000)]))
            producer.expect_ok()
    wait_channel(big_buffers, topic, "ch", depth=10000)
    with connect(big_buffers) as conn:
        assert conn.identify_json(sample_rate=42)["sample_rate"] == 42
        conn.sub(topic, "ch")
        conn.rdy(10000)
        received = 0
        while True:
            try:
                conn.expect_message(timeout=1.0)
            except TimeoutError:
                break
            received += 1
        ch = wait_channel(big_buffers, topic, "ch", timeout=5.0, depth=0)
        assert ch["in_flight_count"] == received
    assert 3700 <= received <= 4700


# --------------------------------------------------------------------------- FIN/REQ/TOUCH


def test_40_fin_with_empty_id(nsqd: DaemonProcess) -> None:
    with subscribed(nsqd, unique(), "ch") as conn:
        conn.send(b"FIN \n")
        conn.expect_error("E_INVALID invalid message ID")


@pytest.mark.parametrize("verb", [b"FIN", b"TOUCH"])
@pytest.mark.parametrize("msg_id", [b"123", b"0123456789abcdef0"])
def test_message_id_must_be_16_bytes(nsqd: DaemonProcess, verb: bytes, msg_id: bytes) -> None:
    with subscribed(nsqd, unique(), "ch") as conn:
        conn.send(verb + b" " + msg_id + b"\n")
        conn.expect_error("E_INVALID invalid message ID")


def test_req_id_must_be_16_bytes(nsqd: DaemonProcess) -> None:
    with subscribed(nsqd, unique(), "ch") as conn:
        conn.send(b"REQ 123 0\n")
        conn.expect_error("E_INVALID invalid message ID")


@pytest.mark.parametrize(
    "line,error",
    [
        (b"FIN\n", "E_INVALID FIN insufficient number of params"),
        (b"TOUCH\n", "E_INVALID TOUCH insufficient number of params"),
        (b"REQ 0123456789abcdef\n", "E_INVALID REQ insufficient number of params"),
        (b"REQ\n", "E_INVALID REQ insufficient number of params"),
    ],
)
def test_missing_params_after_sub(nsqd: DaemonProcess, line: bytes, error: str) -> None:
    with subscribed(nsqd, unique(), "ch") as conn:
        conn.send(line)
        conn.expect_error(error)


@pytest.mark.parametrize(
    "verb,line",
    [
        ("FIN", b"FIN 0123456789abcdef\n"),
        ("REQ", b"REQ 0123456789abcdef 0\n"),
        ("TOUCH", b"TOUCH 0123456789abcdef\n"),
    ],
)
def test_quirk2_unknown_id_is_not_fatal(nsqd: DaemonProcess, verb: str, line: bytes) -> None:
    with subscribed(nsqd, unique(), "ch") as conn:
        conn.send(line)
        conn.expect_error(
            f"E_{verb}_FAILED {verb} 0123456789abcdef failed ID not in flight", fatal=False
        )
        assert conn.is_open()


def test_quirk2_other_clients_message_is_not_owned(nsqd: DaemonProcess) -> None:
    topic = unique()
    with subscribed(nsqd, topic, "ch") as owner, subscribed(nsqd, topic, "ch") as other:
        http_pub(nsqd, topic, b"x")
        owner.rdy(1)
        msg = owner.expect_message()
        for verb, line in [
            ("FIN", b"FIN " + msg.id + b"\n"),
            ("REQ", b"REQ " + msg.id + b" 0\n"),
            ("TOUCH", b"TOUCH " + msg.id + b"\n"),
        ]:
            other.send(line)
            other.expect_error(
                f"E_{verb}_FAILED {verb} ".encode()
                + msg.id
                + b" failed client does not own message",
                fatal=False,
            )
        assert other.is_open()
        owner.fin(msg.id)
        assert owner.is_open()


def test_41_req_timeout_range(limits: DaemonProcess) -> None:
    topic = unique()
    with subscribed(limits, topic, "ch") as conn:
        http_pub(limits, topic, b"x")
        conn.rdy(1)
        msg = conn.expect_message()
        assert msg.attempts == 1
        conn.send(b"REQ " + msg.id + b" 0\n")
        again = conn.expect_message()
        assert again.id == msg.id
        assert again.attempts == 2
        conn.send(b"REQ " + msg.id + b" 120000\n")  # clamped to --max-req-timeout=1m
        conn.expect_nothing(0.3)
        ch = wait_channel(limits, topic, "ch", deferred_count=1)
        assert ch["requeue_count"] == 2
        assert ch["in_flight_count"] == 0


def test_42_req_timeout_must_be_digits(nsqd: DaemonProcess) -> None:
    with subscribed(nsqd, unique(), "ch") as conn:
        conn.send(b"REQ 0123456789abcdef -1\n")
        conn.expect_error("E_INVALID REQ could not parse timeout -1")


def test_req_with_delay_redelivers_later(fast_timeouts: DaemonProcess) -> None:
    topic = unique()
    with connect(fast_timeouts) as conn:
        conn.identify_json(msg_timeout=5000)
        conn.sub(topic, "ch")
        wait_scanned(fast_timeouts, topic, clients=1)
        http_pub(fast_timeouts, topic, b"x")
        conn.rdy(1)
        msg = conn.expect_message()
        start = time.monotonic()
        conn.send(b"REQ " + msg.id + b" 300\n")
        again = conn.expect_message(timeout=3.0)
        assert again.id == msg.id and again.attempts == 2
        assert time.monotonic() - start >= 0.25


# --------------------------------------------------------------------------- state rules


@pytest.mark.parametrize(
    "line,error",
    [
        (b"RDY 1\n", "E_INVALID cannot RDY in current state"),
        (b"FIN 0123456789abcdef\n", "E_INVALID cannot FIN in current state"),
        (b"REQ 0123456789abcdef 0\n", "E_INVALID cannot REQ in current state"),
        (b"TOUCH 0123456789abcdef\n", "E_INVALID cannot TOUCH in current state"),
        (b"CLS\n", "E_INVALID cannot CLS in current state"),
    ],
)
def test_43_commands_before_sub(nsqd: DaemonProcess, line: bytes, error: str) -> None:
    with connect(nsqd) as conn:
        conn.identify()
        conn.send(line)
        conn.expect_error(error)


def test_44_identify_after_sub(nsqd: DaemonProcess) -> None:
    with subscribed(nsqd, unique(), "ch") as conn:
        conn.send(identify_cmd({}))
        conn.expect_error("E_INVALID cannot IDENTIFY in current state")


def test_44_sub_after_sub(nsqd: DaemonProcess) -> None:
    with subscribed(nsqd, unique(), "ch") as conn:
        conn.send(f"SUB {unique()} c\n".encode())
        conn.expect_error("E_INVALID cannot SUB in current state")


def test_auth_after_sub(nsqd: DaemonProcess) -> None:
    with subscribed(nsqd, unique(), "ch") as conn:
        conn.send(b"AUTH\n" + BE32.pack(6) + b"secret")
        conn.expect_error("E_INVALID cannot AUTH in current state")


def test_50_auth_when_disabled(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(b"AUTH\n" + BE32.pack(10) + b"testsecret")
        conn.expect_error("E_AUTH_DISABLED AUTH disabled")


def test_auth_with_params(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(b"AUTH x\n" + BE32.pack(1) + b"s")
        conn.expect_error("E_INVALID AUTH invalid number of parameters")


def test_45_cls(nsqd: DaemonProcess) -> None:
    topic = unique()
    with subscribed(nsqd, topic, "ch") as conn:
        http_pub(nsqd, topic, b"one")
        http_pub(nsqd, topic, b"two")
        conn.rdy(1)
        msg = conn.expect_message()
        conn.send(b"CLS\n")
        conn.expect_frame(CLOSE_WAIT_FRAME)
        conn.send(b"RDY 5\n")
        conn.expect_nothing(0.3)
        conn.fin(msg.id)
        assert conn.is_open()  # the server does not close after CLS
        ch = wait_channel(nsqd, topic, "ch", in_flight_count=0)
        assert ch["depth"] == 1
        client = ch["clients"][0]
        assert client["finish_count"] == 1
        assert client["ready_count"] == 0


def test_cls_twice(nsqd: DaemonProcess) -> None:
    with subscribed(nsqd, unique(), "ch") as conn:
        conn.send(b"CLS\n")
        conn.expect_frame(CLOSE_WAIT_FRAME)
        conn.send(b"CLS\n")
        conn.expect_error("E_INVALID cannot CLS in current state")


def test_46_nop_has_no_response_in_any_state(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(b"NOP\n")
        conn.expect_nothing(0.1)
        conn.identify()
        conn.send(b"NOP\n")
        conn.expect_nothing(0.1)
        conn.sub(unique(), "ch")
        conn.send(b"NOP\n")
        conn.expect_nothing(0.1)
        conn.send(b"CLS\n")
        conn.expect_frame(CLOSE_WAIT_FRAME)
        conn.send(b"NOP\n")
        conn.send(pub_cmd(unique(), b"x"))
        conn.expect_frame(OK_FRAME)


def test_pub_works_in_every_state(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.pub(unique(), b"init")
        conn.sub(unique(), "ch")
        conn.pub(unique(), b"subscribed")
        conn.send(b"CLS\n")
        conn.expect_frame(CLOSE_WAIT_FRAME)
        conn.pub(unique(), b"closing")


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    "line,error",
    [
        (b"SUB bad:topic ch\n", b'E_BAD_TOPIC SUB topic name "bad:topic" is not valid'),
        (b"SUB t bad:ch\n", b'E_BAD_CHANNEL SUB channel name "bad:ch" is not valid'),
        (b"SUB  t ch\n", b'E_BAD_TOPIC SUB topic name "" is not valid'),
        (b"SUB t  ch\n", b'E_BAD_CHANNEL SUB channel name "" is not valid'),
        (b'SUB a"b ch\n', b'E_BAD_TOPIC SUB topic name "a\\"b" is not valid'),
        (b"SUB \xff ch\n", b'E_BAD_TOPIC SUB topic name "\\xff" is not valid'),
        (b"SUB a\tb ch\n", b'E_BAD_TOPIC SUB topic name "a\\tb" is not valid'),
        (
            b"SUB " + b"x" * 65 + b" ch\n",
            b'E_BAD_TOPIC SUB topic name "' + b"x" * 65 + b'" is not valid',
        ),
        (b"SUB #ephemeral ch\n", b'E_BAD_TOPIC SUB topic name "#ephemeral" is not valid'),
    ],
)
def test_47_bad_sub_names(nsqd: DaemonProcess, line: bytes, error: bytes) -> None:
    with connect(nsqd) as conn:
        conn.send(line)
        conn.expect_error(error)


def test_47_bad_pub_and_mpub_topic(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(mpub_cmd(b"bad!", [b"x"]))
        # quirk 1: the MPUB error repeats its code
        conn.expect_error('E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "bad!" is not valid')
    with connect(nsqd) as conn:
        conn.send(pub_cmd(b"bad!", b"x"))
        conn.expect_error('E_BAD_TOPIC PUB topic name "bad!" is not valid')


def test_sub_with_extra_params_is_accepted(nsqd: DaemonProcess) -> None:
    with connect(nsqd) as conn:
        conn.send(f"SUB {unique()} ch extra\n".encode())
        conn.expect_frame(OK_FRAME)


# --------------------------------------------------------------------------- stats via TCP


def test_52_client_attributes_in_stats(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as conn:
        resp = conn.identify_json(user_agent="Test User Agent", snappy=True)
        assert resp["snappy"] is True
        # the server now speaks snappy framing: its OK starts with the stream identifier
        assert conn.read_exact(10) == bytes.fromhex("ff 06 00 00 73 4e 61 50 70 59")
        conn.send(snappy_frame(f"SUB {topic} ch\n".encode()))
        ch = wait_channel(nsqd, topic, "ch", client_count=1)
        client = ch["clients"][0]
        assert client["user_agent"] == "Test User Agent"
        assert client["snappy"] is True
        assert client["deflate"] is False


def test_client_stats_key_order(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as conn:
        conn.identify_json(client_id="cid", hostname="host.example", user_agent="ua/1")
        conn.sub(topic, "ch")
        ch = wait_channel(nsqd, topic, "ch", client_count=1)
    client = ch["clients"][0]
    keys = [k for k in client if k not in ("topology_zone", "topology_region")]
    assert keys == [
        "client_id",
        "hostname",
        "version",
        "remote_address",
        "state",
        "ready_count",
        "in_flight_count",
        "message_count",
        "finish_count",
        "requeue_count",
        "connect_ts",
        "sample_rate",
        "deflate",
        "snappy",
        "user_agent",
        "tls",
        "tls_cipher_suite",
        "tls_version",
        "tls_negotiated_protocol",
        "tls_negotiated_protocol_is_mutual",
    ]
    assert client["client_id"] == "cid"
    assert client["hostname"] == "host.example"
    assert client["version"] == "V2"
    assert client["state"] == 3
    assert client["remote_address"].startswith("127.0.0.1:")
    assert abs(client["connect_ts"] - time.time()) < 60


def test_client_id_defaults_to_remote_ip(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as conn:
        conn.sub(topic, "ch")
        ch = wait_channel(nsqd, topic, "ch", client_count=1)
    client = ch["clients"][0]
    assert client["client_id"] == "127.0.0.1"
    assert client["hostname"] == "127.0.0.1"


def test_53_max_channel_consumers(nsqd_pool: DaemonPool) -> None:
    daemon = nsqd_pool.get(*ONE_CONSUMER)
    topic = unique()
    with subscribed(daemon, topic, "ch"), connect(daemon) as second:
        second.send(f"SUB {topic} ch\n".encode())
        second.expect_error(f"E_SUB_FAILED SUB failed consumers for {topic}:ch exceeds limit of 1")
    with subscribed(daemon, topic, "other"):
        pass


def test_producer_pub_counts(nsqd: DaemonProcess) -> None:
    topic = unique()
    with connect(nsqd) as conn:
        conn.identify(client_id="producer-x")
        conn.pub(topic, b"a")
        conn.send(mpub_cmd(topic, [b"b", b"c"]))
        conn.expect_ok()
        producers = stats(nsqd)["producers"] or []
        mine = [p for p in producers if p["client_id"] == "producer-x"]
    assert len(mine) == 1
    assert mine[0]["pub_counts"] == [{"topic": topic, "count": 3}]


# --------------------------------------------------------------------------- quirks needing state


def test_quirk7_ephemeral_overflow_is_dropped(nsqd_pool: DaemonPool) -> None:
    daemon = nsqd_pool.get(*TINY_MEM_QUEUE)
    eph = unique() + "#ephemeral"
    normal = unique()
    with connect(daemon) as conn:
        conn.send(mpub_cmd(eph, [b"%d" % i for i in range(5)]))
        conn.expect_ok()
        conn.send(mpub_cmd(normal, [b"%d" % i for i in range(5)]))
        conn.expect_ok()
    t = topic_stats(daemon, eph)
    assert t is not None
    assert t["depth"] == 2
    assert t["backend_depth"] == 0
    assert t["message_count"] == 5
    n = topic_stats(daemon, normal)
    assert n is not None
    assert n["depth"] == 5
    assert n["backend_depth"] == 3


def test_quirk8_topic_deferred_overflow_loses_deferral(nsqd_pool: DaemonPool) -> None:
    daemon = nsqd_pool.get(*TINY_MEM_QUEUE)
    topic = unique()
    with connect(daemon) as conn:
        for i in range(3):
            conn.send(dpub_cmd(topic, 60000, b"d%d" % i))
            conn.expect_ok()
    t = topic_stats(daemon, topic)
    assert t is not None and t["depth"] == 3 and t["backend_depth"] == 1
    http_ok(daemon, "POST", f"/channel/create?topic={topic}&channel=ch")
    ch = wait_channel(daemon, topic, "ch", deferred_count=2, depth=1)
    assert ch["message_count"] == 3


def test_quirk8_restart_keeps_deferral_and_attempts(tmp_path: Path) -> None:
    """Go loses a channel's deferral across a clean restart (nsqio/nsq #1107); nsqpy keeps it.
    In-flight messages come back with their attempts, as in Go. The disk queue
    still holds both messages (Go can read the directory: backend_depth 2), while depth, as
    Go defines it, counts only what is deliverable now."""
    daemon = start_nsqd(tmp_path)
    try:
        topic = unique()
        with connect(daemon) as conn:
            conn.sub(topic, "ch")
            conn.send(dpub_cmd(topic, 3600000, b"deferred"))
            conn.expect_ok()
            http_pub(daemon, topic, b"in flight")
            conn.rdy(1)
            msg = conn.expect_message()
            assert msg.body == b"in flight" and msg.attempts == 1
            wait_channel(daemon, topic, "ch", deferred_count=1, in_flight_count=1)
        assert daemon.stop() == 0
        daemon.start()
        ch = wait_channel(daemon, topic, "ch", depth=1)
        assert ch["deferred_count"] == 1
        assert ch["backend_depth"] == 2
        assert ch["in_flight_count"] == 0
        with subscribed(daemon, topic, "ch") as conn:
            conn.rdy(2)
            msg = conn.expect_message()
            assert (msg.body, msg.attempts) == (b"in flight", 2)
            conn.expect_nothing(0.3)  # the deferred message is still an hour away
    finally:
        daemon.stop()


def test_quirk3_req_clamps_but_dpub_rejects(limits: DaemonProcess) -> None:
    # --max-req-timeout=1m: REQ 120000 is accepted (clamped), DPUB 120000 is refused
    with connect(limits) as conn:
        conn.send(dpub_cmd(unique(), 120000, b"x"))
        conn.expect_error("E_INVALID DPUB timeout 120000 out of range 0-60000")


def test_ephemeral_channel_goes_away_with_its_last_client(nsqd: DaemonProcess) -> None:
    topic = unique() + "#ephemeral"
    with subscribed(nsqd, topic, "ch#ephemeral"):
        assert channel_stats(nsqd, topic, "ch#ephemeral") is not None

    wait_until(lambda: topic_stats(nsqd, topic) is None, timeout=10.0, what="the topic gone")
    assert topic_stats(nsqd, topic) is None


# --------------------------------------------------------------------------- snappy framing


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def snappy_frame(data: bytes) -> bytes:
    """A snappy framing-format stream carrying ``data`` in one uncompressed chunk."""
    crc = _crc32c(data)
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    body = masked.to_bytes(4, "little") + data
    stream_id = bytes.fromhex("ff 06 00 00 73 4e 61 50 70 59")
    return stream_id + b"\x01" + len(body).to_bytes(3, "little") + body
