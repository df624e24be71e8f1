"""nsq_to_nsq as a process between real nsqd: copying, FIN after the destination's OK, modes,
Go's JSON filters byte for byte, status lines, errors."""

from __future__ import annotations

import functools
import re
import signal
from collections.abc import Callable

import pytest

from nsqpy.client import sync
from nsqpy.testing import DaemonProcess

from ..raw_v2 import unique, wait_until
from .conftest import (
    ToolProcess,
    channel_stats,
    http,
    lookup_producers,
    publish,
    run_tool,
    run_tool_fatal,
    tcp,
    topic_message_count,
)


def _finished(nsqd: DaemonProcess, topic: str, channel: str, count: int) -> bool:
    stats = channel_stats(nsqd, topic, channel)
    return (
        stats is not None
        and stats["message_count"] == count
        and stats["depth"] == 0
        and stats["in_flight_count"] == 0
        and stats["deferred_count"] == 0
    )


def _bodies(nsqd: DaemonProcess, topic: str, count: int) -> list[bytes]:
    messages = sync.consume(topic, "check", count, nsqd_tcp_addresses=tcp(nsqd), timeout=30)
    return [m.body for m in messages]


def test_copies_every_message_and_fins_the_source(
    nsqd: DaemonProcess,
    second_nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
) -> None:
    topic = unique("copy")
    bodies = [b"message %d" % i for i in range(50)]
    publish(nsqd, topic, *bodies)
    bridge = tool(
        "nsq_to_nsq",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp(nsqd)}",
        f"--destination-nsqd-tcp-address={tcp(second_nsqd)}",
    )
    wait_until(
        lambda: _finished(nsqd, topic, "nsq_to_nsq", 50), what="the source drained", timeout=30.0
    )
    assert topic_message_count(second_nsqd, topic) == 50
    assert sorted(_bodies(second_nsqd, topic, 50)) == sorted(bodies)
    assert bridge.signal(signal.SIGTERM) == 0


def test_destination_topic_and_lookupd_source(
    lookupd_cluster: tuple[DaemonProcess, list[DaemonProcess]],
    second_nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
) -> None:
    lookupd, (first, second) = lookupd_cluster
    topic, destination = unique("lksrc"), unique("renamed")
    publish(first, topic, b"a")
    publish(second, topic, b"b")
    wait_until(
        lambda: lookup_producers(lookupd, topic) == 2, what="both nsqd registered", timeout=30.0
    )
    bridge = tool(
        "nsq_to_nsq",
        f"--topic={topic}",
        "--channel=bridge",
        f"--lookupd-http-address={http(lookupd)}",
        f"--destination-nsqd-tcp-address={tcp(second_nsqd)}",
        f"--destination-topic={destination}",
    )
    wait_until(
        lambda: topic_message_count(second_nsqd, destination) == 2, what="both copied", timeout=30.0
    )
    assert sorted(_bodies(second_nsqd, destination, 2)) == [b"a", b"b"]
    assert bridge.signal(signal.SIGINT) == 0


def test_unreachable_destination_requeues_and_finishes_nothing(
    nsqd: DaemonProcess, tool: Callable[..., ToolProcess]
) -> None:
    topic = unique("nodest")
    publish(nsqd, topic, b"kept")
    bridge = tool(
        "nsq_to_nsq",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp(nsqd)}",
        "--destination-nsqd-tcp-address=127.0.0.1:1",
    )

    def requeued() -> bool:
        stats = channel_stats(nsqd, topic, "nsq_to_nsq")
        return stats is not None and stats["requeue_count"] >= 1

    wait_until(requeued, what="a REQ after the failed publish", timeout=30.0)
    assert bridge.signal() == 0
    stats = channel_stats(nsqd, topic, "nsq_to_nsq")
    assert stats is not None
    # never FINished: still there, waiting (deferred by the REQ delay) or queued
    assert stats["depth"] + stats["deferred_count"] + stats["in_flight_count"] == 1


