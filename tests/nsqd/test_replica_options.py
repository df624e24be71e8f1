"""nsqd's --replica-peer, --replica-acks and --replica-timeout: in --help, as config-file keys,
at /config, and checked at start-up (a bad value is fatal, good values start nsqd)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from nsqpy.internal.flags import resolve
from nsqpy.nsqd.options import (
    Options,
    ReplicaOptionError,
    parse_replica_peer,
    validate_replica_options,
)
from nsqpy.testing import DaemonProcess

from ..raw_v2 import NsqConn, http_request, pub_cmd
from .nsqd_storage_support import launch, run_nsqd_to_exit

FATAL = "FATAL: failed to instantiate nsqd - "


def nsqd_usage() -> str:
    result = subprocess.run(
        [sys.executable, "-m", "nsqpy.nsqd", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0
    return result.stderr


def test_help_lists_the_flags_with_their_defaults() -> None:
    lines = nsqd_usage().splitlines()
    assert "  -replica-peer HOST:PORT" in lines
    help_of = {line.strip(): lines[i + 1] for i, line in enumerate(lines) if line.startswith("  -")}
    assert help_of["-replica-acks value"].endswith("(default 2)")
    assert help_of["-replica-timeout value"].endswith("(default 10s)")
    assert help_of["-replica-max-lag value"].endswith("(default 268435456)")
    assert "may be given multiple times" in help_of["-replica-peer HOST:PORT"]
    assert "(default" not in help_of["-replica-peer HOST:PORT"]  # Go leaves an empty list out
    flags = [line.split()[0] for line in lines if line.startswith("  -")]
    assert flags == sorted(flags)  # Go's PrintDefaults order holds with the new flags


def test_defaults_pass_the_checks_and_name_no_peer() -> None:
    opts, _ = resolve(Options, [])
    assert (opts.replica_peers, opts.replica_acks, opts.replica_timeout) == ([], 2, 10.0)
    assert validate_replica_options(opts) == []


def test_config_file_keys_and_flag_precedence(tmp_path: Path) -> None:
    config = tmp_path / "nsqd.cfg"
    config.write_text(
        'replica_peers = ["10.0.0.2:4150", "[fd00::3]:4150"]\n'
        'replica_acks = 3\nreplica_timeout = "2500ms"\n'
    )
    opts, _ = resolve(Options, [f"--config={config}"])
    assert opts.replica_peers == ["10.0.0.2:4150", "[fd00::3]:4150"]
    assert (opts.replica_acks, opts.replica_timeout) == (3, 2.5)
    assert validate_replica_options(opts) == [("10.0.0.2", 4150), ("fd00::3", 4150)]

    flags = ["--replica-peer=h1:4150", "--replica-peer", "h2:4150", "--replica-acks=1"]
    opts, _ = resolve(Options, [f"--config={config}", *flags])
    assert opts.replica_peers == ["h1:4150", "h2:4150"]  # repeated flags append, and win
    assert (opts.replica_acks, opts.replica_timeout) == (1, 2.5)


def test_config_file_timeout_as_integer_is_milliseconds(tmp_path: Path) -> None:
    config = tmp_path / "nsqd.cfg"
    config.write_text('replica_peers = "a:4150,b:4150"\nreplica_timeout = 1500\n')
    opts, _ = resolve(Options, [f"--config={config}"])
    assert opts.replica_peers == ["a:4150", "b:4150"]  # go-options' comma-separated string
    assert opts.replica_timeout == 1.5


@pytest.mark.parametrize(
    ("address", "peer"),
    [
        ("10.0.0.2:4150", ("10.0.0.2", 4150)),
        ("NSQD-2.Example.COM:4150", ("nsqd-2.example.com", 4150)),
        ("[::1]:4150", ("::1", 4150)),
        ("[0:0::0:1]:4150", ("::1", 4150)),
        ("[fe80::1%eth0]:4150", ("fe80::1%eth0", 4150)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_peer_addresses_that_parse(address: str, peer: tuple[str, int]) -> None:
    assert parse_replica_peer(address) == peer


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("10.0.0.2", "missing port in address"),
        ("::1:4150", "too many colons in address"),
        ("[::1:4150", "missing ']' in address"),
        ("[::1]", "missing port in address"),
        ("[10.0.0.2]:4150", "not an IPv6 address in brackets"),
        (":4150", "missing host"),
        ("a b:4150", "bad host"),
        ("a:0", "port must be [1,65535]"),
        ("a:65536", "port must be [1,65535]"),
        ("a:http", "port must be [1,65535]"),
    ],
)
def test_peer_addresses_that_do_not(address: str, reason: str) -> None:
    with pytest.raises(ReplicaOptionError) as caught:
        parse_replica_peer(address)
    message = f'--replica-peer must be HOST:PORT or [IPv6]:PORT, not "{address}" ({reason})'
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--replica-peer=10.0.0.2"],
            '--replica-peer must be HOST:PORT or [IPv6]:PORT, not "10.0.0.2" '
            "(missing port in address)",
        ),
        (
            ["--replica-peer=::1:4150"],
            '--replica-peer must be HOST:PORT or [IPv6]:PORT, not "::1:4150" '
            "(too many colons in address)",
        ),
        (
            ["--replica-peer=127.0.0.1:4150", "--replica-peer=127.0.0.1:4150"],
            '--replica-peer "127.0.0.1:4150" is given more than once',
        ),
        (
            ["--replica-peer=[::1]:4150", "--replica-peer=[0::1]:4150"],
            '--replica-peer "[0::1]:4150" is the same peer as "[::1]:4150"',
        ),
        (
            ["--replica-peer=127.0.0.1:4150", "--replica-acks=3"],
            "--replica-acks must be [1,2] (this node and its --replica-peer)",
        ),
        (
            ["--replica-peer=127.0.0.1:4150", "--replica-acks=0"],
            "--replica-acks must be [1,2] (this node and its --replica-peer)",
        ),
        (["--replica-acks=-1"], "--replica-acks must be at least 1"),
        (["--replica-timeout=0s"], "--replica-timeout must be greater than 0"),
        (["--replica-max-lag=0"], "--replica-max-lag must be at least 1"),
        (
            ["--replica-peer=127.0.0.1:4150", "--replica-timeout=-5s"],
            "--replica-timeout must be greater than 0",
        ),
    ],
)
def test_bad_values_are_fatal(tmp_path: Path, args: list[str], message: str) -> None:
    code, stderr = run_nsqd_to_exit(tmp_path, *args)
    assert code == 1
    # one fatal line, Go's log format, before anything starts or listens
    assert re.fullmatch(rf"\[nsqd\] \S+ \S+ {re.escape(FATAL + message)}\n", stderr), stderr


def test_a_bad_value_in_the_config_file_is_fatal_too(tmp_path: Path) -> None:
    config = tmp_path / "nsqd.cfg"
    config.write_text('replica_peers = ["127.0.0.1:4150", "127.0.0.1:4151"]\nreplica_acks = 4\n')
    code, stderr = run_nsqd_to_exit(tmp_path, f"--config={config}")
    assert code == 1
    assert f"{FATAL}--replica-acks must be [1,3] (this node and its --replica-peer)" in stderr


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--replica-acks", "two"), ("--replica-timeout", "10"), ("--replica-timeout", "soon")],
)
def test_unparsable_values_are_usage_errors(tmp_path: Path, flag: str, value: str) -> None:
    code, stderr = run_nsqd_to_exit(tmp_path, f"{flag}={value}")
    assert code == 2  # Go's flag package: the value does not parse, usage follows
    assert stderr.startswith(f'invalid value "{value}" for flag -{flag[2:]}: parse error\n')
    assert "Usage of nsqd:" in stderr


def test_good_values_start_nsqd_and_show_at_config(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    nsqd = launch(
        daemons,
        tmp_path,
        "--replica-peer=127.0.0.1:4150",
        "--replica-peer=[::1]:4150",
        "--replica-acks=3",
        "--replica-timeout=2s",
    )
    assert http_request(nsqd, "GET", "/config/replica_peers").json() == [
        "127.0.0.1:4150",
        "[::1]:4150",
    ]
    assert http_request(nsqd, "GET", "/config/replica_acks").json() == 3
    assert http_request(nsqd, "GET", "/config/replica_timeout").json() == 2_000_000_000
    conn = NsqConn(nsqd.tcp_address)
    try:  # it serves clients; with no peer running, a publish is refused, not downgraded
        conn.send(pub_cmd("replica_options", b"hello"))
        conn.expect_error("E_PUB_FAILED PUB failed replicas 1 < 3")
    finally:
        conn.close()


def test_defaults_start_nsqd_with_no_peer_at_config(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    """Without --replica-peer, --replica-acks has no upper bound to meet: 5 starts."""
    nsqd = launch(daemons, tmp_path, "--replica-acks=5")
    assert http_request(nsqd, "GET", "/config/replica_peers").json() == []
    assert http_request(nsqd, "GET", "/config/replica_acks").json() == 5
    assert http_request(nsqd, "GET", "/config/replica_timeout").json() == 10_000_000_000
