"""Consumer RDY, backoff and message handling against the scripted fake nsqd.

Each test states the exact command sequence the client must send, like go-nsq's mock tests.
Scripts advance on what the client sent (``wait_for``), not on sleeps, so they do not race.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

from nsqpy.client import Consumer, Message

from ..raw_v2 import wait_until_async
from .fake_nsqd import (
    FakeNsqd,
    close,
    error,
    handshake,
    heartbeat,
    message,
    respond,
    wait_for,
)

GOOD = b"1234567890asdfgh"
BAD = b"zxcvb67890asdfgh"
REQ_ID = b"reqvb67890asdfgh"
NO_BACKOFF = b"reqnback90asdfgh"
TOPIC = "test_topic"


def handler(msg: Message) -> Any:
    """go-nsq's testHandler."""
    if msg.body == b"requeue":
        msg.requeue()
    elif msg.body == b"requeue_no_backoff_1":
        if msg.attempts <= 1:
            msg.requeue(backoff=False)
    elif msg.body == b"bad":
        raise RuntimeError("bad")
    return None


def consumer_for(
    fake: FakeNsqd | list[FakeNsqd], handle: Callable[[Message], Any] = handler, **kw: Any
) -> Consumer:
    fakes = fake if isinstance(fake, list) else [fake]
    settings: dict[str, Any] = {
        "max_in_flight": 5,
        "backoff_multiplier": 0.01,
        "requeue_delay": 0,
        "reconnect_interval": 0.01,
    }
    settings.update(kw)
    return Consumer(TOPIC, "ch", handle, nsqd_tcp_addresses=[f.address for f in fakes], **settings)


def gaps(times: list[float], later: list[float]) -> list[float]:
    """For each time in ``times``, the wait until the first time in ``later`` after it."""
    return [min(t2 for t2 in later if t2 > t1) - t1 for t1 in times if any(t2 > t1 for t2 in later)]


async def test_backoff_steps_up_and_down_one_result_per_window() -> None:
    script = [
        *handshake(),
        message(GOOD, b"good"),
        wait_for(b"FIN", 1),
        message(GOOD, b"good"),
        wait_for(b"FIN", 2),
        message(GOOD, b"good"),
        wait_for(b"FIN", 3),
        message(BAD, b"bad"),
        wait_for(b"REQ", 1),
        message(BAD, b"bad"),
        wait_for(b"REQ", 2),
        message(GOOD, b"good"),
        wait_for(b"FIN", 4),
        message(GOOD, b"good"),
        wait_for(b"FIN", 5),
    ]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake)
        await consumer.start()
        conn = await fake.wait_connection(0)
        await consumer.close()
    assert conn.lines[: len(EXPECTED_BACKOFF)] == EXPECTED_BACKOFF
    # backoff levels 1, 2, 1 with a 10 ms multiplier: 20, 40, 20 ms of RDY 0 before each probe
    waits = gaps(conn.times(b"RDY 0"), conn.times(b"RDY 1"))
    assert [round(w, 2) >= d for w, d in zip(waits, (0.02, 0.04, 0.02), strict=True)] == [True] * 3
    assert all(w < d + 0.5 for w, d in zip(waits, (0.02, 0.04, 0.02), strict=True))


EXPECTED_BACKOFF = [
    b"IDENTIFY",
    b"SUB test_topic ch",
    b"RDY 1",  # bootstrap
    b"FIN " + GOOD,
    b"RDY 5",  # the first message proved the connection: full share
    b"FIN " + GOOD,
    b"FIN " + GOOD,
    b"RDY 0",  # failure: backoff level 1 (RDY 0 goes out before the REQ)
    b"REQ " + BAD + b" 0",
    b"RDY 1",  # window over: test the waters
    b"RDY 0",  # failure again: level 2
    b"REQ " + BAD + b" 0",
    b"RDY 1",
    b"RDY 0",  # a success steps down to level 1, still backing off
    b"FIN " + GOOD,
    b"RDY 1",
    b"RDY 5",  # a success at level 1 ends the backoff
    b"FIN " + GOOD,
]


