"""The new nsqd flags: in --help, as config-file keys, readable at /config, validated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nsqpy.internal.flags import resolve
from nsqpy.nsqd.options import Options
from nsqpy.testing import DaemonProcess

from ..raw_v2 import http_request
from .support import launch

NEW_FLAGS = {
    "metrics": "metrics",
    "metrics-exclude-ephemeral": "metrics_exclude_ephemeral",
    "max-attempts": "max_attempts",
    "dead-letter-topic-suffix": "dead_letter_topic_suffix",
    "enable-inspect": "enable_inspect",
    "drain-timeout": "drain_timeout",
    "max-queue-bytes": "max_queue_bytes",
    "queue-full-policy": "queue_full_policy",
    "max-defer-timeout": "max_defer_timeout",
    "replica-peer": "replica_peers",
    "replica-acks": "replica_acks",
    "replica-timeout": "replica_timeout",
    "replica-max-lag": "replica_max_lag",
}


def nsqd_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nsqpy.nsqd", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_every_new_flag_is_in_help() -> None:
    result = nsqd_command("--help")
    text = result.stdout + result.stderr
    for flag in NEW_FLAGS:
        assert f"  -{flag}" in text, flag


def test_config_file_keys_and_defaults(tmp_path: Path) -> None:
    defaults, _ = resolve(Options, [])
    assert defaults.metrics is True  # additive route
    assert defaults.max_attempts == 0 and defaults.enable_inspect is False
    assert defaults.drain_timeout == 0 and defaults.metrics_exclude_ephemeral is False
    assert (defaults.max_queue_bytes, defaults.queue_full_policy) == (0, "refuse")
    assert defaults.max_defer_timeout == 0
    config = tmp_path / "nsqd.cfg"
    config.write_text(
        "metrics = false\nmetrics_exclude_ephemeral = true\nmax_attempts = 7\n"
        'dead_letter_topic_suffix = "_dlq"\nenable_inspect = true\ndrain_timeout = "30s"\n'
        'max_queue_bytes = 1048576\nqueue_full_policy = "drop-oldest"\nmax_defer_timeout = "2h"\n'
    )
    opts, _ = resolve(Options, [f"--config={config}", "--max-attempts=9"])
    assert opts.metrics is False and opts.metrics_exclude_ephemeral is True
    assert opts.max_attempts == 9  # the flag wins over the file
    assert (opts.max_queue_bytes, opts.queue_full_policy) == (1048576, "drop-oldest")
    assert opts.max_defer_timeout == 7200.0
    assert opts.dead_letter_topic_suffix == "_dlq"
    assert opts.enable_inspect is True and opts.drain_timeout == 30.0


def test_values_at_config_route(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    nsqd = launch(daemons, tmp_path, "--max-attempts=4", "--drain-timeout=1m")
    assert http_request(nsqd, "GET", "/config/max_attempts").json() == 4
    assert http_request(nsqd, "GET", "/config/dead_letter_topic_suffix").json() == ".dead"
    assert http_request(nsqd, "GET", "/config/drain_timeout").status == 200


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--max-attempts=70000", "--max-attempts must be [0,65535]"),
        ("--dead-letter-topic-suffix=a/b", "--dead-letter-topic-suffix must be"),
        ("--max-queue-bytes=-1", "--max-queue-bytes must not be negative"),
        (
            "--queue-full-policy=drop-newest",
            "--queue-full-policy must be 'refuse' or 'drop-oldest'",
        ),
        ("--max-defer-timeout=-1s", "--max-defer-timeout must not be negative"),
    ],
)
def test_bad_values_refuse_to_start(tmp_path: Path, flag: str, message: str) -> None:
    result = nsqd_command(
        "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={tmp_path}", flag
    )
    assert result.returncode == 1
    assert message in result.stderr + result.stdout
