"""NSQ as a Spark source and sink: the ``nsq`` format (install ``nsqpy[spark]``).

::

    from nsqpy.spark import register
    register(spark)                     # once per SparkSession
    spark.readStream.format("nsq").option("lookupd", "127.0.0.1:4161") ...

The streaming source stages the messages each task takes from nsqd (durably, on storage the
driver and executors share) before FINishing them, and replays staged batches on task retry
or query restart: at-least-once, with duplicates only after a crash between staging and FIN,
which dropping duplicates on ``(nsqd, id)`` removes. The sink publishes with MPUB/DPUB,
at-least-once. See docs/spark.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .options import NSQOptionError, SinkOptions, SourceOptions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["FORMAT", "NSQOptionError", "SinkOptions", "SourceOptions", "data_source", "register"]

FORMAT = "nsq"


def data_source() -> type:
    """The DataSource class (imported lazily: pyspark is an optional dependency)."""
    from .datasource import NSQDataSource

    return NSQDataSource


def register(spark: SparkSession) -> None:
    """Make ``format("nsq")`` available in this SparkSession."""
    spark.dataSource.register(data_source())
