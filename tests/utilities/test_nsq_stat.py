"""nsq_stat as a process: Go's header and columns byte for byte, totals, discovery, errors."""

from __future__ import annotations

import signal
from collections.abc import Callable

from nsqpy.apps.nsq_stat import report_line
from nsqpy.testing import DaemonProcess

from ..raw_v2 import unique, wait_until
from .conftest import (
    ToolProcess,
    fatal_line,
    http,
    http_post,
    lookup_producers,
    publish,
    run_tool,
    run_tool_fatal,
)

# Go's apps/nsq_stat format strings, verbatim
GO_RULE = b"%s+%s+%s\n" % (
    b"------rate------",
    b"----------------depth----------------",
    b"--------------metadata---------------",
)
GO_NAMES = b"%7s %7s | %7s %7s %7s %5s %5s | %7s %7s %12s %7s\n" % (
    b"ingress",
    b"egress",
    b"total",
    b"mem",
    b"disk",
    b"inflt",
    b"def",
    b"req",
    b"t-o",
    b"msgs",
    b"clients",
)
GO_LINE = b"%7d %7d | %7d %7d %7d %5d %5d | %7d %7d %12d %7d\n"
HEADER = GO_RULE + GO_NAMES


def _idle_channel(nsqd: DaemonProcess, topic: str, channel: str, messages: int) -> None:
    http_post(nsqd, "/topic/create", topic=topic)
    http_post(nsqd, "/channel/create", topic=topic, channel=channel)
    publish(nsqd, topic, *[b"m%d" % i for i in range(messages)])


def test_reports_match_go_format_byte_for_byte(nsqd: DaemonProcess) -> None:
    topic = unique("stat")
    _idle_channel(nsqd, topic, "ch", 7)
    result = run_tool(
        "nsq_stat",
        f"--topic={topic}",
        "--channel=ch",
        f"--nsqd-http-address={http(nsqd)}",
        "--count=2",
        "--interval=50ms",
    )
    assert result.returncode == 0, result.stderr
    # nothing moves: no ingress/egress; 7 in the memory queue, 7 messages ever, no clients
    line = GO_LINE % (0, 0, 7, 7, 0, 0, 0, 0, 0, 7, 0)
    assert result.stdout == HEADER + line + line


def test_header_every_25_reports(nsqd: DaemonProcess) -> None:
    topic = unique("stat25")
    _idle_channel(nsqd, topic, "ch", 1)
    result = run_tool(
        "nsq_stat",
        "-topic",
        topic,
        "-channel",
        "ch",
        "-nsqd-http-address",
        http(nsqd),
        "-count",
        "26",
        "-interval",
        "10ms",
    )
    assert result.returncode == 0, result.stderr
    line = GO_LINE % (0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0)
    assert result.stdout == HEADER + line * 24 + HEADER + line * 2


