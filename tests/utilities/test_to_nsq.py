"""to_nsq as a process against real nsqd: records, delimiters, fan-out, rate, errors."""

from __future__ import annotations

import signal
import subprocess
import time

from nsqpy.client import sync
from nsqpy.testing import DaemonProcess

from ..raw_v2 import unique, wait_until
from .conftest import fatal_line, run_tool, run_tool_fatal, tcp, tool_command, topic_message_count


def _bodies(nsqd: DaemonProcess, topic: str, count: int) -> list[bytes]:
    messages = sync.consume(topic, "check", count, nsqd_tcp_addresses=tcp(nsqd), timeout=30)
    return [m.body for m in messages]


def test_publishes_each_line_and_skips_empty_ones(nsqd: DaemonProcess) -> None:
    topic = unique("tonsq")
    lines = [b"first", b"", b"second with spaces", b"\r", b"", b"\xff\x00third"]
    stdin = b"\n".join(lines) + b"\n"
    result = run_tool("to_nsq", f"--topic={topic}", f"--nsqd-tcp-address={tcp(nsqd)}", input=stdin)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b""
    assert topic_message_count(nsqd, topic) == 4
    assert _bodies(nsqd, topic, 4) == [b"first", b"second with spaces", b"\r", b"\xff\x00third"]


def test_custom_delimiter_and_unterminated_last_record(nsqd: DaemonProcess) -> None:
    topic = unique("tonsqdelim")
    result = run_tool(
        "to_nsq",
        "-topic",
        topic,
        "-nsqd-tcp-address",
        tcp(nsqd),
        "-delimiter=,",
        input=b"a\nb,,c,last",
    )
    assert result.returncode == 0, result.stderr
    # the last record has no delimiter after it: published whole (Go drops its last byte)
    assert _bodies(nsqd, topic, 3) == [b"a\nb", b"c", b"last"]


def test_every_record_goes_to_every_nsqd(nsqd: DaemonProcess, second_nsqd: DaemonProcess) -> None:
    topic = unique("tonsqfan")
    count = 500
    stdin = b"".join(b"message %d\n" % i for i in range(count))
    result = run_tool(
        "to_nsq",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp(nsqd)}",
        f"--nsqd-tcp-address={tcp(second_nsqd)}",
        input=stdin,
    )
    assert result.returncode == 0, result.stderr
    assert topic_message_count(nsqd, topic) == count
    assert topic_message_count(second_nsqd, topic) == count
    assert _bodies(second_nsqd, topic, count) == [b"message %d" % i for i in range(count)]


def test_rate_limits_messages_per_second(nsqd: DaemonProcess) -> None:
    topic = unique("tonsqrate")
    stdin = b"".join(b"%d\n" % i for i in range(30))
    started = time.monotonic()
    result = run_tool(
        "to_nsq", f"--topic={topic}", f"--nsqd-tcp-address={tcp(nsqd)}", "--rate=20", input=stdin
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert b"Throttling messages rate to max:20/second" in result.stderr
    assert topic_message_count(nsqd, topic) == 30
    # one token to start with, then one every 50 ms: 29 waits of at least ~50 ms
    assert elapsed >= 1.2, elapsed


def test_validation_errors_as_go(nsqd: DaemonProcess) -> None:
    cases = [
        ([f"--nsqd-tcp-address={tcp(nsqd)}"], b"--topic required"),
        (["--topic=t", "--delimiter=ab"], b"--delimiter must be a single byte"),
        (["--topic=t", "--delimiter="], b"--delimiter must be a single byte"),
        (["--topic=t"], b"--nsqd-tcp-address required"),
    ]
    for args, message in cases:
        run_tool_fatal("to_nsq", args, message, input=b"x\n")


def test_unreachable_nsqd_fails_at_the_first_publish() -> None:
    result = run_tool("to_nsq", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", input=b"x\n")
    assert result.returncode == 1
    assert fatal_line(result.stderr) == b"dial tcp 127.0.0.1:1: connect: connection refused"
    # nothing to publish: nothing to connect for (go-nsq connects lazily)
    result = run_tool("to_nsq", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", input=b"")
    assert result.returncode == 0, result.stderr


def test_producer_opt_is_checked_as_go_nsq_does() -> None:
    result = run_tool("to_nsq", "--topic=t", "--producer-opt=snappy,maybe")
    assert result.returncode == 2
    assert result.stderr.split(b"\n")[0] == (
        b'invalid value "snappy,maybe" for flag -producer-opt: failed to coerce option snappy '
        b'(maybe) - strconv.ParseBool: parsing "maybe": invalid syntax'
    )


def test_producer_opt_reaches_the_connection(nsqd: DaemonProcess) -> None:
    topic = unique("tonsqopt")
    result = run_tool(
        "to_nsq",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp(nsqd)}",
        "--producer-opt=deflate",
        "--producer-opt=deflate_level,9",
        input=b"compressed\n",
    )
    assert result.returncode == 0, result.stderr
    assert _bodies(nsqd, topic, 1) == [b"compressed"]


def test_sigterm_while_waiting_for_input_exits_cleanly(nsqd: DaemonProcess) -> None:
    topic = unique("tonsqterm")
    proc = subprocess.Popen(
        [*tool_command("to_nsq"), f"--topic={topic}", f"--nsqd-tcp-address={tcp(nsqd)}"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(b"a\nb\n")
        proc.stdin.flush()  # stdin stays open: to_nsq waits for more
        wait_until(
            lambda: topic_message_count(nsqd, topic) == 2, what="the two lines", timeout=30.0
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdin.close()
    assert _bodies(nsqd, topic, 2) == [b"a", b"b"]