async def test_results_inside_a_backoff_window_are_not_counted() -> None:
    held: list[Message] = []

    def hold(msg: Message) -> None:
        msg.disable_auto_response()
        held.append(msg)

    script = [
        *handshake(),
        message(GOOD, b"1"),
        wait_for(b"RDY 5"),
        message(BAD, b"2"),
        message(REQ_ID, b"3"),
        message(NO_BACKOFF, b"4"),
        wait_for(b"FIN", 2),
    ]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake, hold)
        await consumer.start()
        await wait_until_async(lambda: held, timeout=10.0, what="the first message")
        held[0].finish()
        await wait_until_async(lambda: len(held) == 4, timeout=10.0, what="four messages")
        held[1].requeue()  # level 1: RDY 0 and a 20 ms window
        held[2].requeue()  # inside the window: ignored
        held[3].finish()  # inside the window: ignored too
        conn = await fake.wait_connection(0)
        assert consumer._rdy is not None and consumer._rdy.backoff_level == 1
        await consumer.close()
    assert conn.script_lines == [
        b"IDENTIFY",
        b"SUB test_topic ch",
        b"RDY 1",
        b"FIN " + GOOD,
        b"RDY 5",
        b"RDY 0",
        b"REQ " + BAD + b" 0",
        b"REQ " + REQ_ID + b" 0",
        b"FIN " + NO_BACKOFF,
    ]


async def test_requeue_without_backoff_keeps_backoff_level() -> None:
    script = [
        *handshake(),
        message(REQ_ID, b"requeue"),
        wait_for(b"REQ", 1),
        message(NO_BACKOFF, b"requeue_no_backoff_1"),
        wait_for(b"REQ", 2),
        message(GOOD, b"good"),
        wait_for(b"FIN", 1),
    ]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake, max_in_flight=1)
        await consumer.start()
        conn = await fake.wait_connection(0)
        await consumer.close()
    assert conn.lines[:10] == [
        b"IDENTIFY",
        b"SUB test_topic ch",
        b"RDY 1",
        b"RDY 0",
        b"REQ " + REQ_ID + b" 0",
        b"RDY 1",
        b"RDY 0",  # no step up, but the level-1 window starts again
        b"REQ " + NO_BACKOFF + b" 0",
        b"RDY 1",
        b"FIN " + GOOD,  # backoff over; RDY 1 already is the full share
    ]


async def test_backoff_survives_a_reconnect() -> None:
    first = [
        *handshake(),
        message(GOOD, b"good"),
        wait_for(b"FIN", 1),
        message(REQ_ID, b"requeue"),
        wait_for(b"REQ", 1),
        message(REQ_ID, b"requeue"),
        wait_for(b"REQ", 2),
        message(GOOD, b"good"),
        wait_for(b"FIN", 2),
        wait_for(b"RDY 1", 4),
        close(),
    ]
    second = [
        *handshake(),
        message(GOOD, b"good"),
        wait_for(b"FIN", 1),
        message(GOOD, b"good"),
        wait_for(b"FIN", 2),
    ]
    async with FakeNsqd(first, second) as fake:
        consumer = consumer_for(fake)
        await consumer.start()
        conn1 = await fake.wait_connection(0)
        conn2 = await fake.wait_connection(1)
        await consumer.close()
    assert conn1.script_lines == [
        b"IDENTIFY",
        b"SUB test_topic ch",
        b"RDY 1",
        b"FIN " + GOOD,
        b"RDY 5",
        b"RDY 0",
        b"REQ " + REQ_ID + b" 0",
        b"RDY 1",
        b"RDY 0",
        b"REQ " + REQ_ID + b" 0",
        b"RDY 1",
        b"RDY 0",
        b"FIN " + GOOD,
        b"RDY 1",
    ]
    # still at backoff level 1: the new connection probes with RDY 1, and its first
    # success ends the backoff
    assert conn2.lines[:6] == [
        b"IDENTIFY",
        b"SUB test_topic ch",
        b"RDY 1",
        b"RDY 5",
        b"FIN " + GOOD,
        b"FIN " + GOOD,
    ]


