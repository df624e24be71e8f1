"""Spark connector tests: one SparkSession (``local[2,4]``: 2 cores, 4 attempts per task) and
one NSQ cluster (nsqlookupd + two nsqd) for the whole test session; each test uses its own
topic. The environment Spark needs is set here, not by the caller."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Python workers must run this interpreter (the venv), and Spark must stay on loopback
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

pytest.importorskip("pyspark", reason="install nsqpy[spark] to run the Spark tests")

from pyspark.sql import SparkSession

from nsqpy.spark import register
from nsqpy.testing import start_nsqd, start_nsqlookupd

from .helpers import NSQCluster

SPARK_DIR = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SPARK_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    work = tmp_path_factory.mktemp("spark")
    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("nsqpy-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(work / "warehouse"))
        .config("spark.local.dir", str(work / "local"))
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NSQCluster]:
    data = tmp_path_factory.mktemp("nsq")
    lookupd = start_nsqlookupd()
    lookupd_tcp = f"127.0.0.1:{lookupd.tcp_port}"
    daemons = [lookupd]
    try:
        nsqds = []
        for name in ("n1", "n2"):
            (data / name).mkdir()
            nsqd = start_nsqd(
                data / name,
                f"--lookupd-tcp-address={lookupd_tcp}",
                "--mem-queue-size=100000",
                "--msg-timeout=60s",
            )
            daemons.append(nsqd)
            nsqds.append(nsqd)
        yield NSQCluster(lookupd, nsqds)
    finally:
        for daemon in reversed(daemons):
            daemon.stop()
