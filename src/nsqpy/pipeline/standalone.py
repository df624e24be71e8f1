"""A Spark standalone cluster on loopback, for the cluster test and the scale-out benchmark.

A master and ``workers`` workers, started from the pyspark install's own launcher
(``$SPARK_HOME/bin/spark-class``, ``SPARK_HOME`` being the pyspark package directory) as child
processes bound to 127.0.0.1, each with a log file and its own work directory. They are
stopped by PID (SIGTERM, then SIGKILL). Jobs are submitted to :attr:`StandaloneSpark.url`
exactly as to any other cluster.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["StandaloneSpark", "spark_env"]

_START_TIMEOUT = 90.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spark_env() -> dict[str, str]:
    """The environment for Spark's processes: loopback only, this interpreter for Python."""
    return dict(
        os.environ,
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        SPARK_NO_DAEMONIZE="1",
    )


class StandaloneSpark:
    """``spark://127.0.0.1:<port>`` with ``workers`` workers of ``cores`` cores each."""

    def __init__(
        self, work_dir: Path, workers: int = 2, cores: int = 1, memory: str = "1g"
    ) -> None:
        self.work_dir = work_dir
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = _free_port()
        self.ui_port = _free_port()
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def worker_dir(self, index: int) -> Path:
        return self.work_dir / f"worker{index + 1}"

    def _launch(self, cls: str, args: list[str], log: Path) -> None:
        from pyspark.find_spark_home import _find_spark_home

        spark_class = Path(_find_spark_home()) / "bin" / "spark-class"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [str(spark_class), cls, *args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=spark_env(),
                )
            )

    def start(self) -> StandaloneSpark:
        master = ["--host", "127.0.0.1", "--port", str(self.port)]
        master += ["--webui-port", str(self.ui_port)]
        self._launch("org.apache.spark.deploy.master.Master", master, self.work_dir / "master.log")
        try:
            self._wait(lambda: self.state() is not None, "the Spark master")
            for i in range(self.workers):
                args = ["--host", "127.0.0.1", "--webui-port", str(_free_port())]
                args += ["--cores", str(self.cores), "--memory", self.memory]
                args += ["--work-dir", str(self.worker_dir(i)), self.url]
                self._launch(
                    "org.apache.spark.deploy.worker.Worker",
                    args,
                    self.work_dir / f"worker{i + 1}.log",
                )
            self._wait(lambda: self.alive_workers() == self.workers, "the Spark workers")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while not ready():
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{what}: a Spark process exited ({self.work_dir})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not start in {_START_TIMEOUT:.0f} s")
            time.sleep(0.2)

    def state(self) -> dict[str, Any] | None:
        """The master's JSON status (workers, applications), or None if it does not answer."""
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                state: dict[str, Any] = json.loads(resp.read())
        except (OSError, ValueError):
            return None
        return state

    def alive_workers(self) -> int:
        state = self.state() or {}
        return sum(1 for w in state.get("workers") or () if w.get("state") == "ALIVE")

    def stop(self) -> None:
        """Workers first, then the master; each by its PID."""
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.procs.clear()

    def __enter__(self) -> StandaloneSpark:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