async def test_change_max_in_flight_pauses_and_resumes() -> None:
    script = [*handshake(), message(GOOD, b"good"), wait_for(b"RDY 5"), wait_for(b"RDY 5", 2)]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake)
        await consumer.start()
        await wait_until_async(
            lambda: fake.connections and b"RDY 5" in fake.connections[0].lines,
            timeout=10.0,
            what="RDY 5 after the first FIN",
        )
        consumer.change_max_in_flight(0)
        assert consumer.max_in_flight == 0
        await wait_until_async(
            lambda: b"RDY 0" in fake.connections[0].lines, timeout=10.0, what="RDY 0"
        )
        consumer.change_max_in_flight(5)
        conn = await fake.wait_connection(0)
        await consumer.close()
    assert conn.script_lines == [
        b"IDENTIFY",
        b"SUB test_topic ch",
        b"RDY 1",
        b"FIN " + GOOD,
        b"RDY 5",
        b"RDY 0",
        b"RDY 5",
    ]


async def test_rdy_never_exceeds_max_rdy_count() -> None:
    script = [*handshake(max_rdy_count=3), message(GOOD, b"good"), wait_for(b"FIN", 1)]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake, max_in_flight=10)
        await consumer.start()
        conn = await fake.wait_connection(0)
        await wait_until_async(lambda: len(conn.lines) >= 5, timeout=10.0, what="the RDY after FIN")
        await consumer.close()
    assert conn.lines[:5] == [b"IDENTIFY", b"SUB test_topic ch", b"RDY 1", b"FIN " + GOOD, b"RDY 3"]


async def test_rdy_is_refreshed_when_a_quarter_of_the_credit_is_left() -> None:
    ids = [b"%016d" % i for i in range(7)]
    script = [*handshake(), message(ids[0], b"x"), wait_for(b"RDY 4")]
    for n, msg_id in enumerate(ids[1:], start=2):
        script += [message(msg_id, b"x"), wait_for(b"FIN", n)]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake, max_in_flight=4)
        await consumer.start()
        conn = await fake.wait_connection(0)
        await consumer.close()
    # RDY is a credit in nsqd, so the unchanged value is re-evaluated but not re-sent
    assert [line for line in conn.lines if line.startswith(b"RDY")] == [b"RDY 1", b"RDY 4"]
    assert consumer._rdy is not None


async def test_is_starved_when_in_flight_reaches_85_percent_of_rdy() -> None:
    held: list[Message] = []
    starved: list[bool] = []

    def hold(msg: Message) -> None:
        msg.disable_auto_response()
        held.append(msg)
        starved.append(consumer.is_starved())  # this message already counts as in flight

    ids = [b"%016d" % i for i in range(5)]
    script = [*handshake(), message(ids[0], b"0"), wait_for(b"RDY 4")]
    script += [message(i, b"x") for i in ids[1:]]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake, hold, max_in_flight=4)
        assert not consumer.is_starved()
        await consumer.start()
        await wait_until_async(lambda: held, timeout=10.0, what="the first message")
        held[0].finish()
        await wait_until_async(lambda: len(held) == 5, timeout=10.0, what="five messages")
        # RDY 1 with 1 in flight: starved; then 1, 2, 3 of RDY 4: no; 4 of 4: yes
        assert starved == [True, False, False, False, True]
        assert consumer.is_starved()
        held[1].finish()
        assert not consumer.is_starved()  # 3 of 4 in flight
        for msg in held[2:]:
            msg.finish()
        await fake.wait_connection(0)
        await consumer.close()


async def test_heartbeat_is_answered_with_nop() -> None:
    script = [*handshake(), heartbeat(), wait_for(b"NOP"), heartbeat(), wait_for(b"NOP", 2)]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake)
        await consumer.start()
        conn = await fake.wait_connection(0)
        await consumer.close()
    assert conn.lines.count(b"NOP") == 2


async def test_non_fatal_errors_keep_the_connection() -> None:
    script = [
        *handshake(),
        error(b"E_FIN_FAILED FIN 0000000000000000 failed ID not in flight"),
        error(b"E_REQ_FAILED REQ 0000000000000000 failed ID not in flight"),
        error(b"E_TOUCH_FAILED TOUCH 0000000000000000 failed ID not in flight"),
        message(GOOD, b"good"),
        wait_for(b"FIN", 1),
    ]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake)
        await consumer.start()
        conn = await fake.wait_connection(0)
        assert len(consumer.connections) == 1
        await consumer.close()
    assert b"FIN " + GOOD in conn.lines
    assert len(fake.connections) == 1


