"""``make run`` end to end: the demo shows aggregates within a minute and Ctrl-C stops it all."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .conftest import SPARK_DIR

# Spark start-up and streaming queries: more than the suite's default per-test limit
pytestmark = pytest.mark.timeout(300)


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline[:200]}")
    return found


def _stop_demo(proc: subprocess.Popen[str], work: Path) -> None:
    """After a failed check: stop the demo as Ctrl-C would, and end whatever it started (its
    daemons run in sessions of their own, so killing the demo alone would leave them)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for entry in _processes_mentioning(str(work)):
        pid = int(entry.split(":", 1)[0])
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _number(label: str, line: str) -> int:
    match = re.search(label + r" ([\d,]+)", line)
    assert match is not None, line
    return int(match.group(1).replace(",", ""))


def test_demo_shows_aggregates_within_a_minute_and_stops_cleanly_on_ctrl_c(
    tmp_path: Path,
) -> None:
    work = tmp_path / "demo"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nsqpy.demo",
            "--work-dir",
            str(work),
            "--rate",
            "100",
            "--every",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=SPARK_DIR,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    lines: list[str] = []
    first_aggregate = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if re.match(r"\s+aggregate\s+\d\d:\d\d:\d\d-", line):
                first_aggregate.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    started = time.monotonic()
    try:
        assert first_aggregate.wait(90), "no aggregate within 90 s:\n" + "".join(lines[-40:])
        seen_after = time.monotonic() - started
        time.sleep(3)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C does
        assert proc.wait(60) == 0, "".join(lines[-40:])
        left_running = _processes_mentioning(str(work))
    finally:
        _stop_demo(proc, work)
    reader.join(5)
    output = "".join(lines)
    assert seen_after < 75, output  # data flows within about a minute, Spark start included
    progress = [line for line in lines if re.match(r"\[\s*\d+s\] published", line)]
    assert progress, output
    final = progress[-1]
    published, archived = _number("published", final), _number("archived", final)
    assert published > 0 and 0 < archived <= published
    assert "stopping" in output
    assert "Traceback" not in output, output
    assert not left_running, "daemons left running"
    assert list((work / "archive").rglob("*.parquet"))