def test_totals_over_all_producers_found_through_lookupd(
    lookupd_cluster: tuple[DaemonProcess, list[DaemonProcess]],
) -> None:
    lookupd, (first, second) = lookupd_cluster
    topic = unique("statlk")
    _idle_channel(first, topic, "ch", 3)
    _idle_channel(second, topic, "ch", 4)
    wait_until(
        lambda: lookup_producers(lookupd, topic) == 2, what="both nsqd registered", timeout=30.0
    )
    result = run_tool(
        "nsq_stat",
        f"--topic={topic}",
        "--channel=ch",
        f"--lookupd-http-address={http(lookupd)}",
        "--count=1",
        "--interval=50ms",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == HEADER + GO_LINE % (0, 0, 7, 7, 0, 0, 0, 0, 0, 7, 0)


def test_rates_are_deltas_over_the_interval() -> None:
    old = dict.fromkeys(
        (
            "depth",
            "memory_depth",
            "backend_depth",
            "in_flight_count",
            "deferred_count",
            "requeue_count",
            "timeout_count",
            "message_count",
            "client_count",
        ),
        0,
    )
    new = dict(old, depth=20, memory_depth=15, backend_depth=5, message_count=101, client_count=2)
    # ingress = 101 / 2 s (truncated), egress = (101 - 20) / 2 s
    assert report_line(new, old, 2.0).encode() == GO_LINE % (50, 40, 20, 15, 5, 0, 0, 0, 0, 101, 2)


def test_errors_as_go(nsqd: DaemonProcess) -> None:
    topic = unique("staterr")
    _idle_channel(nsqd, topic, "ch", 1)
    cases = [
        (
            ["--channel=c", f"--nsqd-http-address={http(nsqd)}"],
            b"--topic and --channel are required",
        ),
        (["--topic=t", "--channel=c", "--interval=0s"], b"--interval should be positive"),
        (["--topic=t", "--channel=c", "--count=0"], b"--count should be positive"),
        (
            ["--topic=t", "--channel=c", "--http-client-connect-timeout=0"],
            b"--http-client-connect-timeout should be positive",
        ),
        (["--topic=t", "--channel=c"], b"--nsqd-http-address or --lookupd-http-address required"),
        (
            ["--topic=t", "--channel=c", "--nsqd-http-address=a:1", "--lookupd-http-address=b:1"],
            b"use --nsqd-http-address or --lookupd-http-address not both",
        ),
        (
            ["--topic=t", "--channel=c", "--nsqd-http-address=http://a:1"],
            b"--nsqd-http-address error - address should not contain scheme",
        ),
        (
            [f"--topic={topic}", "--channel=nope", f"--nsqd-http-address={http(nsqd)}"],
            f"ERROR: failed to find channel(nope) in stats metadata for topic({topic})".encode(),
        ),
        (
            ["--topic=absent", "--channel=c", f"--nsqd-http-address={http(nsqd)}"],
            b"ERROR: failed to get nsqd stats - failed to query any nsqd: ",
        ),
        (
            ["--topic=t", "--channel=c", "--nsqd-http-address=127.0.0.1:1"],
            b"ERROR: failed to get topic producers - failed to query any nsqd: "
            b'Get "http://127.0.0.1:1/stats?format=json&topic=t&include_clients=false": '
            b"dial tcp 127.0.0.1:1: connect: connection refused",
        ),
    ]
    for args, message in cases:
        assert run_tool_fatal("nsq_stat", args, message).stdout == b""


def test_unknown_topic_through_lookupd(
    lookupd_cluster: tuple[DaemonProcess, list[DaemonProcess]],
) -> None:
    lookupd, _ = lookupd_cluster
    result = run_tool(
        "nsq_stat", "--topic=never_seen", "--channel=c", f"--lookupd-http-address={http(lookupd)}"
    )
    assert result.returncode == 1
    assert fatal_line(result.stderr) == (
        b"ERROR: failed to get topic producers - failed to query any nsqlookupd: "
        b'got response 404 Not Found "{\\"message\\":\\"TOPIC_NOT_FOUND\\"}"'
    )


def test_count_must_parse_as_go_int32() -> None:
    result = run_tool("nsq_stat", "--count=x")
    assert result.returncode == 2
    assert result.stderr.split(b"\n")[0] == (
        b'invalid value "x" for flag -count: strconv.ParseInt: parsing "x": invalid syntax'
    )
    assert result.stderr.split(b"\n")[1] == b"Usage of nsq_stat:"


def test_version() -> None:
    result = run_tool("nsq_stat", "--version")
    assert result.returncode == 0
    assert result.stdout.startswith(b"nsq_stat v1.3.0 (built w/python")


def test_runs_until_a_signal_without_count(
    nsqd: DaemonProcess, tool: Callable[..., ToolProcess]
) -> None:
    topic = unique("statsig")
    _idle_channel(nsqd, topic, "ch", 2)
    stat = tool(
        "nsq_stat",
        f"--topic={topic}",
        "--channel=ch",
        f"--nsqd-http-address={http(nsqd)}",
        "--interval=20ms",
    )
    line = GO_LINE % (0, 0, 2, 2, 0, 0, 0, 0, 0, 2, 0)
    stat.wait_for_output(lambda out: out.startswith(HEADER + line + line))
    assert stat.signal(signal.SIGHUP) == 0  # Go stops on SIGHUP, SIGINT and SIGTERM