async def test_fatal_error_closes_and_reconnects() -> None:
    first = [*handshake(), error(b"E_INVALID cannot FIN in current state")]
    second = [*handshake(), message(GOOD, b"good"), wait_for(b"FIN", 1)]
    async with FakeNsqd(first, second) as fake:
        consumer = consumer_for(fake)
        await consumer.start()
        conn1 = await fake.wait_connection(0)
        conn2 = await fake.wait_connection(1)
        await consumer.close()
    assert conn1.closed
    assert conn2.lines[:4] == [b"IDENTIFY", b"SUB test_topic ch", b"RDY 1", b"FIN " + GOOD]


async def test_direct_reconnect_delays_grow_exponentially() -> None:
    # three connections are closed right after SUB; the fourth stays
    scripts = [[*handshake(), close()] for _ in range(3)]
    scripts.append([*handshake(), message(GOOD, b"good"), wait_for(b"FIN", 1)])
    async with FakeNsqd(*scripts) as fake:
        consumer = consumer_for(fake, reconnect_interval=0.05)
        await consumer.start()
        await fake.wait_connection(3)
        await consumer.close()
    starts = [conn.commands[0][0] for conn in fake.connections]
    waits = [b - a for a, b in itertools.pairwise(starts)]
    # a successful SUB resets the delay, so each retry waits the initial 50 ms (+10% jitter)
    assert all(0.05 <= w < 0.5 for w in waits), waits


async def test_failed_connects_back_off_exponentially() -> None:
    # nothing listens on the port until the fake starts, after a few refused attempts
    fake = FakeNsqd([*handshake(), message(GOOD, b"good"), wait_for(b"FIN", 1)])
    await fake.start()
    port = fake.port
    await fake.stop()
    attempts: list[float] = []
    consumer = consumer_for(fake, reconnect_interval=0.02, max_reconnect_interval=0.16)
    original = consumer._start_connect

    def record(address: str) -> None:
        attempts.append(asyncio.get_running_loop().time())
        original(address)

    consumer._start_connect = record  # type: ignore[method-assign]
    await consumer.start()
    await wait_until_async(lambda: len(attempts) >= 5, timeout=10.0, what="five connect attempts")
    await fake.start(port)
    conn = await fake.wait_connection(0)
    await consumer.close()
    await fake.stop()
    waits = [b - a for a, b in itertools.pairwise(attempts)][:4]
    # 20, 40, 80, 160 ms (+ up to 10% jitter and connect time)
    for wait, expected in zip(waits, (0.02, 0.04, 0.08, 0.16), strict=True):
        assert expected <= wait < expected * 1.1 + 0.05, waits
    assert b"FIN " + GOOD in conn.lines


async def test_giving_up_after_max_attempts() -> None:
    given_up: list[Message] = []
    handled: list[Message] = []
    script = [
        *handshake(),
        message(BAD, b"too many", attempts=6),
        wait_for(b"FIN", 1),
        message(GOOD, b"fine", attempts=5),
        wait_for(b"FIN", 2),
    ]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake, handled.append, max_attempts=5, on_giving_up=given_up.append)
        await consumer.start()
        conn = await fake.wait_connection(0)
        await consumer.close()
    assert [m.id for m in given_up] == [BAD]
    assert [m.id for m in handled] == [GOOD]
    assert b"FIN " + BAD in conn.lines


async def test_async_giving_up_callback_is_awaited_before_fin() -> None:
    events: list[str] = []

    async def on_giving_up(msg: Message) -> None:
        await asyncio.sleep(0.01)
        events.append("logged")

    script = [*handshake(), message(BAD, b"x", attempts=3), wait_for(b"FIN", 1)]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake, max_attempts=2, on_giving_up=on_giving_up)
        await consumer.start()
        await fake.wait_connection(0)
        events.append("fin seen")
        await consumer.close()
    assert events == ["logged", "fin seen"]


