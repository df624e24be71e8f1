"""The distributed path: a standalone Spark master and two workers on loopback, started from
pyspark's own launcher classes, and the archive job submitted to it with ``--master spark://``.

The executor is a separate JVM with its own Python workers: the package, the staging
directory and the checkpoint must all be reachable from there, as on a real cluster.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqpy.pipeline.standalone import StandaloneSpark, spark_env

from ..raw_v2 import unique
from .helpers import NSQCluster, make_topic, parquet_rows, publish_numbered

# Spark start-up and streaming queries: more than the suite's default per-test limit
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneSpark]:
    # two workers of one core and 1 GiB each: the job's two executors land on different JVMs
    with StandaloneSpark(tmp_path_factory.mktemp("standalone"), workers=2, cores=1) as spark:
        yield spark


def test_archive_job_on_a_standalone_cluster(
    standalone: StandaloneSpark, cluster: NSQCluster, tmp_path: Path
) -> None:
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
            standalone.url,
            "--lookupd",
            cluster.lookupd_http,
            "--topic",
            topic,
            "--work-dir",
            str(tmp_path / "pipeline"),
            "--available-now",
            "--conf",
            "spark.executor.memory=512m",
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
    # it ran on the cluster: the master lists the finished application, and each worker
    # launched an executor for it (its stderr is in the worker's work directory)
    state = standalone.state() or {}
    assert any(app["name"] == "nsqpy-pipeline archive" for app in state["completedapps"])
    for i in range(standalone.workers):
        assert list(standalone.worker_dir(i).glob("app-*/*/stderr")), f"worker {i + 1} idle"
    assert time.monotonic() - started < 240
