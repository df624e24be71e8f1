"""The pipeline's streaming jobs, as functions that start a query on a SparkSession."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

__all__ = ["SourceConfig", "Trigger", "aggregate_query", "archive_query"]


@dataclass(frozen=True)
class Trigger:
    """A processing-time interval (``"5 seconds"``) or AvailableNow (drain what is there, stop)."""

    interval: str = "5 seconds"
    available_now: bool = False

    def apply(self, writer: DataStreamWriter) -> DataStreamWriter:
        if self.available_now:
            return writer.trigger(availableNow=True)
        return writer.trigger(processingTime=self.interval)


@dataclass(frozen=True)
class SourceConfig:
    """Where the jobs read from: nsqlookupd (or a static nsqd list) and the topic."""

    topic: str
    lookupd: Sequence[str] = ()
    nsqd: Sequence[str] = ()
    nsqd_http: Sequence[str] = ()
    #: any other option of the nsq source (maxMessagesPerTrigger, nsq.tls_v1, ...)
    options: Mapping[str, str] = field(default_factory=dict)

    def source_options(self, channel: str, staging: str | Path) -> dict[str, str]:
        options = {"topic": self.topic, "channel": channel, "stagingLocation": str(staging)}
        if self.lookupd:
            options["lookupd"] = ",".join(self.lookupd)
        if self.nsqd:
            options["nsqd"] = ",".join(self.nsqd)
        if self.nsqd_http:
            options["nsqdHttp"] = ",".join(self.nsqd_http)
        options.update(self.options)
        return options

    def sink_options(self) -> dict[str, str]:
        if self.lookupd:
            return {"lookupd": ",".join(self.lookupd)}
        return {"nsqd": ",".join(self.nsqd)}


def read_channel(
    spark: SparkSession, source: SourceConfig, channel: str, staging: str | Path
) -> DataFrame:
    return spark.readStream.format("nsq").options(**source.source_options(channel, staging)).load()


def deduplicated(messages: DataFrame, watermark: str) -> DataFrame:
    """Drop redeliveries: the same ``(nsqd, id)`` seen again within ``watermark``.

    The watermark runs on ingestion time (the micro-batch's timestamp), not on publish time:
    a backlog of old messages (an nsqd that was down for an hour) is then never "late" and
    never dropped, while a redelivery (which comes within msg_timeout of the original) is.
    """
    return (
        messages.withColumn("ingest_time", F.current_timestamp())
        .withWatermark("ingest_time", watermark)
        .dropDuplicatesWithinWatermark(["nsqd", "id"])
    )


def archive_query(
    spark: SparkSession,
    source: SourceConfig,
    *,
    output: str | Path,
    checkpoint: str | Path,
    staging: str | Path,
    channel: str = "archive",
    watermark: str = "10 minutes",
    trigger: Trigger = Trigger(),
    name: str | None = None,
) -> StreamingQuery:
    """Archive a topic into Parquet under ``output/date=YYYY-MM-DD/hour=H/``, effectively once.

    The staged source replays exactly on task retry or restart, the file sink commits each
    micro-batch once, and :func:`deduplicated` removes the rare redeliveries.
    """
    archived = deduplicated(read_channel(spark, source, channel, staging), watermark)
    partitioned = archived.withColumn("date", F.date_format("timestamp", "yyyy-MM-dd")).withColumn(
        "hour", F.hour("timestamp")
    )
    writer = (
        partitioned.writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .partitionBy("date", "hour")
        .queryName(name or f"archive-{source.topic}")
    )
    return trigger.apply(writer).start()


def aggregate_query(
    spark: SparkSession,
    source: SourceConfig,
    *,
    output_topic: str,
    checkpoint: str | Path,
    staging: str | Path,
    key: str = "page",
    window: str = "10 seconds",
    watermark: str = "30 seconds",
    channel: str = "aggregate",
    trigger: Trigger = Trigger(),
    name: str | None = None,
    sink: Mapping[str, str] | None = None,
) -> StreamingQuery:
    """Count JSON events per ``key`` in tumbling windows of publish time; publish the counts.

    A window's counts are published once, when the watermark passes its end (append mode:
    the nsq sink, like every Python data source sink, supports append only); events later
    than ``watermark`` behind the newest one are dropped. Output messages::

        {"window_start": "2026-01-01T12:00:10.000Z", "window_end": "...", "page": "/home",
         "count": 42}
    """
    events = read_channel(spark, source, channel, staging).select(
        F.get_json_object(F.col("body").cast("string"), f"$.{key}").alias(key),
        "timestamp",
    )
    counts = (
        events.withWatermark("timestamp", watermark)
        .groupBy(F.window("timestamp", window), F.col(key))
        .count()
    )
    messages = counts.select(
        F.to_json(
            F.struct(
                F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias("window_start"),
                F.date_format("window.end", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias("window_end"),
                F.col(key),
                F.col("count"),
            ),
            {"ignoreNullFields": "false"},  # events without the key are counted under null
        ).alias("body")
    )
    writer = (
        messages.writeStream.format("nsq")
        .options(**(dict(sink) if sink is not None else source.sink_options()))
        .option("topic", output_topic)
        .option("checkpointLocation", str(checkpoint))
        .outputMode("append")
        .queryName(name or f"aggregate-{source.topic}")
    )
    return trigger.apply(writer).start()
