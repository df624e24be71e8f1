"""``--spark``: the pipeline's archive job (``nsqpy-pipeline archive``) reads the chaos topic
into Parquet from inside the consumers' namespace, its driver is killed -9 and restarted on
its checkpoint as one more fault, and at the end the archive, deduplicated on ``(nsqd, id)``
as the job itself does, is compared with the acknowledged set."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

from .netns import Node
from .workload import TOPIC


class SparkArchive:
    """The archive job as a process group (the Python driver and its JVM)."""

    def __init__(self, node: Node, lookupd_http: list[str], out: Path) -> None:
        self.node = node
        self.work = out / "spark"
        self.archive = self.work / "archive"
        self._log_path = out / "logs" / "spark.log"
        self.argv = [
            sys.executable,
            "-m",
            "nsqpy.pipeline.cli",
            "--master=local[1]",
            *(f"--lookupd={a}" for a in lookupd_http),
            f"--topic={TOPIC}",
            f"--work-dir={self.work}",
            "--trigger=2 seconds",
            "archive",
            f"--output={self.archive}",
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[str] | None = None

    def start(self) -> None:
        if self._log is not None:
            self._log.close()
        self._log = open(self._log_path, "a")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.node.exec_argv(self.argv),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: the JVM goes with the driver
        )

    def kill9(self) -> None:
        self._signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self, timeout: float = 30.0) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                proc.wait()
        self._signal_group(signal.SIGKILL)  # a JVM left behind by the driver
        if self._log is not None:
            self._log.close()
            self._log = None

    def _signal_group(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def archived_rows(self) -> list[dict[str, Any]]:
        """``nsqd``, ``id`` and ``body`` of every archived row (committed files only)."""
        try:
            import pyarrow.dataset as ds
        except ImportError:
            return []
        if not self.archive.exists():
            return []
        try:
            table = ds.dataset(str(self.archive), format="parquet", partitioning="hive")
            rows: list[dict[str, Any]] = table.to_table(columns=["nsqd", "id", "body"]).to_pylist()
        except (OSError, ValueError):  # a file being written, or no files yet
            return []
        return rows

    def wait_for(self, acked: set[int], deadline: float) -> None:
        while time.time() < deadline:
            if acked <= archived_numbers(self.archived_rows()):
                return
            time.sleep(3.0)


def archived_numbers(rows: list[dict[str, Any]]) -> set[int]:
    numbers = set()
    for row in rows:
        body = row["body"]
        text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
        if text.isdigit():
            numbers.add(int(text))
    return numbers


def check_archive(rows: list[dict[str, Any]], acked: set[int], invoked: set[int]) -> dict[str, Any]:
    """The archive after dedup on ``(nsqd, id)`` against the acknowledged set."""
    unique = {(r["nsqd"], r["id"]): r for r in rows}
    numbers = Counter(
        int(t)
        for t in (
            (r["body"].decode(errors="replace") if isinstance(r["body"], bytes) else r["body"])
            for r in unique.values()
        )
        if str(t).isdigit()
    )
    missing = sorted(acked - numbers.keys())
    return {
        "rows": len(rows),
        "rows_after_dedup": len(unique),
        "same_id_twice": len(rows) - len(unique),
        "numbers_archived_twice": sum(1 for c in numbers.values() if c > 1),
        "missing_acknowledged": len(missing),
        "missing_sample": missing[:20],
        "unexpected": len(numbers.keys() - invoked),
        "equals_acknowledged": not missing and numbers.keys() <= invoked,
    }
