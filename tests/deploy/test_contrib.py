"""contrib/: the three ``*.cfg.example`` files and the systemd units, each run as written.

Only what cannot be used as written in a test is replaced: listen addresses (free loopback
ports instead of 0.0.0.0:415x), the data path (a temp dir), the peer addresses (the test's own
nsqlookupd) and the install locations (/usr/local/bin -> this venv's scripts, /etc/nsq/X.cfg ->
contrib/X.cfg.example). Everything else (every key of the examples, every flag of ExecStart)
is what a user gets.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import tomllib
from pathlib import Path

import pytest

from nsqpy.internal.durations import parse_duration
from nsqpy.internal.flags import coerce_config_value, resolve, specs
from nsqpy.nsqadmin.options import Options as AdminOptions
from nsqpy.nsqd.options import Options as NsqdOptions
from nsqpy.nsqlookupd.options import Options as LookupdOptions
from nsqpy.testing import DaemonProcess

from ..raw_v2 import NsqConn, wait_until
from .support import BIN, CONTRIB, EXPECT, UNITS, CommandDaemon, get, get_json, post

OPTIONS = {"nsqd": NsqdOptions, "nsqlookupd": LookupdOptions, "nsqadmin": AdminOptions}
#: flags that are not configuration: command-line only, deprecated, or for development
NOT_CONFIG = {"version", "config", "verbose", "worker_id", "dev_static_dir"}
_KEY = re.compile(r"^#?\s*([a-z0-9_]+)\s*=", re.MULTILINE)


def example(daemon: str) -> Path:
    return CONTRIB / f"{daemon}.cfg.example"


def uncommented(text: str) -> str:
    """The example with every commented-out setting switched on (``## `` lines stay prose)."""
    return "\n".join(
        line[2:] if line.startswith("# ") and not line.startswith("## ") else line
        for line in text.splitlines()
    )


@pytest.mark.parametrize("daemon", sorted(OPTIONS))
def test_config_example_names_every_option_with_a_valid_value(daemon: str, tmp_path: Path) -> None:
    """Every option of the daemon is in its example (set, or commented out with its help), and
    each value, once uncommented, is one nsqpy accepts: no typo'd key, no unparsable value."""
    text = example(daemon).read_text()
    options = {s.cfg: s for s in specs(OPTIONS[daemon]) if s.cfg not in NOT_CONFIG}
    written = _KEY.findall(text)
    assert len(written) == len(set(written)), "a key appears twice"
    missing = sorted(set(options) - set(written))
    assert not missing, f"add these options to {example(daemon).name}: {missing}"
    assert sorted(set(written) - set(options)) == [], "keys nsqpy does not know"
    for key in written:  # each documented by a "## ..." comment just above it
        assert re.search(rf"## [^\n]+\n(#[^\n]*\n)*#? ?{key}\s*=", text), f"{key} has no comment"

    everything = tomllib.loads(uncommented(text))
    assert sorted(everything) == sorted(written)
    for key, value in everything.items():
        coerce_config_value(options[key].kind, value)  # raises on a bad value
    path = tmp_path / "all.cfg"
    path.write_text(uncommented(text))
    resolve(OPTIONS[daemon], [f"--config={path}"])


def test_config_examples_run_a_cluster(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    """nsqlookupd, nsqd and nsqadmin each started with ``--config=<example>``: they find each
    other, and a value the example sets (nsqd's max_output_buffer_timeout = "1s", Go's example
    value, not the 30s default) is in force."""
    loopback = ["--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1"]
    lookupd = CommandDaemon(
        [
            str(BIN / "nsqlookupd"),
            f"--config={example('nsqlookupd')}",
            *loopback,
            "--tcp-address=127.0.0.1:0",
        ],
        EXPECT["nsqlookupd"],
    )
    daemons.append(lookupd.start())
    nsqd = CommandDaemon(
        [
            str(BIN / "nsqd"),
            f"--config={example('nsqd')}",
            *loopback,
            "--tcp-address=127.0.0.1:0",
            f"--data-path={tmp_path}",
            f"--lookupd-tcp-address=127.0.0.1:{lookupd.tcp_port}",
        ],
        EXPECT["nsqd"],
    )
    daemons.append(nsqd.start())
    admin = CommandDaemon(
        [
            str(BIN / "nsqadmin"),
            f"--config={example('nsqadmin')}",
            "--http-address=127.0.0.1:0",
            f"--lookupd-http-address=127.0.0.1:{lookupd.http_port}",
        ],
        EXPECT["nsqadmin"],
    )
    daemons.append(admin.start())

    info = get_json(nsqd, "/info")
    assert info["max_output_buffer_timeout"] == 1_000_000_000
    assert get_json(nsqd, "/stats?format=json")["topics"] == []
    post(nsqd, "/topic/create?topic=from_examples")
    wait_until(
        lambda: get(lookupd, "/lookup?topic=from_examples")[0] == 200,
        what="nsqd registered",
        timeout=15.0,
    )
    assert get_json(admin, "/api/topics")["topics"] == ["from_examples"]
    for daemon in (lookupd, nsqd, admin):
        assert get(daemon, "/ping") == (200, b"OK")


# --------------------------------------------------------------------------- systemd


def unit_service(path: Path) -> dict[str, str]:
    """The [Service] section of a unit file (a key given twice keeps its last value)."""
    section, found = "", {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service":
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


def installed_here(daemon: str, text: str) -> str:
    """A unit as it would run from this checkout's venv."""
    return text.replace(f"/usr/local/bin/{daemon}", str(BIN / daemon))


@pytest.mark.systemd
@pytest.mark.parametrize("daemon", sorted(OPTIONS))
def test_systemd_unit_passes_systemd_analyze_verify(daemon: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: `make systemd` installs Debian's systemd"
    unit = tmp_path / f"{daemon}.service"
    unit.write_text(installed_here(daemon, (UNITS / f"{daemon}.service").read_text()))
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    # systemd-analyze exits 0 even for unknown keys or bad values: it only warns. Any output
    # is a defect in the unit.
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def exec_start(daemon: str, data_path: Path) -> list[str]:
    argv = shlex.split(unit_service(UNITS / f"{daemon}.service")["ExecStart"])
    assert argv[0] == f"/usr/local/bin/{daemon}"
    replaced = [str(BIN / daemon)]
    for arg in argv[1:]:
        arg = arg.replace(f"/etc/nsq/{daemon}.cfg", str(CONTRIB / f"{daemon}.cfg.example"))
        replaced.append(arg.replace("/var/lib/nsq", str(data_path)))
    return replaced


def test_systemd_units_run_as_written_and_nsqd_drains_on_stop(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    """Each unit's ExecStart starts its daemon; nsqd's KillSignal starts a drain that delivers
    what it holds and exits 0, and its TimeoutStopSec leaves room for the whole drain."""
    services = {d: unit_service(UNITS / f"{d}.service") for d in OPTIONS}
    for daemon, service in services.items():
        assert service["KillSignal"] == "SIGTERM", daemon
        assert service["Restart"] == "on-failure", daemon
    nsqd_argv = exec_start("nsqd", tmp_path)
    drain = next(a for a in nsqd_argv if a.startswith("--drain-timeout="))
    drain_seconds = parse_duration(drain.partition("=")[2])
    assert drain_seconds > 0
    assert parse_duration(services["nsqd"]["TimeoutStopSec"]) >= drain_seconds + 15

    lookupd = CommandDaemon(
        [
            *exec_start("nsqlookupd", tmp_path),
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
        ],
        EXPECT["nsqlookupd"],
    )
    daemons.append(lookupd.start())
    peers = [f"--lookupd-tcp-address=127.0.0.1:{lookupd.tcp_port}"]
    nsqd = CommandDaemon(
        [*nsqd_argv, "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", *peers],
        EXPECT["nsqd"],
    )
    daemons.append(nsqd.start())
    admin = CommandDaemon(
        [
            *exec_start("nsqadmin", tmp_path),
            "--http-address=127.0.0.1:0",
            f"--lookupd-http-address=127.0.0.1:{lookupd.http_port}",
        ],
        EXPECT["nsqadmin"],
    )
    daemons.append(admin.start())
    assert get(admin, "/ping") == (200, b"OK")

    publisher = NsqConn(nsqd.tcp_address)
    publisher.mpub("units", [b"one", b"two"])
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub("units", "work")
    assert nsqd.proc is not None
    nsqd.proc.send_signal(getattr(signal, services["nsqd"]["KillSignal"]))
    wait_until(lambda: get(nsqd, "/ping") == (503, b"DRAINING"), what="draining", timeout=15.0)
    consumer.rdy(2)
    for _ in range(2):
        consumer.fin(consumer.expect_message().id)
    assert nsqd.proc.wait(drain_seconds) == 0
    assert "NSQ: drained - all channels empty" in nsqd.log


def test_contrib_keys_match_what_the_units_read() -> None:
    """The units read /etc/nsq/<daemon>.cfg: the file the docs tell users to copy there."""
    for daemon in OPTIONS:
        argv = shlex.split(unit_service(UNITS / f"{daemon}.service")["ExecStart"])
        assert f"--config=/etc/nsq/{daemon}.cfg" in argv
        assert example(daemon).exists()
