"""A SparkSession for the pipeline: local by default, any master on request."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from ..spark import register

__all__ = ["pipeline_session", "stop_session"]


def pipeline_session(
    master: str | None = "local[*]",
    app_name: str = "nsqpy-pipeline",
    conf: Mapping[str, str] | None = None,
    log_level: str = "WARN",
) -> SparkSession:
    """Build (or join) the SparkSession and register the ``nsq`` format.

    ``master=None`` keeps what ``spark-submit`` configured. In local mode the Python workers
    run this interpreter and Spark binds to loopback.
    """
    local = master is None or master.startswith("local")
    if local or "PYSPARK_PYTHON" not in os.environ:
        # executors on a cluster need the same path to a Python with nsqpy installed
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master is not None and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.showConsoleProgress": "false",
    }
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark


def stop_session(spark: SparkSession) -> None:
    """``spark.stop()``, without PySpark's traceback when the JVM hangs up first (see
    :func:`quiet_accumulator_hangups`)."""
    quiet_accumulator_hangups(spark)
    spark.stop()


def quiet_accumulator_hangups(spark: SparkSession) -> None:
    """Silence the driver's accumulator server for a shutdown that has begun.

    ``SparkContext.stop`` stops the JVM before the driver's accumulator server, and stopping a
    streaming query can already close a task's accumulator connection, under the server's
    reader, which then prints an EOFError traceback (seen after Ctrl-C in ``make run`` and in
    the demo). Once stopping has begun that hang-up is expected: call this before the queries
    are stopped.
    """
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = _ignore_request_error


def _ignore_request_error(request: object, client_address: object) -> None:
    pass
