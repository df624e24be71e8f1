"""nsq_to_file as a process against real nsqd/nsqlookupd: Go's file names and bytes, rotation,
gzip members, <REV>, no overwrite, discovery, signals, and Go's flag errors."""

from __future__ import annotations

import datetime as dt
import gzip
import os
import signal
import socket
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from nsqpy import NSQ_VERSION
from nsqpy.apps.nsq_to_file.strftime import go_format, go_layout, strftime
from nsqpy.testing import DaemonProcess

from ..raw_v2 import unique, wait_until
from .conftest import (
    ToolProcess,
    channel_stats,
    fatal_line,
    http,
    http_post,
    publish,
    run_tool,
    run_tool_fatal,
    tcp,
)

SHORT_HOST = socket.gethostname().split(".")[0]
#: Go's gzip.NewWriterLevel header at the default level: no name, mtime 0, XFL 0, OS 255
GO_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def hour_stamps() -> set[str]:
    """The default <DATETIME> now, a moment before and a moment later (a test may straddle
    an hour, on either side of the call)."""
    now = time.time()
    return {time.strftime("%Y-%m-%d_%H", time.localtime(t)) for t in (now - 120, now, now + 120)}


def archived(nsqd: DaemonProcess, topic: str, channel: str = "nsq_to_file") -> bool:
    """Every message of the channel FINished (so synced to disk)."""
    stats = channel_stats(nsqd, topic, channel)
    return stats is not None and stats["depth"] == 0 and stats["in_flight_count"] == 0


def files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def gzip_members(data: bytes) -> list[bytes]:
    """Each member's header and decompressed payload; raises if any member is damaged."""
    members = []
    while data:
        assert data.startswith(GO_GZIP_HEADER), data[:10]
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        payload = inflater.decompress(data) + inflater.flush()
        assert inflater.eof, "truncated gzip member"
        members.append(payload)
        data = inflater.unused_data
    return members


def start_archiver(
    tool: Callable[..., ToolProcess], nsqd: DaemonProcess, topic: str, *args: str
) -> ToolProcess:
    archiver: ToolProcess = tool(
        "nsq_to_file", f"--topic={topic}", f"--nsqd-tcp-address={tcp(nsqd)}", *args
    )
    archiver.wait_for_stderr(b"connected and subscribed")
    return archiver


def stop(archiver: ToolProcess) -> None:
    assert archiver.signal(signal.SIGTERM) == 0, archiver.stderr.decode()
    assert b"Traceback" not in archiver.stderr


# ---------------------------------------------------------------------- output


@pytest.mark.slow
def test_plain_file_holds_each_body_and_a_newline(
    nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
    tmp_path: Path,
) -> None:
    topic = unique("plain")
    bodies = [b"first", b"with\rcarriage", b"\x00\xff binary", "ünïcode".encode(), b"last"]
    publish(nsqd, topic, *bodies)
    archiver = start_archiver(tool, nsqd, topic, f"--output-dir={tmp_path}")
    # nsq_to_file FINs what it has synced: with no --sync-interval, after its default 30 s
    wait_until(lambda: archived(nsqd, topic), what="archived", timeout=60.0)
    stop(archiver)
    # one file, or two when the run straddles an hour (the default <DATETIME> is the hour)
    paths = files(tmp_path)
    assert 1 <= len(paths) <= 2, paths
    for path in paths:
        # Go: <TOPIC>.<HOST><REV>.<DATETIME>.log with <REV> dropped (no gzip, rotation, work dir)
        assert path.name in {f"{topic}.{SHORT_HOST}.{stamp}.log" for stamp in hour_stamps()}
    assert b"".join(p.read_bytes() for p in paths) == b"".join(body + b"\n" for body in bodies)
    log = archiver.stderr.decode()
    assert "[nsq_to_file] " in log and f"INFO: [{topic}/nsq_to_file] opening {paths[0]}" in log
    assert f"[{topic}/nsq_to_file] syncing " in log


