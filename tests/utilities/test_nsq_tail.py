"""nsq_tail as a process against real nsqd/nsqlookupd: Go's output bytes, flags and errors."""

from __future__ import annotations

import json
import re
import signal
import sys
import urllib.request
from collections.abc import Callable
from typing import Any

from nsqpy import NSQ_VERSION
from nsqpy.testing import DaemonProcess

from ..raw_v2 import unique, wait_until
from .conftest import (
    ToolProcess,
    http,
    http_post,
    lookup_producers,
    publish,
    run_tool,
    run_tool_fatal,
    tcp,
)


def test_prints_each_body_and_a_newline_then_exits_after_n(nsqd: DaemonProcess) -> None:
    topic = unique("tail")
    bodies = [b"first", b"with\rcarriage", b"\x00\xff binary", b"last"]
    publish(nsqd, topic, *bodies)
    result = run_tool("nsq_tail", f"--topic={topic}", f"--nsqd-tcp-address={tcp(nsqd)}", "-n", "4")
    assert result.returncode == 0, result.stderr
    # Go's TailHandler: os.Stdout.Write(m.Body) then "\n", in arrival (= publish) order
    assert result.stdout == b"".join(body + b"\n" for body in bodies)
    assert b"Adding consumer for topic: " + topic.encode() in result.stderr


def test_print_topic_prefixes_topic_and_bar(nsqd: DaemonProcess) -> None:
    topic = unique("tailpt")
    publish(nsqd, topic, b"a", b"b")
    result = run_tool(
        "nsq_tail",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp(nsqd)}",
        "--n=2",
        "--print-topic",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{topic} | a\n{topic} | b\n".encode()


def test_several_topics_until_sigterm(
    nsqd: DaemonProcess, tool: Callable[..., ToolProcess]
) -> None:
    first, second = unique("tail1"), unique("tail2")
    publish(nsqd, first, b"one", b"two")
    publish(nsqd, second, b"three")
    tail = tool(
        "nsq_tail",
        "-topic",
        first,
        "--topic",
        second,
        f"-nsqd-tcp-address={tcp(nsqd)}",
        "-print-topic",
    )
    tail.wait_for_output(lambda out: out.count(b"\n") == 3)
    lines = sorted(tail.stdout.splitlines())
    assert lines == sorted(
        [f"{first} | one".encode(), f"{first} | two".encode(), f"{second} | three".encode()]
    )
    assert tail.signal(signal.SIGTERM) == 0


def test_default_channel_is_random_and_ephemeral(
    nsqd: DaemonProcess, tool: Callable[..., ToolProcess]
) -> None:
    topic = unique("tailch")
    publish(nsqd, topic, b"x")
    tail = tool("nsq_tail", f"--topic={topic}", f"--nsqd-tcp-address={tcp(nsqd)}")
    tail.wait_for_output(lambda out: out == b"x\n")
    names = _channel_names(nsqd, topic)
    assert len(names) == 1 and re.fullmatch(r"tail\d{6}#ephemeral", names[0]), names
    assert tail.signal(signal.SIGINT) == 0
    # ephemeral: nsqd deletes it once its last consumer has gone
    wait_until(
        lambda: _channel_names(nsqd, topic) == [], what="the channel to go away", timeout=30.0
    )


def _topic_stats(nsqd: DaemonProcess, topic: str) -> dict[str, Any]:
    url = f"{nsqd.http_url}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        stats: dict[str, Any] = json.loads(resp.read())["topics"][0]
        return stats


def _channel_names(nsqd: DaemonProcess, topic: str) -> list[str]:
    return [c["channel_name"] for c in _topic_stats(nsqd, topic)["channels"]]


def test_max_in_flight_is_lowered_to_n(
    nsqd: DaemonProcess, tool: Callable[..., ToolProcess]
) -> None:
    topic = unique("tailrdy")
    publish(nsqd, topic, b"x")
    http_post(nsqd, "/channel/create", topic=topic, channel="watch")
    tail = tool(
        "nsq_tail",
        f"--topic={topic}",
        "--channel=watch",
        f"--nsqd-tcp-address={tcp(nsqd)}",
        "-n",
        "3",
    )

    def ready_count() -> int | None:
        clients = _topic_stats(nsqd, topic)["channels"][0]["clients"]
        return clients[0]["ready_count"] if clients else None

    wait_until(
        lambda: ready_count() == 3, what="RDY 3 (the default 200 lowered to --n)", timeout=30.0
    )
    assert tail.signal() == 0


