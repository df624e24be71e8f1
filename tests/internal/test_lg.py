"""Go nsq's log line format and levels (internal/lg)."""

from __future__ import annotations

import io
import re
import time

import pytest

from nsqpy.internal import lg

LINE = re.compile(r"^\[nsqd\] (\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2})\.(\d{6}) ([A-Z]+): (.*)$")


def logger(level: int = lg.INFO) -> tuple[lg.Logger, io.StringIO]:
    stream = io.StringIO()
    return lg.Logger("[nsqd] ", level, stream), stream


def test_line_format() -> None:
    log, stream = logger()
    before = time.time()
    log.info("TCP: listening on 127.0.0.1:4150")
    text = stream.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1
    match = LINE.match(text.rstrip("\n"))
    assert match, text
    assert match.group(3) == "INFO"
    assert match.group(4) == "TCP: listening on 127.0.0.1:4150"
    stamp = time.mktime(time.strptime(match.group(1), "%Y/%m/%d %H:%M:%S"))
    assert before - 2 <= stamp <= time.time() + 1  # local time, like Go's log package


@pytest.mark.parametrize(
    "method,name",
    [("debug", "DEBUG"), ("info", "INFO"), ("warn", "WARNING"), ("error", "ERROR")],
)
def test_level_names(method: str, name: str) -> None:
    log, stream = logger(lg.DEBUG)
    getattr(log, method)("m")
    match = LINE.match(stream.getvalue().rstrip("\n"))
    assert match and match.group(3) == name


def test_fatal_level_name() -> None:
    log, stream = logger(lg.DEBUG)
    log.fatal("boom")
    match = LINE.match(stream.getvalue().rstrip("\n"))
    assert match and match.group(3) == "FATAL"


def test_levels_below_the_threshold_are_dropped() -> None:
    log, stream = logger(lg.WARN)
    log.debug("d")
    log.info("i")
    log.warn("w")
    log.error("e")
    kinds = [LINE.match(line).group(3) for line in stream.getvalue().splitlines()]  # type: ignore[union-attr]
    assert kinds == ["WARNING", "ERROR"]
    assert not log.enabled(lg.INFO)
    assert log.enabled(lg.ERROR)


def test_level_can_change_at_runtime() -> None:
    log, stream = logger(lg.INFO)
    log.level = lg.FATAL
    log.error("hidden")
    assert stream.getvalue() == ""


def test_callable_form() -> None:
    log, stream = logger(lg.DEBUG)
    log("INFO", "a")
    log("warning", "b")
    log(lg.ERROR, "c")
    kinds = [LINE.match(line).group(3) for line in stream.getvalue().splitlines()]  # type: ignore[union-attr]
    assert kinds == ["INFO", "WARNING", "ERROR"]


def test_custom_prefix() -> None:
    stream = io.StringIO()
    lg.Logger("[nsqlookupd] ", lg.INFO, stream).info("x")
    assert stream.getvalue().startswith("[nsqlookupd] ")


def test_closed_stream_is_ignored() -> None:
    stream = io.StringIO()
    log = lg.Logger("[nsqd] ", lg.INFO, stream)
    stream.close()
    log.info("does not raise")


@pytest.mark.parametrize(
    "text,level",
    [
        ("debug", lg.DEBUG),
        ("INFO", lg.INFO),
        ("Warn", lg.WARN),
        ("error", lg.ERROR),
        ("FATAL", lg.FATAL),
    ],
)
def test_parse_level(text: str, level: int) -> None:
    assert lg.parse_level(text) == level


@pytest.mark.parametrize("text", ["warning", "", "trace", " info"])
def test_parse_level_rejects(text: str) -> None:
    with pytest.raises(ValueError) as info:
        lg.parse_level(text)
    # Go: invalid log level '<s>' (debug, info, warn, error, fatal)
    assert str(info.value) == f"invalid log level '{text}' (debug, info, warn, error, fatal)"


def test_level_numbers_match_go() -> None:
    assert (lg.DEBUG, lg.INFO, lg.WARN, lg.ERROR, lg.FATAL) == (1, 2, 3, 4, 5)
    assert lg.level_name(lg.WARN) == "warn"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_repeat_summary_says_a_failure_once_then_a_count_per_interval() -> None:
    lines: list[tuple[str, str]] = []
    clock = _Clock()
    summary = lg.RepeatSummary(lambda level, text: lines.append((level, text)), 5.0, clock)
    for _ in range(1000):  # 1000 failures over 10 s
        summary.failed("disk", "write failed - no space left on device")
        clock.now += 0.01
    assert lines[0] == ("ERROR", "write failed - no space left on device")
    assert [text for _, text in lines[1:]] == [
        "write failed - no space left on device (repeated 500 times in 5.0s)"
    ]
    summary.failed("other", "another failure", "WARN")  # another key: said at once
    assert lines[-1] == ("WARN", "another failure")
    clock.now += 1.0
    summary.recovered("disk", "writing again")
    assert lines[-1] == ("INFO", "writing again (after 1000 failures in 11.0s)")
    assert not summary.failing("disk") and summary.failing("other")
    summary.recovered("disk", "not in a streak: nothing said")
    assert len(lines) == 4
