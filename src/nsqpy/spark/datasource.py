"""``NSQDataSource``: the ``nsq`` format for Spark's Python Data Source API (pyspark >= 4.3)."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .options import parse_sink_options, parse_source_options
from .sink import NSQBatchWriter, NSQStreamWriter
from .source import NSQBatchReader, NSQStreamReader, source_schema

__all__ = ["NSQDataSource"]


class NSQDataSource(DataSource):
    """Read NSQ channels and publish to NSQ topics, in streams and in batches.

    ::

        from nsqpy.spark import register
        register(spark)
        df = (spark.readStream.format("nsq")
              .option("lookupd", "127.0.0.1:4161")
              .option("topic", "clicks").option("channel", "spark-archive")
              .option("stagingLocation", "/shared/staging/archive")
              .load())

    See docs/spark.md for every option.
    """

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> StructType:
        # options are checked here so that mistakes surface at .load()
        return source_schema(parse_source_options(self.options, streaming=False))

    def reader(self, schema: StructType) -> DataSourceReader:
        return NSQBatchReader(parse_source_options(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return NSQStreamReader(parse_source_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return NSQBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return NSQStreamWriter(parse_sink_options(self.options), schema)