def test_discovers_nsqd_through_lookupd(
    lookupd_cluster: tuple[DaemonProcess, list[DaemonProcess]],
) -> None:
    lookupd, (first, second) = lookupd_cluster
    topic = unique("taillk")
    publish(first, topic, b"from-a")
    publish(second, topic, b"from-b")
    wait_until(
        lambda: lookup_producers(lookupd, topic) == 2, what="both nsqd registered", timeout=30.0
    )
    result = run_tool(
        "nsq_tail", f"--topic={topic}", f"--lookupd-http-address={http(lookupd)}", "--n=2"
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [b"from-a", b"from-b"]


def test_version() -> None:
    result = run_tool("nsq_tail", "--version")
    assert result.returncode == 0
    python = ".".join(str(part) for part in sys.version_info[:3])
    assert result.stdout == f"nsq_tail v{NSQ_VERSION} (built w/python{python})\n".encode()


def test_validation_errors_as_go(nsqd: DaemonProcess) -> None:
    cases = [
        (["--topic=t"], b"--nsqd-tcp-address or --lookupd-http-address required"),
        (
            ["--topic=t", f"--nsqd-tcp-address={tcp(nsqd)}", "--lookupd-http-address=x:1"],
            b"use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        ([f"--nsqd-tcp-address={tcp(nsqd)}"], b"--topic required"),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1"],
            b"dial tcp 127.0.0.1:1: connect: connection refused",
        ),
        (["--topic=bad topic", f"--nsqd-tcp-address={tcp(nsqd)}"], b"invalid topic name"),
        (
            ["--topic=t", "--max-in-flight=-1", f"--nsqd-tcp-address={tcp(nsqd)}"],
            b"invalid MaxInFlight ! -1 < 0",  # go-nsq's Config.Validate
        ),
        (
            ["--topic=t", "--channel=bad/", f"--nsqd-tcp-address={tcp(nsqd)}"],
            b"invalid channel name",
        ),
        (
            [
                "--topic=t",
                "--consumer-opt=heartbeat_interval,90s",
                f"--nsqd-tcp-address={tcp(nsqd)}",
            ],
            b"HeartbeatInterval 1m30s must be less than ReadTimeout 1m0s",
        ),
    ]
    for args, message in cases:
        assert run_tool_fatal("nsq_tail", args, message).stdout == b""


def test_flag_errors_print_usage_and_exit_2() -> None:
    result = run_tool("nsq_tail", "--topic=t", "--consumer-opt=no_such_option,1")
    assert result.returncode == 2
    first, second = result.stderr.split(b"\n")[:2]
    assert (
        first
        == b'invalid value "no_such_option,1" for flag -consumer-opt: invalid option no_such_option'
    )
    assert second == b"Usage of nsq_tail:"
    result = run_tool("nsq_tail", "--bogus")
    assert result.returncode == 2
    assert result.stderr.startswith(b"flag provided but not defined: -bogus\n")
    result = run_tool("nsq_tail", "-n", "x")
    assert result.returncode == 2
    assert result.stderr.startswith(b'invalid value "x" for flag -n: parse error\n')


def test_connection_errors_are_logged_in_go_words(tool: Callable[..., ToolProcess]) -> None:
    """Logged connection failures read as Go's (no Python exception reprs on an operator's
    terminal): the refused nsqd in the ERR line, the unreachable nsqlookupd in its retries."""
    result = run_tool("nsq_tail", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1")
    assert result.returncode == 1
    assert (
        b"ERR (127.0.0.1:1) error connecting to nsqd - dial tcp 127.0.0.1:1: connect: "
        b"connection refused\n" in result.stderr
    ), result.stderr
    assert b"Error(" not in result.stderr

    tail = tool("nsq_tail", "--topic=t", "--lookupd-http-address=127.0.0.1:1")
    url = b"http://127.0.0.1:1/lookup?topic=t"
    tail.wait_for_stderr(
        b"ERR error querying nsqlookupd (" + url + b') - Get "' + url + b'": '
        b"dial tcp 127.0.0.1:1: connect: connection refused\n"
    )
    assert b"Error(" not in tail.stderr
    assert tail.signal() == 0