def test_round_robin_and_hostpool_spread_over_destinations(
    nsqd: DaemonProcess,
    second_nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
) -> None:
    for mode in ("round-robin", "hostpool"):
        topic, destination = unique("spread"), unique("spreadout")
        publish(nsqd, topic, *[b"%d" % i for i in range(10)])
        bridge = tool(
            "nsq_to_nsq",
            f"--topic={topic}",
            f"--nsqd-tcp-address={tcp(nsqd)}",
            f"--destination-nsqd-tcp-address={tcp(nsqd)}",
            f"--destination-nsqd-tcp-address={tcp(second_nsqd)}",
            f"--destination-topic={destination}",
            f"--mode={mode}",
        )
        drained = functools.partial(_finished, nsqd, topic, "nsq_to_nsq", 10)
        wait_until(drained, what=f"{mode} drained", timeout=30.0)
        # both pools alternate over healthy destinations: 5 each
        assert topic_message_count(nsqd, destination) == 5, mode
        assert topic_message_count(second_nsqd, destination) == 5, mode
        assert bridge.signal() == 0


def test_json_filters_match_go(
    nsqd: DaemonProcess,
    second_nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
) -> None:
    topic = unique("json")
    publish(
        nsqd,
        topic,
        b'{"a":1,"b":"x","c":1.5,"d":{"e":5,"f":1e-7},"g":"<&>\xc3\xa9","h":[1,2.5]}',
        b'{"a":2,"b":"y"}',  # wrong value: dropped
        b"not json",  # dropped (logged)
        b'["b"]',  # not an object: dropped
        b'{"b":"x","zz":1}',  # passes; nothing whitelisted in it
        b'{"a":1e21,"b":"x"}',
        b'{"b":"x","a":12345678901234567890}',
    )
    bridge = tool(
        "nsq_to_nsq",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp(nsqd)}",
        f"--destination-nsqd-tcp-address={tcp(second_nsqd)}",
        "--require-json-field=b",
        "--require-json-value=x",
        "--whitelist-json-field=a",
        "--whitelist-json-field=c",
        "--whitelist-json-field=d",
        "--whitelist-json-field=g",
        "--whitelist-json-field=h",
    )
    wait_until(lambda: _finished(nsqd, topic, "nsq_to_nsq", 7), what="all 7 handled", timeout=30.0)
    wait_until(lambda: topic_message_count(second_nsqd, topic) == 4, what="4 passed", timeout=30.0)
    # Go's json.Marshal of the whitelisted map: sorted keys, integral floats as ints at the top
    # level, shortest floats below it, HTML characters escaped, UTF-8 kept
    assert sorted(_bodies(second_nsqd, topic, 4)) == sorted(
        [
            b'{"a":1,"c":1.5,"d":{"e":5,"f":1e-7},"g":"\\u003c\\u0026\\u003e\xc3\xa9","h":[1,2.5]}',
            b"{}",
            b'{"a":1e+21}',
            b'{"a":12345678901234567000}',
        ]
    )
    assert bridge.signal() == 0
    assert b"ERROR: Unable to decode json: not json" in bridge.stderr


def test_numeric_required_value_and_missing_field_backoff(
    nsqd: DaemonProcess,
    second_nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
) -> None:
    topic = unique("jsonnum")
    publish(nsqd, topic, b'{"n":5}', b'{"n":"5"}', b'{"n":5.5}', b'{"other":1}')
    bridge = tool(
        "nsq_to_nsq",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp(nsqd)}",
        f"--destination-nsqd-tcp-address={tcp(second_nsqd)}",
        "--require-json-field=n",
        "--require-json-value=5.0",
    )
    # 5 equals 5.0 as a number; "5" is a string unequal to "5.0"; {"other"} is REQueued
    wait_until(
        lambda: topic_message_count(second_nsqd, topic) == 1, what="the numeric match", timeout=30.0
    )
    bridge.wait_for_stderr(b"ERROR: missing field to check required value")

    def requeued() -> bool:
        stats = channel_stats(nsqd, topic, "nsq_to_nsq")
        return stats is not None and stats["requeue_count"] >= 1

    wait_until(requeued, what="the backoff REQ", timeout=30.0)
    assert bridge.signal() == 0
    assert _bodies(second_nsqd, topic, 1) == [b'{"n":5}']


