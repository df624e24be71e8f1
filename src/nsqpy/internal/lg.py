"""Logging in Go nsq's format, which peer clients' test harnesses parse.

``[nsqd] 2026/11/22 04:14:35.297917 INFO: TCP: listening on 127.0.0.1:4150``
"""

from __future__ import annotations

import sys
import time
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
