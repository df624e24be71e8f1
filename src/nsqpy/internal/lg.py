"""Logging in Go nsq's format, which peer clients' test harnesses parse.

``[nsqd] 2026/11/22 04:14:35.297917 INFO: TCP: listening on 127.0.0.1:4150``
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

DEBUG, INFO, WARN, ERROR, FATAL = 1, 2, 3, 4, 5

LEVEL_NAMES = {DEBUG: "DEBUG", INFO: "INFO", WARN: "WARNING", ERROR: "ERROR", FATAL: "FATAL"}
_PARSE = {"debug": DEBUG, "info": INFO, "warn": WARN, "error": ERROR, "fatal": FATAL}
_BY_NAME = {"DEBUG": DEBUG, "INFO": INFO, "WARN": WARN, "WARNING": WARN, "ERROR": ERROR}


def parse_level(text: str) -> int:
    """Parse ``--log-level`` (case-insensitive ``debug|info|warn|error|fatal``)."""
    try:
        return _PARSE[text.lower()]
    except KeyError:
        raise ValueError(f"invalid log level '{text}' (debug, info, warn, error, fatal)") from None


def level_name(level: int) -> str:
    return {v: k for k, v in _PARSE.items()}[level]


class Logger:
    """A levelled logger that writes Go-formatted lines to a stream, flushed per line."""

    __slots__ = ("level", "prefix", "stream")

    def __init__(self, prefix: str, level: int = INFO, stream: TextIO | None = None) -> None:
        self.prefix = prefix
        self.level = level
        self.stream = stream if stream is not None else sys.stderr

    def enabled(self, level: int) -> bool:
        return level >= self.level

    def log(self, level: int, message: str) -> None:
        if level < self.level:
            return
        now = time.time()
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now))
        micros = int((now % 1) * 1_000_000)
        line = f"{self.prefix}{stamp}.{micros:06d} {LEVEL_NAMES[level]}: {message}\n"
        try:
            self.stream.write(line)
            self.stream.flush()
        except (OSError, ValueError):  # a closed stderr must never take a daemon down
            pass

    def __call__(self, level: str | int, message: str) -> None:
        """``log("INFO", "...")``: the callable form handed to components such as DiskQueue."""
        self.log(level if isinstance(level, int) else _BY_NAME[level.upper()], message)

    def debug(self, message: str) -> None:
        self.log(DEBUG, message)

    def info(self, message: str) -> None:
        self.log(INFO, message)

    def warn(self, message: str) -> None:
        self.log(WARN, message)

    def error(self, message: str) -> None:
        self.log(ERROR, message)

    def fatal(self, message: str) -> None:
        self.log(FATAL, message)


#: seconds between two summaries of a repeating failure; the environment variable lets tests
#: (and impatient operators) shorten it without a flag Go's nsqd does not have
REPEAT_INTERVAL_ENV = "NSQPY_LOG_REPEAT_INTERVAL"
DEFAULT_REPEAT_INTERVAL = 5.0


def repeat_interval() -> float:
    try:
        return max(0.0, float(os.environ.get(REPEAT_INTERVAL_ENV, DEFAULT_REPEAT_INTERVAL)))
    except ValueError:
        return DEFAULT_REPEAT_INTERVAL


class _Streak:
    __slots__ = ("first", "last_message", "reported", "since_report", "total")

    def __init__(self, now: float, message: str) -> None:
        self.first = now
        self.reported = now
        self.since_report = 0
        self.total = 1
        self.last_message = message


class RepeatSummary:
    """Say a repeating failure once, then summarise it, never one line per retry.

    ``failed(key, message)`` logs the first failure of a streak with its cause; later failures
    with the same key are counted and logged at most once per ``interval`` with the count
    (``... (repeated 41 times in 5.0s)``). ``recovered(key, message)`` ends the streak with one
    line saying how long it lasted. Keys are whatever identifies "the same failure" to the
    caller (a queue and an operation, a listener).
    """

    __slots__ = ("_clock", "_log", "_streaks", "interval")

    def __init__(
        self,
        log: Callable[[str, str], None],
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self.interval = repeat_interval() if interval is None else interval
        self._clock = clock
        self._streaks: dict[str, _Streak] = {}

    @property
    def active(self) -> bool:
        """Some failure is in a streak now."""
        return bool(self._streaks)

    def failing(self, key: str) -> bool:
        return key in self._streaks

    def failed(self, key: str, message: str, level: str = "ERROR") -> None:
        now = self._clock()
        streak = self._streaks.get(key)
        if streak is None:
            self._streaks[key] = _Streak(now, message)
            self._log(level, message)
            return
        streak.total += 1
        streak.since_report += 1
        streak.last_message = message
        if now - streak.reported >= self.interval:
            elapsed = now - streak.reported
            self._log(level, f"{message} (repeated {streak.since_report} times in {elapsed:.1f}s)")
            streak.reported = now
            streak.since_report = 0

    def recovered(self, key: str, message: str) -> None:
        streak = self._streaks.pop(key, None)
        if streak is None:
            return
        elapsed = self._clock() - streak.first
        self._log("INFO", f"{message} (after {streak.total} failures in {elapsed:.1f}s)")