async def test_automatic_requeue_delay_grows_with_attempts() -> None:
    def fail(msg: Message) -> bool:
        return False

    script = [
        *handshake(),
        message(b"a" * 16, b"x", attempts=1),
        wait_for(b"REQ", 1),
        message(b"b" * 16, b"x", attempts=3),
        wait_for(b"REQ", 2),
        message(b"c" * 16, b"x", attempts=50),
        wait_for(b"REQ", 3),
    ]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(
            fake,
            fail,
            requeue_delay=1.5,
            max_requeue_delay=60,
            max_backoff_duration=0,  # no backoff: the messages flow one after another
            max_attempts=0,  # never give up
        )
        await consumer.start()
        conn = await fake.wait_connection(0)
        await consumer.close()
    reqs = [line for line in conn.lines if line.startswith(b"REQ")]
    assert reqs == [
        b"REQ " + b"a" * 16 + b" 1500",
        b"REQ " + b"b" * 16 + b" 4500",
        b"REQ " + b"c" * 16 + b" 60000",
    ]


async def test_explicit_requeue_delay_touch_and_respond_later() -> None:
    later: list[Message] = []

    async def handle(msg: Message) -> None:
        if msg.body == b"later":
            msg.disable_auto_response()
            later.append(msg)
        elif msg.body == b"slow":
            msg.touch()
            msg.requeue(2.5, backoff=False)

    script = [
        *handshake(),
        message(b"l" * 16, b"later"),
        wait_for(b"RDY 5"),
        message(b"s" * 16, b"slow"),
        wait_for(b"REQ", 1),
        wait_for(b"FIN", 1),
    ]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake, handle)
        await consumer.start()
        await wait_until_async(lambda: later, timeout=10.0, what="the held message")
        await asyncio.sleep(0.02)
        assert consumer.in_flight == 1  # not answered automatically
        # RDY goes to the full share only after an answer; answer the held message later
        later[0].finish()
        later[0].finish()  # a second answer is ignored
        later[0].requeue()
        conn = await fake.wait_connection(0)
        await consumer.close()
    assert conn.script_lines == [
        b"IDENTIFY",
        b"SUB test_topic ch",
        b"RDY 1",
        b"FIN " + b"l" * 16,
        b"RDY 5",
        b"TOUCH " + b"s" * 16,
        b"REQ " + b"s" * 16 + b" 2500",
    ]


async def test_handler_exception_requeues_with_backoff() -> None:
    async def boom(msg: Message) -> None:
        raise ValueError("nope")

    script = [*handshake(), message(BAD, b"x"), wait_for(b"REQ", 1), wait_for(b"RDY 1", 2)]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake, boom)
        await consumer.start()
        conn = await fake.wait_connection(0)
        await consumer.close()
    assert conn.script_lines == [
        b"IDENTIFY",
        b"SUB test_topic ch",
        b"RDY 1",
        b"RDY 0",
        b"REQ " + BAD + b" 0",
        b"RDY 1",
    ]


async def test_identify_carries_the_configured_settings() -> None:
    async with FakeNsqd([*handshake()]) as fake:
        consumer = consumer_for(
            fake,
            client_id="worker-7",
            hostname="host.example",
            user_agent="tests/1.0",
            heartbeat_interval=5,
            output_buffer_size=4096,
            output_buffer_timeout=0.1,
            sample_rate=20,
            msg_timeout=30,
        )
        await consumer.start()
        conn = await fake.wait_connection(0)
        await consumer.close()
    assert conn.identify() == {
        "client_id": "worker-7",
        "hostname": "host.example",
        "user_agent": "tests/1.0",
        "feature_negotiation": True,
        "heartbeat_interval": 5000,
        "output_buffer_size": 4096,
        "output_buffer_timeout": 100,
        "sample_rate": 20,
        "msg_timeout": 30000,
        "tls_v1": False,
        "snappy": False,
        "deflate": False,
        "deflate_level": 6,
    }


