"""The nsqd command line as a user runs it: flags, config file, signals, restart, log format."""

from __future__ import annotations

import http.client
import os
import platform
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsqpy.testing import start_nsqd

from ..raw_v2 import free_port, http_request, unique, wait_for, wait_until
from .conftest import connect

NSQD = [sys.executable, "-m", "nsqpy.nsqd"]
LOG_LINE = re.compile(
    r"^\[nsqd\] \d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}\.\d{6} (DEBUG|INFO|WARNING|ERROR|FATAL): "
)


def run_nsqd(*args: str, timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NSQD, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def ping(port: int, timeout: float = 0.2) -> int | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/ping")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


# --------------------------------------------------------------------------- one-shot commands


def test_version() -> None:
    result = run_nsqd("--version")
    assert result.returncode == 0
    assert result.stdout == f"nsqd v1.3.0 (built w/python{platform.python_version()})\n"


@pytest.mark.parametrize("spelling", ["-version", "--version=true"])
def test_version_spellings(spelling: str) -> None:
    result = run_nsqd(spelling)
    assert result.returncode == 0
    assert result.stdout.startswith("nsqd v1.3.0 (built w/python")


def test_help_exits_0_with_usage() -> None:
    result = run_nsqd("--help")
    assert result.returncode == 0
    assert "Usage of nsqd:" in result.stderr
    assert "-mem-queue-size" in result.stderr


def test_invalid_flag_exits_2() -> None:
    result = run_nsqd("--no-such-flag")
    assert result.returncode == 2
    assert result.stderr.startswith("flag provided but not defined: -no-such-flag\n")
    assert "Usage of nsqd:" in result.stderr


def test_invalid_flag_value_exits_2() -> None:
    result = run_nsqd("--mem-queue-size=lots")
    assert result.returncode == 2
    assert 'invalid value "lots" for flag -mem-queue-size: parse error' in result.stderr


@pytest.mark.parametrize(
    "flag,message",
    [
        ("--node-id=1024", "--node-id must be [0,1024)"),
        ("--max-deflate-level=10", "--max-deflate-level must be [1,9]"),
        ("--max-deflate-level=0", "--max-deflate-level must be [1,9]"),
        (
            "--e2e-processing-latency-percentile=1.5",
            "invalid E2E processing latency percentile: 1.5",
        ),
    ],
)
def test_startup_validation_errors(tmp_path: Path, flag: str, message: str) -> None:
    result = run_nsqd(
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        f"--data-path={tmp_path}",
        flag,
    )
    assert result.returncode != 0
    assert message in result.stderr


def test_tls_required_without_cert_is_a_startup_error(tmp_path: Path) -> None:
    result = run_nsqd(
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        f"--data-path={tmp_path}",
        "--tls-required=true",
        timeout=5.0,
    )
    assert result.returncode != 0
    assert "cannot require TLS client connections without TLS key and cert" in result.stderr


# --------------------------------------------------------------------------- config file

CONTRIB_STYLE_CONFIG = """\
## an nsqd config in the style of contrib/nsqd.cfg.example
log_level = "debug"
tcp_address = "0.0.0.0:4150"
http_address = "0.0.0.0:4151"
nsqlookupd_tcp_addresses = []
http_client_connect_timeout = "2s"
http_client_request_timeout = "5s"
mem_queue_size = 500
max_bytes_per_file = 104857600
sync_every = 2500
sync_timeout = "2s"
msg_timeout = "60s"
max_msg_timeout = "15m"
max_msg_size = 1024768
max_req_timeout = "1h"
max_body_size = 5123840
max_heartbeat_interval = "60s"
max_rdy_count = 2500
max_output_buffer_size = 65536
max_output_buffer_timeout = "1s"
statsd_prefix = "nsq.%s"
statsd_interval = "60s"
statsd_mem_stats = true
e2e_processing_latency_percentiles = [
    1.0,
    0.99,
    0.95
]
e2e_processing_latency_window_time = "10m"
tls_cert = ""
tls_key = ""
tls_required = false
tls_min_version = ""
deflate = true
max_deflate_level = 6
snappy = true
an_unknown_key_is_ignored = 1
id = 77
"""


def test_config_file_with_contrib_keys(tmp_path: Path) -> None:
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text(CONTRIB_STYLE_CONFIG)
    data = tmp_path / "data"
    data.mkdir()
    # start_nsqd's --tcp-address/--http-address flags beat the config's 0.0.0.0 addresses
    daemon = start_nsqd(data, f"--config={cfg}", "--mem-queue-size=7")
    try:
        host, _ = daemon.tcp_address
        assert host == "127.0.0.1"

        def config(name: str) -> bytes:
            resp = http_request(daemon, "GET", f"/config/{name}")
            assert resp.status == 200, (name, resp.body)
            return resp.body

        assert config("max_msg_size") == b"1024768"
        assert config("max_body_size") == b"5123840"
        assert config("max_output_buffer_timeout") == b"1000000000"
        assert config("max_msg_timeout") == b"900000000000"
        assert config("e2e_processing_latency_percentiles") == b"[1,0.99,0.95]"
        assert config("log_level") == b"1"
        assert config("id") == b"77"
        assert config("mem_queue_size") == b"7"  # the flag wins over the config file
        assert config("tcp_address") == b'"127.0.0.1:0"'
        info = http_request(daemon, "GET", "/info").json()
        assert info["max_output_buffer_timeout"] == 1_000_000_000
        with connect(daemon) as conn:
            conn.pub(unique(), b"x")
    finally:
        assert daemon.stop() == 0


def test_config_durations_as_integer_milliseconds(tmp_path: Path) -> None:
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text('msg_timeout = 1500\nmax_req_timeout = "90s"\n')
    daemon = start_nsqd(tmp_path, f"--config={cfg}")
    try:
        assert http_request(daemon, "GET", "/config/msg_timeout").body == b"1500000000"
        assert http_request(daemon, "GET", "/config/max_req_timeout").body == b"90000000000"
    finally:
        daemon.stop()


def test_missing_config_file_is_fatal(tmp_path: Path) -> None:
    result = run_nsqd(f"--config={tmp_path / 'absent.cfg'}", f"--data-path={tmp_path}")
    assert result.returncode != 0
    assert f"failed to load config file {tmp_path / 'absent.cfg'}" in result.stderr


def test_bad_config_value_is_fatal(tmp_path: Path) -> None:
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text('tls_required = "sometimes"\n')
    result = run_nsqd(f"--config={cfg}", f"--data-path={tmp_path}")
    assert result.returncode != 0


# --------------------------------------------------------------------------- lifecycle


def test_ping_answers_within_one_second_of_exec(tmp_path: Path) -> None:
    port = free_port()
    start = time.monotonic()
    proc = subprocess.Popen(
        [
            *NSQD,
            "--tcp-address=127.0.0.1:0",
            f"--http-address=127.0.0.1:{port}",
            f"--data-path={tmp_path}",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        status = wait_for(lambda: ping(port), lambda s: s is not None, 5.0, "a /ping answer")
        elapsed = time.monotonic() - start
        assert status == 200
        assert elapsed < 1.0, f"/ping first answered after {elapsed:.2f}s"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def test_sigterm_exits_0(tmp_path: Path) -> None:
    daemon = start_nsqd(tmp_path)
    with connect(daemon) as conn:
        conn.sub(unique(), "ch")  # a connected client must not block the shutdown
        start = time.monotonic()
        assert daemon.stop() == 0
        assert time.monotonic() - start < 5.0


def test_sigint_exits_0(tmp_path: Path) -> None:
    daemon = start_nsqd(tmp_path)
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGINT)
    assert daemon.proc.wait(10) == 0


def test_restart_on_the_same_ports_right_after_sigkill(tmp_path: Path) -> None:
    tcp_port, http_port = free_port(), free_port()
    flags = (f"--tcp-address=127.0.0.1:{tcp_port}", f"--http-address=127.0.0.1:{http_port}")
    daemon = start_nsqd(tmp_path, *flags)
    topic = unique()
    with connect(daemon) as conn:
        conn.sub(topic, "ch")  # an established connection leaves the port in use on the peer
        assert daemon.kill() == -signal.SIGKILL
    again = start_nsqd(tmp_path, *flags)  # same ports and same (flock'ed) data path
    try:
        assert again.tcp_address == ("127.0.0.1", tcp_port)
        assert again.http_address == ("127.0.0.1", http_port)
        assert ping(http_port, timeout=2.0) == 200
        with connect(again) as conn:
            conn.pub(topic, b"after restart")
    finally:
        assert again.stop() == 0


def test_data_path_is_locked(tmp_path: Path) -> None:
    daemon = start_nsqd(tmp_path)
    try:
        result = run_nsqd(
            "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={tmp_path}"
        )
        assert result.returncode != 0
        assert "failed to lock data-path" in result.stderr
        assert ping(daemon.http_port) == 200
    finally:
        daemon.stop()


def test_log_line_format(tmp_path: Path) -> None:
    daemon = start_nsqd(tmp_path)
    try:
        lines = daemon.log_lines
        tcp_port, http_port = daemon.tcp_port, daemon.http_port
    finally:
        daemon.stop()
    pattern = r"^\[nsqd\] \d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}\.\d{6} INFO: TCP: listening on "
    assert any(re.match(pattern + rf"127\.0\.0\.1:{tcp_port}$", line) for line in lines), lines
    http_pattern = pattern.replace("TCP", "HTTP") + rf"127\.0\.0\.1:{http_port}$"
    assert any(re.match(http_pattern, line) for line in lines), lines
    for line in lines:
        if line.startswith("[nsqd] "):
            assert LOG_LINE.match(line), line


def test_log_prefix_and_level_flags(tmp_path: Path) -> None:
    daemon = start_nsqd(tmp_path, "--log-prefix=[custom] ", "--log-level=debug")
    try:
        with connect(daemon) as conn:
            conn.pub(unique(), b"x")
        # the closed connection's last line: every line of its life has been logged
        wait_until(
            lambda: any("exiting ioloop" in line for line in daemon.log_lines),
            timeout=10.0,
            what="the connection's last log line",
        )
    finally:
        daemon.stop()
    assert any(line.startswith("[custom] ") and " INFO: " in line for line in daemon.log_lines)
    assert not any(line.startswith("[nsqd] ") for line in daemon.log_lines)


def test_log_level_error_hides_info(tmp_path: Path) -> None:
    # the helper learns ports from INFO lines, so read them from /info via a known HTTP port
    port = free_port()
    proc = subprocess.Popen(
        [
            *NSQD,
            "--tcp-address=127.0.0.1:0",
            f"--http-address=127.0.0.1:{port}",
            f"--data-path={tmp_path}",
            "--log-level=error",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: ping(port), lambda status: status == 200, 10.0, "nsqd to start")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert " INFO: " not in err