def test_host_identifier_and_pid_tokens(
    nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
    tmp_path: Path,
) -> None:
    topic = unique("tokens")
    publish(nsqd, topic, b"named")
    archiver = start_archiver(
        tool,
        nsqd,
        topic,
        f"--output-dir={tmp_path}",
        "--filename-format=<TOPIC>/<HOST>.<PID>.log",
        "--host-identifier=box-<SHORT_HOST>-<HOSTNAME>",
    )
    wait_until(lambda: archived(nsqd, topic), what="archived", timeout=30.0)
    stop(archiver)
    [path] = files(tmp_path)
    expected = f"{topic}/box-{SHORT_HOST}-{socket.gethostname()}.{archiver.proc.pid}.log"
    assert path.relative_to(tmp_path).as_posix() == expected
    assert path.read_bytes() == b"named\n"


def test_appends_to_an_existing_file_and_repairs_a_torn_last_line(
    nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
    tmp_path: Path,
) -> None:
    topic = unique("append")
    fmt = "<TOPIC>.log"
    (tmp_path / f"{topic}.log").write_bytes(b"old\ntorn rec")  # a run killed mid-write
    publish(nsqd, topic, b"new")
    archiver = start_archiver(
        tool, nsqd, topic, f"--output-dir={tmp_path}", f"--filename-format={fmt}"
    )
    wait_until(lambda: archived(nsqd, topic), what="archived", timeout=30.0)
    stop(archiver)
    assert (tmp_path / f"{topic}.log").read_bytes() == b"old\ntorn rec\nnew\n"


def test_gzip_members_one_per_sync(
    nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
    tmp_path: Path,
) -> None:
    topic = unique("gz")
    first = [b"batch one %d" % i for i in range(50)]
    second = [b"batch two %d" % i for i in range(50)]
    http_post(nsqd, "/mpub", b"\n".join(first), topic=topic)
    # a yearly file name, so that the run cannot straddle a rotation (the default is hourly)
    archiver = start_archiver(
        tool,
        nsqd,
        topic,
        f"--output-dir={tmp_path}",
        "--gzip",
        "--sync-interval=200ms",
        "--datetime-format=%Y",
    )
    wait_until(lambda: archived(nsqd, topic), what="first batch archived", timeout=30.0)
    http_post(nsqd, "/mpub", b"\n".join(second), topic=topic)
    wait_until(
        lambda: (
            (channel_stats(nsqd, topic, "nsq_to_file") or {}).get("message_count") == 100
            and archived(nsqd, topic)
        ),
        what="second batch archived",
        timeout=30.0,
    )
    stop(archiver)
    [path] = files(tmp_path)
    assert path.name == f"{topic}.{SHORT_HOST}-000000.{time.strftime('%Y')}.log.gz"
    data = path.read_bytes()
    members = gzip_members(data)
    assert len(members) >= 3  # at least one per batch, then the closing (empty) member
    assert members[-1] == b""  # Close() ends the last member, as Go's gzip.Writer.Close
    assert b"".join(members) == b"".join(body + b"\n" for body in first + second)
    assert gzip.decompress(data) == b"".join(members)  # one stream for gzip -d / zcat