async def test_clean_close_waits_for_in_flight_messages() -> None:
    release = asyncio.Event()

    async def slow(msg: Message) -> None:
        await release.wait()

    script = [*handshake(), message(GOOD, b"x"), wait_for(b"CLS"), wait_for(b"FIN", 1)]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake, slow)
        await consumer.start()
        await wait_until_async(lambda: consumer.in_flight >= 1, timeout=10.0, what="a message")
        closing = asyncio.create_task(consumer.close(timeout=5))
        await asyncio.sleep(0.05)
        assert not closing.done()  # waiting for the handler
        release.set()
        await asyncio.wait_for(closing, 2)
        conn = await fake.wait_connection(0)
    assert conn.lines[-2:] == [b"CLS", b"FIN " + GOOD]


async def test_close_gives_up_waiting_after_the_timeout() -> None:
    async def stuck(msg: Message) -> None:
        await asyncio.sleep(30)

    script = [*handshake(), message(GOOD, b"x"), wait_for(b"CLS")]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake, stuck)
        await consumer.start()
        await wait_until_async(lambda: consumer.in_flight >= 1, timeout=10.0, what="a message")
        started = asyncio.get_running_loop().time()
        await consumer.close(timeout=0.1)
        assert asyncio.get_running_loop().time() - started < 1.0
        conn = await fake.wait_connection(0)
    assert b"FIN " + GOOD not in conn.lines


async def test_auth_is_sent_when_required() -> None:
    auth_ok = json.dumps({"identity": "me", "identity_url": "", "permission_count": 1}).encode()
    script = [
        wait_for(b"IDENTIFY"),
        *handshake(auth_required=True)[1:2],
        wait_for(b"AUTH"),
        respond(auth_ok),
        wait_for(b"SUB"),
        respond(),
    ]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake, auth_secret="s3cret")
        await consumer.start()
        conn = await fake.wait_connection(0)
        await consumer.wait_connected()
        auth = next(iter(consumer.connections.values())).auth_response
        await consumer.close()
    assert conn.bodies[b"AUTH"] == [b"s3cret"]
    assert auth == {"identity": "me", "identity_url": "", "permission_count": 1}


async def test_auth_required_without_secret_fails_the_connection() -> None:
    script = [wait_for(b"IDENTIFY"), *handshake(auth_required=True)[1:2], sleep_forever()]
    async with FakeNsqd(script) as fake:
        consumer = consumer_for(fake, reconnect_interval=10)
        await consumer.start()
        await wait_until_async(
            lambda: fake.connections and fake.connections[0].closed,
            timeout=10.0,
            what="the connection closed",
        )
        assert consumer.connections == {}
        await consumer.close()
    assert b"AUTH" not in fake.connections[0].lines


def sleep_forever() -> Any:
    from .fake_nsqd import sleep

    return sleep(30)


@pytest.mark.parametrize("max_in_flight", [1, 2])
async def test_redistribution_moves_rdy_when_connections_exceed_max_in_flight(
    max_in_flight: int,
) -> None:
    """With more nsqd than max_in_flight, idle connections hand RDY to others, and the sum of
    RDY across nsqd never exceeds max_in_flight, even while it moves."""
    import random

    idle = [*handshake(), wait_for(b"CLS")]
    busy = [*handshake(), message(GOOD, b"x"), wait_for(b"FIN", 1)]
    fakes = [
        await FakeNsqd(idle).start(),
        await FakeNsqd(idle).start(),
        await FakeNsqd(busy).start(),
    ]
    try:
        consumer = consumer_for(
            fakes,
            max_in_flight=max_in_flight,
            low_rdy_idle_timeout=0.05,
            rdy_redistribute_interval=0.02,
            rdy_settle_time=0.01,
            rng=random.Random(7),
        )
        await consumer.start()
        await asyncio.wait_for(fakes[2].wait_connection(0), 5)
        await consumer.close()
    finally:
        for fake in fakes:
            await fake.stop()
    # replay every RDY in arrival order; the sum over the three nsqd never exceeds the max
    events = sorted(
        (t, i, int(line.split()[1]))
        for i, fake in enumerate(fakes)
        for t, line in fake.connections[0].commands
        if line.startswith(b"RDY")
    )
    current = [0, 0, 0]
    for _, i, value in events:
        current[i] = value
        assert sum(current) <= max_in_flight, events
    assert len(events) > 3  # RDY did move around
