"""Shared fixtures for the utilities' tests: real daemons, and the tools run as processes.

A tool runs as its installed console script (``.venv/bin/nsq_tail``) when it exists, else as
``python -m nsqpy.apps.nsq_tail``; either way it is a separate process talking to nsqd and
nsqlookupd processes started with :mod:`nsqpy.testing` on free ports.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd, start_nsqlookupd

from ..raw_v2 import wait_until

#: Go's standard ``log`` line: ``2026/11/25 10:00:00 text``
GO_LOG_LINE = re.compile(rb"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2} (.*)$")


def tool_command(name: str) -> list[str]:
    script = Path(sys.executable).parent / name
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", f"nsqpy.apps.{name}"]


def run_tool(
    name: str, *args: str, input: bytes = b"", timeout: float = 60.0
) -> subprocess.CompletedProcess[bytes]:
    """Run a tool to completion; its stdout and stderr as bytes."""
    return subprocess.run(
        [*tool_command(name), *args], input=input, capture_output=True, timeout=timeout
    )


class ToolProcess:
    """A long-running tool; its stdout and stderr are collected as they arrive."""

    def __init__(self, name: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*tool_command(name), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._out = bytearray()
        self._err = bytearray()
        self._lock = threading.Lock()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._out), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._err), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _pump(self, stream: Any, sink: bytearray) -> None:
        while chunk := stream.read1(65536):
            with self._lock:
                sink.extend(chunk)

    @property
    def stdout(self) -> bytes:
        with self._lock:
            return bytes(self._out)

    @property
    def stderr(self) -> bytes:
        with self._lock:
            return bytes(self._err)

    def wait_for_output(self, predicate: Callable[[bytes], bool], timeout: float = 30.0) -> None:
        wait_until(lambda: predicate(self.stdout), timeout, f"output; got {self.stdout!r}")

    def wait_for_stderr(self, needle: bytes, timeout: float = 30.0) -> None:
        wait_until(lambda: needle in self.stderr, timeout, f"{needle!r} in {self.stderr!r}")

    def signal(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send ``sig`` and wait for the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait(timeout)

    def wait(self, timeout: float = 30.0) -> int:
        code = self.proc.wait(timeout)
        for thread in self._threads:
            thread.join(10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def tool() -> Iterator[Callable[..., ToolProcess]]:
    """Start tools as processes; any still running at the end of the test is killed."""
    started: list[ToolProcess] = []

    def start(name: str, *args: str) -> ToolProcess:
        process = ToolProcess(name, *args)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


def fatal_line(stderr: bytes) -> bytes:
    """The text of the last stderr line, which must be a Go ``log`` line."""
    last = stderr.rstrip(b"\n").split(b"\n")[-1]
    match = GO_LOG_LINE.match(last)
    assert match, f"not a Go log line: {last!r}"
    return match.group(1)


def run_tool_fatal(
    name: str, args: Sequence[str], message: bytes, input: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    """Run a tool that must fail as Go's ``log.Fatal`` does: exit 1, ``message`` as the last
    stderr line, no traceback. The result, for further checks."""
    result = run_tool(name, *args, input=input)
    assert result.returncode == 1, (args, result.stderr)
    assert fatal_line(result.stderr) == message
    assert b"Traceback" not in result.stderr
    return result


# ---------------------------------------------------------------------- daemons


def tcp(daemon: DaemonProcess) -> str:
    host, port = daemon.tcp_address
    return f"{host}:{port}"


def http(daemon: DaemonProcess) -> str:
    host, port = daemon.http_address
    return f"{host}:{port}"


def http_post(daemon: DaemonProcess, path: str, body: bytes = b"", **params: str) -> bytes:
    url = f"{daemon.http_url}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as resp:
        data: bytes = resp.read()
        return data


def publish(nsqd: DaemonProcess, topic: str, *bodies: bytes) -> None:
    for body in bodies:
        http_post(nsqd, "/pub", body, topic=topic)


def channel_stats(nsqd: DaemonProcess, topic: str, channel: str) -> dict[str, Any] | None:
    query = urllib.parse.urlencode({"format": "json", "topic": topic})
    with urllib.request.urlopen(f"{nsqd.http_url}/stats?{query}", timeout=10) as resp:
        stats = json.loads(resp.read())
    for t in stats.get("topics") or ():
        for c in t["channels"] if t["topic_name"] == topic else ():
            if c["channel_name"] == channel:
                result: dict[str, Any] = c
                return result
    return None


def topic_message_count(nsqd: DaemonProcess, topic: str) -> int:
    query = urllib.parse.urlencode({"format": "json", "topic": topic})
    with urllib.request.urlopen(f"{nsqd.http_url}/stats?{query}", timeout=10) as resp:
        stats = json.loads(resp.read())
    for t in stats.get("topics") or ():
        if t["topic_name"] == topic:
            return int(t["message_count"])
    return 0


@pytest.fixture(scope="module")
def nsqd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    daemon = start_nsqd(tmp_path_factory.mktemp("nsqd"))
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def second_nsqd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    daemon = start_nsqd(tmp_path_factory.mktemp("nsqd2"))
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def lookupd_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[DaemonProcess, list[DaemonProcess]]]:
    """nsqlookupd and two nsqd registered with it (each registers a topic as it creates it)."""
    lookupd = start_nsqlookupd()
    members: list[DaemonProcess] = []
    try:
        for name in ("a", "b"):
            members.append(
                start_nsqd(tmp_path_factory.mktemp(name), f"--lookupd-tcp-address={tcp(lookupd)}")
            )
        yield lookupd, members
    finally:
        for member in members:
            member.stop()
        lookupd.stop()


def lookup_producers(lookupd: DaemonProcess, topic: str) -> int:
    query = urllib.parse.urlencode({"topic": topic})
    try:
        with urllib.request.urlopen(f"{lookupd.http_url}/lookup?{query}", timeout=10) as resp:
            return len(json.loads(resp.read()).get("producers") or ())
    except urllib.error.HTTPError:
        return 0


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block, in order."""
    blocks: list[tuple[str, str]] = []
    language: str | None = None
    body: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if language is None:
                language, body = line[3:].strip(), []
            else:
                blocks.append((language, "".join(body)))
                language = None
        elif language is not None:
            body.append(line)
    return blocks


class DocShell:
    """Runs docs/utilities.md's shell examples on this test's daemons: ``.venv/bin/`` and the
    usual NSQ addresses in them are swapped for this environment's (``replacements``: more
    ``old -> new`` swaps)."""

    def __init__(
        self,
        nsqd: DaemonProcess,
        lookupd: DaemonProcess,
        replacements: dict[str, str] | None = None,
    ) -> None:
        self.swaps = {
            ".venv/bin/": str(Path(sys.executable).parent) + "/",
            "127.0.0.1:4150": tcp(nsqd),
            "127.0.0.1:4151": http(nsqd),
            "127.0.0.1:4160": tcp(lookupd),
            "127.0.0.1:4161": http(lookupd),
            **(replacements or {}),
        }

    def localize(self, command: str) -> str:
        for old, new in self.swaps.items():
            command = command.replace(old, new)
        return command

    def run(self, command: str) -> bytes:
        """Run one example with ``bash -e``; it must succeed. Its stdout."""
        result = subprocess.run(
            ["bash", "-e", "-c", self.localize(command)], capture_output=True, timeout=60
        )
        assert result.returncode == 0, (command, result.stderr)
        return result.stdout