def test_rotate_size_with_rev_in_subdirectories(
    nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
    tmp_path: Path,
) -> None:
    """Same names and split points as Go's binary for the same input (checked side by side):
    a message goes to a new file when the current one already holds more than --rotate-size."""
    topic = unique("size")
    bodies = [b"message number %d" % i for i in range(120)]
    http_post(nsqd, "/mpub", b"\n".join(bodies), topic=topic)
    archiver = start_archiver(
        tool,
        nsqd,
        topic,
        f"--output-dir={tmp_path}",
        "--rotate-size=1000",
        "--filename-format=<TOPIC>/<HOST><REV>.log",
        "--max-in-flight=50",
        "--sync-interval=200ms",
    )
    wait_until(lambda: archived(nsqd, topic), what="archived", timeout=30.0)
    stop(archiver)
    expected: list[bytes] = []
    for body in bodies:
        if not expected or len(expected[-1]) > 1000:
            expected.append(b"")
        expected[-1] += body + b"\n"
    paths = files(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == [
        f"{topic}/{SHORT_HOST}-{rev:06d}.log" for rev in range(len(expected))
    ]
    assert [p.read_bytes() for p in paths] == expected
    assert oct((tmp_path / topic).stat().st_mode & 0o777) == oct(0o770 & ~current_umask())
    assert "currently 10" in archiver.stderr.decode()  # "... currently 1016 bytes (> 1000)"


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_rotate_interval_opens_new_revisions(
    nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
    tmp_path: Path,
) -> None:
    topic = unique("interval")
    archiver = start_archiver(
        tool,
        nsqd,
        topic,
        f"--output-dir={tmp_path}",
        "--rotate-interval=500ms",
        "--sync-interval=100ms",
        "--skip-empty-files",
    )
    publish(nsqd, topic, b"one")
    wait_until(
        lambda: archived(nsqd, topic) and len(files(tmp_path)) == 1, what="first file", timeout=30.0
    )
    wait_until(
        lambda: b"since last open, rotating..." in archiver.stderr, what="rotation", timeout=30.0
    )
    publish(nsqd, topic, b"two")
    wait_until(
        lambda: archived(nsqd, topic) and len(files(tmp_path)) == 2,
        what="second file",
        timeout=30.0,
    )
    stop(archiver)
    first, second = files(tmp_path)
    assert (first.read_bytes(), second.read_bytes()) == (b"one\n", b"two\n")
    assert "-000000." in first.name and "-000001." in second.name


def test_without_skip_empty_files_rotation_opens_empty_files(
    nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
    tmp_path: Path,
) -> None:
    """As Go: when the sync tick finds rotation due, it opens the next file at once, even with
    nothing to write (--skip-empty-files only closes the old one)."""
    topic = unique("empty")
    archiver = start_archiver(
        tool,
        nsqd,
        topic,
        f"--output-dir={tmp_path}",
        "--rotate-interval=300ms",
        "--sync-interval=100ms",
    )
    publish(nsqd, topic, b"only")
    wait_until(lambda: len(files(tmp_path)) >= 3, what="empty rotations", timeout=30.0)
    stop(archiver)
    contents = [p.read_bytes() for p in files(tmp_path)]
    assert contents.count(b"only\n") == 1
    assert set(contents) == {b"only\n", b""}


def test_work_dir_moves_without_overwriting(
    nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
    tmp_path: Path,
) -> None:
    topic = unique("workdir")
    output, work = tmp_path / "out", tmp_path / "work"
    output.mkdir()
    fmt = "<TOPIC><REV>.log"
    taken = output / f"{topic}-000000.log"
    taken.write_bytes(b"someone else's\n")
    publish(nsqd, topic, b"kept apart")
    archiver = start_archiver(
        tool,
        nsqd,
        topic,
        f"--output-dir={output}",
        f"--work-dir={work}",
        f"--filename-format={fmt}",
    )
    wait_until(lambda: archived(nsqd, topic), what="archived", timeout=30.0)
    assert (work / f"{topic}-000001.log").read_bytes() == b"kept apart\n"  # in progress
    # a file appears under the name the archiver will move to: it must pick the next one
    (output / f"{topic}-000001.log").write_bytes(b"raced\n")
    stop(archiver)
    assert taken.read_bytes() == b"someone else's\n"
    assert (output / f"{topic}-000001.log").read_bytes() == b"raced\n"
    assert (output / f"{topic}-000002.log").read_bytes() == b"kept apart\n"
    assert files(work) == []
    log = archiver.stderr.decode()
    assert f"WARNING: [{topic}/nsq_to_file] output file already exists: {taken}" in log
    assert "to avoid overwrite" in log


def test_sighup_closes_and_reopens(
    nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
    tmp_path: Path,
) -> None:
    topic = unique("hup")
    archiver = start_archiver(tool, nsqd, topic, f"--output-dir={tmp_path}", "--gzip")
    publish(nsqd, topic, b"before")
    wait_until(
        lambda: archived(nsqd, topic) and len(files(tmp_path)) == 1, what="first file", timeout=30.0
    )
    archiver.proc.send_signal(signal.SIGHUP)
    publish(nsqd, topic, b"after")
    wait_until(
        lambda: archived(nsqd, topic) and len(files(tmp_path)) == 2, what="reopened", timeout=30.0
    )
    first, second = files(tmp_path)
    assert gzip.decompress(first.read_bytes()) == b"before\n"  # closed: complete
    stop(archiver)
    assert gzip.decompress(second.read_bytes()) == b"after\n"


def test_sigterm_flushes_everything(
    nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
    tmp_path: Path,
) -> None:
    topic = unique("term")
    bodies = [b"m%d" % i for i in range(30)]
    # a long sync interval and a budget the batch never fills: only the stop flushes
    archiver = start_archiver(
        tool,
        nsqd,
        topic,
        f"--output-dir={tmp_path}",
        "--gzip",
        "--sync-interval=10m",
        "--max-in-flight=1000",
    )
    http_post(nsqd, "/mpub", b"\n".join(bodies), topic=topic)
    wait_until(
        lambda: (channel_stats(nsqd, topic, "nsq_to_file") or {}).get("depth", 1) == 0,
        what="delivered",
        timeout=30.0,
    )
    stop(archiver)
    assert archived(nsqd, topic)
    [path] = files(tmp_path)
    assert gzip.decompress(path.read_bytes()) == b"".join(b + b"\n" for b in bodies)


# ---------------------------------------------------------------------- discovery


def test_topic_pattern_discovery_through_lookupd(
    lookupd_cluster: tuple[DaemonProcess, list[DaemonProcess]],
    tool: Callable[..., ToolProcess],
    tmp_path: Path,
) -> None:
    lookupd, (first, second) = lookupd_cluster
    prefix = unique("disc")
    wanted = [f"{prefix}_keep_a", f"{prefix}_keep_b"]
    other = f"{prefix}_other"
    publish(first, wanted[0], b"a from first")
    publish(second, wanted[1], b"b from second")
    publish(first, other, b"not archived")
    archiver = tool(
        "nsq_to_file",
        f"--topic-pattern=^{prefix}_keep_",
        f"--lookupd-http-address={http(lookupd)}",
        "--topic-refresh=300ms",
        "--consumer-opt=lookupd_poll_interval,300ms",
        f"--output-dir={tmp_path}",
        "--filename-format=<TOPIC>.log",
    )
    wait_until(
        lambda: {p.name for p in files(tmp_path)} == {f"{t}.log" for t in wanted},
        what="both topics archived",
        timeout=30.0,
    )
    wait_until(lambda: archived(first, wanted[0]) and archived(second, wanted[1]), timeout=30.0)
    stop(archiver)
    assert (tmp_path / f"{wanted[0]}.log").read_bytes() == b"a from first\n"
    assert (tmp_path / f"{wanted[1]}.log").read_bytes() == b"b from second\n"
    skipped = f"WARNING: skipping topic {other} (doesn't match pattern ^{prefix}_keep_)"
    assert skipped in archiver.stderr.decode()


# ---------------------------------------------------------------------- flags


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--log-level=loud"], "--log-level is invalid"),
        (["--channel="], "--channel is required"),
        (["--http-client-connect-timeout=0"], "--http-client-connect-timeout should be positive"),
        (["--http-client-request-timeout=-1s"], "--http-client-request-timeout should be positive"),
        ([], "--nsqd-tcp-address or --lookupd-http-address required."),
        (
            ["--nsqd-tcp-address=127.0.0.1:1", "--lookupd-http-address=127.0.0.1:2"],
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (
            ["--nsqd-tcp-address=127.0.0.1:1", "--gzip-level=10"],
            "invalid --gzip-level value (10), should be 1-9",
        ),
        (["--nsqd-tcp-address=127.0.0.1:1"], "--topic or --topic-pattern required"),
        (
            ["--nsqd-tcp-address=127.0.0.1:1", "--topic-pattern=x"],
            "--lookupd-http-address must be specified when no --topic specified",
        ),
        (
            [
                "--nsqd-tcp-address=127.0.0.1:1",
                "--topic=t",
                "--gzip",
                "--filename-format=<TOPIC>.log",
            ],
            "missing <REV> in --filename-format when gzip, rotation, or work dir enabled",
        ),
        (
            ["--nsqd-tcp-address=127.0.0.1:1", "--topic=t", "stray", "args"],
            "unknown arguments: [stray args]",
        ),
    ],
)
def test_flag_errors(args: list[str], message: str) -> None:
    run_tool_fatal("nsq_to_file", args, message.encode())


