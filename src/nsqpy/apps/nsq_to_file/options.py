"""nsq_to_file's flags with Go's names, defaults and checks (Go: apps/nsq_to_file/options.go
and the checks in nsq_to_file.go's ``main``)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ...internal import lg
from ...internal.flags import BOOL, DURATION, INT, STR, option
from ..common import ConsumerFlags, FatalError, HTTPClientFlags

REV_MISSING = "missing <REV> in --filename-format when gzip, rotation, or work dir enabled"


@dataclass
class Options(ConsumerFlags, HTTPClientFlags):
    channel: str = option("channel", "nsq_to_file", STR, "nsq channel")
    log_level: str = option(
        "log-level", "info", STR, "set log verbosity: debug, info, warn, error, or fatal"
    )
    log_prefix: str = option("log-prefix", "[nsq_to_file] ", STR, "log message prefix")
    output_dir: str = option("output-dir", "/tmp", STR, "directory to write output files to")
    work_dir: str = option(
        "work-dir", "", STR, "directory for in-progress files before moving to output-dir"
    )
    datetime_format: str = option(
        "datetime-format",
        "%Y-%m-%d_%H",
        STR,
        "strftime compatible format for <DATETIME> in filename format",
    )
    filename_format: str = option(
        "filename-format",
        "<TOPIC>.<HOST><REV>.<DATETIME>.log",
        STR,
        "output filename format (<TOPIC>, <HOST>, <PID>, <DATETIME>, <REV> are replaced. "
        "<REV> is increased when file already exists)",
    )
    host_identifier: str = option(
        "host-identifier",
        "",
        STR,
        "value to output in log filename in place of hostname. <SHORT_HOST> and <HOSTNAME> "
        "are valid replacement tokens",
    )
    gzip_level: int = option(
        "gzip-level", 6, INT, "gzip compression level (1-9, 1=BestSpeed, 9=BestCompression)"
    )
    gzip: bool = option("gzip", False, BOOL, "gzip output files.")
    skip_empty_files: bool = option("skip-empty-files", False, BOOL, "skip writing empty files")
    topic_refresh: float = option(
        "topic-refresh", 60.0, DURATION, "how frequently the topic list should be refreshed"
    )
    topic_pattern: str = option(
        "topic-pattern", "", STR, "only log topics matching the following pattern"
    )
    rotate_size: int = option(
        "rotate-size", 0, INT, "rotate the file when it grows bigger than `rotate-size` bytes"
    )
    rotate_interval: float = option(
        "rotate-interval", 0.0, DURATION, "rotate the file every duration"
    )
    sync_interval: float = option(
        "sync-interval", 30.0, DURATION, "sync file to disk every duration"
    )

    @property
    def uses_rev(self) -> bool:
        """Go requires ``<REV>`` when files can collide: gzip, rotation or a work dir."""
        return (
            self.gzip
            or self.rotate_size > 0
            or self.rotate_interval > 0
            or self.work_dir != self.output_dir
        )


def validate(opts: Options) -> int:
    """Go's checks in Go's order, with its texts; returns the log level. Fills ``work_dir``."""
    try:
        level = lg.parse_level(opts.log_level)
    except ValueError:
        raise FatalError("--log-level is invalid") from None
    if opts.channel == "":
        raise FatalError("--channel is required")
    opts.check_http_client_timeouts()
    opts.check_sources(".")
    if not 1 <= opts.gzip_level <= 9:
        raise FatalError(f"invalid --gzip-level value ({opts.gzip_level}), should be 1-9")
    if not opts.topic and not opts.topic_pattern:
        raise FatalError("--topic or --topic-pattern required")
    if not opts.topic and not opts.lookupd_http_address:
        raise FatalError("--lookupd-http-address must be specified when no --topic specified")
    if opts.work_dir == "":
        opts.work_dir = opts.output_dir
    # Go finds these only when a topic's logger is created (and then idles); fail at once
    if opts.uses_rev and "<REV>" not in opts.filename_format:
        raise FatalError(REV_MISSING)
    if opts.topic_pattern:
        try:
            re.compile(opts.topic_pattern)
        except re.error as exc:
            raise FatalError(f"invalid --topic-pattern {opts.topic_pattern!r}: {exc}") from None
    if opts.sync_interval <= 0:  # Go's time.NewTicker panics on it
        raise FatalError("--sync-interval should be positive")
    for directory in dict.fromkeys((opts.work_dir, opts.output_dir)):
        check_directory(directory)
    return level


def check_directory(path: str) -> None:
    """Create the directory as Go would on the first file (mode 0770); it must be writable."""
    try:
        os.makedirs(path, 0o770, exist_ok=True)
    except OSError as exc:
        raise FatalError(f"unable to create dir: {exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise FatalError(f"unable to write to {path}: permission denied")
