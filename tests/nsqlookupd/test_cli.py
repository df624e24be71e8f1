"""The ``nsqlookupd`` command line: Go flag spellings, defaults, --version, --config TOML keys,
startup failure, signals and rebinding after SIGKILL. As in Go, an explicit flag wins over the
config file's key, which wins over the default."""

from __future__ import annotations

import platform
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nsqpy.internal import lg
from nsqpy.internal.flags import UsageError, resolve, specs
from nsqpy.nsqlookupd.options import HOSTNAME, Options
from nsqpy.testing import DaemonProcess, start_nsqlookupd

VERSION_LINE = f"nsqlookupd v1.3.0 (built w/python{platform.python_version()})"

CONTRIB_EXAMPLE = """\
## log verbosity level: debug, info, warn, error, or fatal
log_level = "info"

## <addr>:<port> to listen on for TCP clients
tcp_address = "0.0.0.0:4160"

## <addr>:<port> to listen on for HTTP clients
http_address = "0.0.0.0:4161"

## address that will be registered with lookupd (defaults to the OS hostname)
# broadcast_address = ""


## duration of time a producer will remain in the active list since its last ping
inactive_producer_timeout = "300s"

## duration of time a producer will remain tombstoned if registration remains
tombstone_lifetime = "45s"
"""