def test_unwritable_output_dir_and_unreachable_nsqd(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    result = run_tool(
        "nsq_to_file", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", f"--output-dir={blocker}/x"
    )
    assert result.returncode == 1
    assert fatal_line(result.stderr).startswith(b"unable to create dir: [Errno 20] Not a directory")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    result = run_tool(
        "nsq_to_file",
        "--topic=t",
        f"--nsqd-tcp-address=127.0.0.1:{port}",
        f"--output-dir={tmp_path}",
    )
    assert result.returncode == 1
    assert (
        fatal_line(result.stderr)
        == f"dial tcp 127.0.0.1:{port}: connect: connection refused".encode()
    )
    assert b"Traceback" not in result.stderr


def test_usage_and_version() -> None:
    result = run_tool("nsq_to_file", "--bogus")
    assert result.returncode == 2
    assert result.stderr.startswith(b"flag provided but not defined: -bogus\nUsage of nsq_to_file:")
    for flag in (b"-output-dir value", b"-rotate-interval value", b"-topic-pattern value"):
        assert flag in result.stderr
    assert b'(default "<TOPIC>.<HOST><REV>.<DATETIME>.log")' in result.stderr
    result = run_tool("nsq_to_file", "--version")
    assert result.returncode == 0
    assert result.stdout.startswith(f"nsq_to_file v{NSQ_VERSION} (built w/python".encode())


# ---------------------------------------------------------------------- <DATETIME>


def test_datetime_format_renders_as_go() -> None:
    """Expected values printed by Go 1.19 running nsq_to_file's strftime() on these times;
    literal text is part of Go's layout (``v1`` is the month, ``Mon`` the weekday)."""
    utc = dt.datetime(2026, 11, 5, 14, 7, 9, 123450, tzinfo=dt.UTC)
    cases = {
        "%Y-%m-%d_%H": "2026-11-05_14",
        "v1-%Y": "v11-2026",
        "%a %A %b %B %p %I %y %Z %z %%": "Thu Thursday Nov November PM 02 26 UTC +0000 %",
        "x_2006 _2 __2 002 .000 .999 Z07:00 -07": "x_2026  5 309 309 .123 .123 Z +00",
        "Mon Monday Monx Jan Janx 3 4 5 15 PM pm": "Thu Thursday Monx Nov Janx 2 7 9 14 PM pm",
    }
    for fmt, expected in cases.items():
        assert strftime(fmt, utc) == expected, fmt
    west = dt.datetime(2026, 1, 25, 0, 3, 4, tzinfo=dt.timezone(-dt.timedelta(hours=7, minutes=30)))
    assert (
        go_format(go_layout("%d %H %I %p .999 -07:00 Z0700"), west) == "25 00 12 AM  -07:30 -0730"
    )
