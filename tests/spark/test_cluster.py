"""The distributed path: a standalone Spark master and one worker on loopback, started from
pyspark's own launcher classes, and the archive job submitted to it with ``--master spark://``.

The executor is a separate JVM with its own Python workers: the package, the staging
directory and the checkpoint must all be reachable from there, as on a real cluster.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.find_spark_home import _find_spark_home

from .helpers import NSQCluster, make_topic, parquet_rows, publish_numbered, unique, wait_for

# Spark start-up and streaming queries: more than the suite's default per-test limit
pytestmark = pytest.mark.timeout(300)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spark_env() -> dict[str, str]:
    return dict(
        os.environ,
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        SPARK_NO_DAEMONIZE="1",
    )


def launch(cls: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
    spark_class = Path(_find_spark_home()) / "bin" / "spark-class"
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(spark_class), cls, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=spark_env(),
        )


def master_state(ui_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as resp:
        state: dict[str, Any] = json.loads(resp.read())
    return state


def alive_workers(ui_port: int) -> int:
    try:
        return sum(1 for w in master_state(ui_port)["workers"] if w["state"] == "ALIVE")
    except OSError:
        return 0


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, Path]]:
    work = tmp_path_factory.mktemp("standalone")
    port, ui = free_port(), free_port()
    procs = [
        launch(
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
            log=work / "master.log",
        )
    ]
    try:
        wait_for(lambda: _ui_up(ui), timeout=60, what="Spark master")
        procs.append(
            launch(
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--webui-port",
                str(free_port()),
                "--cores",
                "2",
                "--memory",
                "2g",
                "--work-dir",
                str(work / "worker"),
                f"spark://127.0.0.1:{port}",
                log=work / "worker.log",
            )
        )
        wait_for(lambda: alive_workers(ui) == 1, timeout=60, what="Spark worker")
        yield f"spark://127.0.0.1:{port}", ui, work
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _ui_up(ui: int) -> bool:
    try:
        master_state(ui)
    except OSError:
        return False
    return True


def test_archive_job_on_a_standalone_cluster(
    standalone: tuple[str, int, Path], cluster: NSQCluster, tmp_path: Path
) -> None:
    master, ui, work = standalone
    topic = unique("cluster")
    make_topic(cluster, topic, "archive")
    bodies = publish_numbered(cluster, topic, 0, 2000)

    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nsqpy.pipeline",
            "--master",
            master,
            "--lookupd",
            cluster.lookupd_http,
            "--topic",
            topic,
            "--work-dir",
            str(tmp_path / "pipeline"),
            "--available-now",
            "--conf",
            "spark.executor.memory=1g",
            "--conf",
            "spark.cores.max=2",
            "--conf",
            "spark.driver.host=127.0.0.1",
            "archive",
        ],
        env=spark_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]

    rows = parquet_rows(tmp_path / "pipeline" / "archive")
    assert sorted(r["body"] for r in rows) == sorted(bodies)
    # it ran on the cluster: the master lists the finished application, and the worker
    # launched an executor for it
    apps = master_state(ui)["completedapps"]
    assert any(app["name"] == "nsqpy-pipeline archive" for app in apps)
    assert list((work / "worker").glob("app-*/*/stderr"))
    assert time.monotonic() - started < 240