def run(*args: str, timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nsqpy.nsqlookupd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --------------------------------------------------------------------------- options


def test_flag_set_is_gos() -> None:
    assert sorted(spec.flag for spec in specs(Options)) == [
        "broadcast-address",
        "config",
        "http-address",
        "inactive-producer-timeout",
        "log-level",
        "log-prefix",
        "tcp-address",
        "tombstone-lifetime",
        "verbose",
        "version",
    ]


def test_defaults() -> None:
    opts, _ = resolve(Options, [])
    assert opts.tcp_address == "0.0.0.0:4160"
    assert opts.http_address == "0.0.0.0:4161"
    assert opts.broadcast_address == HOSTNAME == socket.gethostname()
    assert opts.inactive_producer_timeout == 300.0
    assert opts.tombstone_lifetime == 45.0
    assert opts.log_level == lg.INFO
    assert opts.log_prefix == "[nsqlookupd] "


def test_go_flag_spellings() -> None:
    opts, _ = resolve(
        Options,
        [
            "-tcp-address",
            "127.0.0.1:1",
            "--http-address=127.0.0.1:2",
            "-broadcast-address=b.example",
            "--inactive-producer-timeout",
            "200ms",
            "-tombstone-lifetime=1m30s",
            "--log-level=debug",
            "-log-prefix",
            "[x] ",
            "--verbose",
        ],
    )
    assert (opts.tcp_address, opts.http_address) == ("127.0.0.1:1", "127.0.0.1:2")
    assert opts.broadcast_address == "b.example"
    assert opts.inactive_producer_timeout == pytest.approx(0.2)
    assert opts.tombstone_lifetime == 90.0
    assert opts.log_level == lg.DEBUG
    assert opts.log_prefix == "[x] "
    assert opts.verbose is True


def test_config_file_keys(tmp_path: Path) -> None:
    config = tmp_path / "nsqlookupd.cfg"
    config.write_text(CONTRIB_EXAMPLE)
    opts, _ = resolve(Options, [f"--config={config}"])
    assert (opts.tcp_address, opts.http_address) == ("0.0.0.0:4160", "0.0.0.0:4161")
    assert (opts.inactive_producer_timeout, opts.tombstone_lifetime) == (300.0, 45.0)

    config.write_text(
        'log_level = "debug"\n'
        'log_prefix = "[cfg] "\n'
        'broadcast_address = "cfg.example"\n'
        'tcp_address = "127.0.0.1:7"\n'
        "inactive_producer_timeout = 250\n"  # integers are milliseconds
        'tombstone_lifetime = "50ms"\n'
    )
    opts, _ = resolve(Options, [f"--config={config}", "--tcp-address=127.0.0.1:8"])
    assert opts.log_level == lg.DEBUG  # Go's TestConfigFlagParsing
    assert opts.log_prefix == "[cfg] "
    assert opts.broadcast_address == "cfg.example"
    assert opts.tcp_address == "127.0.0.1:8"  # an explicit flag beats the file
    assert opts.inactive_producer_timeout == pytest.approx(0.25)
    assert opts.tombstone_lifetime == pytest.approx(0.05)


def test_bad_config_values(tmp_path: Path) -> None:
    config = tmp_path / "bad.cfg"
    config.write_text('log_level = "loud"\n')
    with pytest.raises(UsageError):
        resolve(Options, [f"--config={config}"])
    config.write_text('tombstone_lifetime = "soon"\n')
    with pytest.raises(UsageError):
        resolve(Options, [f"--config={config}"])


# --------------------------------------------------------------------------- the command


@pytest.mark.parametrize("flag", ["--version", "-version", "--version=true"])
def test_version(flag: str) -> None:
    result = run(flag)
    assert (result.returncode, result.stdout) == (0, VERSION_LINE + "\n")


def test_console_script() -> None:
    script = Path(sys.executable).parent / "nsqlookupd"
    result = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=15, check=False
    )
    assert (result.returncode, result.stdout) == (0, VERSION_LINE + "\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nope"], "flag provided but not defined: -nope"),
        (["--tombstone-lifetime=soon"], 'invalid value "soon" for flag -tombstone-lifetime'),
        (["--log-level=loud"], 'invalid value "loud" for flag -log-level'),
        (["--tcp-address"], "flag needs an argument: -tcp-address"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Usage of nsqlookupd" in result.stderr


def test_config_reaches_the_daemon(tmp_path: Path) -> None:
    config = tmp_path / "nsqlookupd.cfg"
    config.write_text(
        'tcp_address = "127.0.0.1:0"\n'
        'http_address = "127.0.0.1:0"\n'
        'broadcast_address = "from-config"\n'
        'log_prefix = "[cfg] "\n'
    )
    with DaemonProcess("nsqpy.nsqlookupd", [f"--config={config}"], ["TCP", "HTTP"]).start() as proc:
        with socket.create_connection(proc.tcp_address, timeout=5) as sock:
            body = b'{"broadcast_address":"a","http_port":1,"tcp_port":2,"version":"v"}'
            sock.sendall(b"  V1IDENTIFY\n" + len(body).to_bytes(4, "big") + body)
            reply = recv_reply(sock)
        assert b'"broadcast_address":"from-config"' in reply
        assert proc.log_lines[0].startswith("[cfg] ")
        assert VERSION_LINE in proc.log_lines[0]


def recv_reply(sock: socket.socket) -> bytes:
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        chunk = sock.recv(4096)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data[4:]


def test_listen_failure_exits_1() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run(f"--tcp-address=127.0.0.1:{port}", "--http-address=127.0.0.1:0")
    assert result.returncode == 1
    assert "FATAL: failed to instantiate nsqlookupd" in result.stderr
    assert f"listen (127.0.0.1:{port}) failed" in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signals_stop_cleanly(sig: signal.Signals) -> None:
    proc = start_nsqlookupd()
    assert proc.proc is not None
    proc.proc.send_signal(sig)
    assert proc.proc.wait(10) == 0
    assert any("TCP: closing" in line for line in proc.log_lines)
    assert any("HTTP: closing" in line for line in proc.log_lines)


def test_rebinds_at_once_after_sigkill() -> None:
    proc = start_nsqlookupd()
    tcp, http = proc.tcp_port, proc.http_port
    try:
        # an established connection leaves the killed side's socket in TIME_WAIT
        with socket.create_connection(proc.tcp_address, timeout=5) as sock:
            sock.sendall(b"  V1PING\n")
            assert recv_reply(sock) == b"OK"
            proc.kill()
        proc.args += [f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}"]
        proc.start()
        assert (proc.tcp_port, proc.http_port) == (tcp, http)
        with socket.create_connection(proc.tcp_address, timeout=5) as sock:
            sock.sendall(b"  V1PING\n")
            assert recv_reply(sock) == b"OK"
    finally:
        proc.stop()