def test_status_every_logs_timer_metrics(
    nsqd: DaemonProcess,
    second_nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
) -> None:
    topic = unique("status")
    publish(nsqd, topic, *[b"%d" % i for i in range(5)])
    bridge = tool(
        "nsq_to_nsq",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp(nsqd)}",
        f"--destination-nsqd-tcp-address={tcp(second_nsqd)}",
        "--status-every=2",
    )
    wait_until(lambda: _finished(nsqd, topic, "nsq_to_nsq", 5), what="drained", timeout=30.0)
    assert bridge.signal() == 0
    err = bridge.stderr
    assert b"Warning: use more than 100 status values for accurate percentiles" in err
    # timer_metrics prints on the 3rd and 5th timing (position wraps past status-every)
    lines = re.findall(
        rb"\[aggregate\]: finished 2 - 99th: \d+\.\d\dms - 95th: \d+\.\d\dms - avg: \d+\.\d\dms",
        err,
    )
    assert len(lines) == 2, err


def test_validation_errors_as_go(nsqd: DaemonProcess) -> None:
    source = f"--nsqd-tcp-address={tcp(nsqd)}"
    dest = "--destination-nsqd-tcp-address=127.0.0.1:1"
    cases = [
        ([source, dest], b"--topic and --channel are required"),
        (["--topic=t", "--channel=", source, dest], b"--topic and --channel are required"),
        (["--topic=bad topic", source, dest], b"--topic is invalid"),
        (
            ["--topic=t", "--destination-topic=bad!", source, dest],
            b"--destination-topic is invalid",
        ),
        (["--topic=t", "--channel=bad/ch", source, dest], b"--channel is invalid"),
        (["--topic=t", dest], b"--nsqd-tcp-address or --lookupd-http-address required"),
        (
            ["--topic=t", source, "--lookupd-http-address=x:1", dest],
            b"use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (["--topic=t", source], b"--destination-nsqd-tcp-address required"),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1", dest],
            b"dial tcp 127.0.0.1:1: connect: connection refused",
        ),
    ]
    for args, message in cases:
        run_tool_fatal("nsq_to_nsq", args, message)


def test_version_and_bad_options() -> None:
    result = run_tool("nsq_to_nsq", "--version")
    assert result.returncode == 0
    assert result.stdout.startswith(b"nsq_to_nsq v1.3.0 (built w/python")
    # checked while parsing, before --version, as Go's flag package calls ConfigFlag.Set
    result = run_tool("nsq_to_nsq", "--producer-opt=read_timeout,10m", "--version")
    assert result.returncode == 2
    assert result.stdout == b""
    assert result.stderr.split(b"\n")[0] == (
        b'invalid value "read_timeout,10m" for flag -producer-opt: '
        b"invalid read_timeout ! 10m0s > 5m0s"
    )


@pytest.mark.parametrize("mode", ["hostpool", "epsilon-greedy"])
def test_pool_modes_move_to_the_healthy_destination(
    mode: str,
    nsqd: DaemonProcess,
    second_nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
) -> None:
    topic, destination = unique("failover"), unique("failoverout")
    publish(nsqd, topic, *[b"%d" % i for i in range(20)])
    bridge = tool(
        "nsq_to_nsq",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp(nsqd)}",
        "--destination-nsqd-tcp-address=127.0.0.1:1",  # down: tried first, then avoided
        f"--destination-nsqd-tcp-address={tcp(second_nsqd)}",
        f"--destination-topic={destination}",
        "--consumer-opt=default_requeue_delay,100ms",  # the failed copy is retried soon
        "--consumer-opt=backoff_multiplier,10ms",
        f"--mode={mode}",
    )
    drained = functools.partial(_finished, nsqd, topic, "nsq_to_nsq", 20)
    wait_until(drained, what="every message copied", timeout=30.0)
    assert topic_message_count(second_nsqd, destination) == 20
    stats = channel_stats(nsqd, topic, "nsq_to_nsq")
    assert stats is not None and stats["requeue_count"] >= 1  # the attempt on the dead one
    assert bridge.signal() == 0
