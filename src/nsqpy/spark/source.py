"""The ``nsq`` source: a streaming reader (staged design) and a batch reader (drain a channel).

The streaming reader's planning methods run in one long-lived process on the driver; ``read``
runs in executor tasks on fresh copies of the object, so nothing here opens a connection in
``__init__`` and all per-query state lives either in the offsets or in the staging directory.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .fetch import fetch_task, record_batches
from .options import NSQOptionError, SourceOptions
from .plan import INITIAL_OFFSET, ReadTask, allocate, make_offset, offset_tick, partitions_for
from .plan import read_tasks as plan_read_tasks
from .staging import Staging, StagingError
from .topology import (
    ChannelStats,
    LookupdUnreachable,
    NsqdNode,
    channel_stats,
    create_channel,
    lookup_nodes,
    matching_topics,
)

__all__ = [
    "FULL_SCHEMA",
    "MINIMAL_SCHEMA",
    "NSQBatchReader",
    "NSQPartition",
    "NSQStreamReader",
    "source_schema",
]

log = logging.getLogger("nsqpy.spark")

#: AvailableNow gives up on messages it was told of but could not read after this many empty
#: batches in a row
MAX_FRUITLESS_BATCHES = 2

FULL_SCHEMA = StructType(
    [
        StructField("body", BinaryType(), nullable=False),
        StructField("id", StringType(), nullable=False),
        StructField("attempts", IntegerType(), nullable=False),
        StructField("timestamp", TimestampType(), nullable=False),
        StructField("nsqd", StringType(), nullable=False),
        StructField("topic", StringType(), nullable=False),
        StructField("channel", StringType(), nullable=False),
    ]
)
#: includeMetadata=false: the body and what identifies a delivery, for deduplication
MINIMAL_SCHEMA = StructType([FULL_SCHEMA["body"], FULL_SCHEMA["id"], FULL_SCHEMA["nsqd"]])

COMMITTED_STATE = "_committed.json"


def source_schema(options: SourceOptions) -> StructType:
    return FULL_SCHEMA if options.include_metadata else MINIMAL_SCHEMA


def _check_schema(schema: StructType) -> None:
    known = set(FULL_SCHEMA.fieldNames())
    unknown = [name for name in schema.fieldNames() if name not in known]
    if unknown:
        raise NSQOptionError(
            f"nsq: the source has no column(s) {unknown}; its columns are {sorted(known)}"
        )


@dataclass(frozen=True)
class NSQPartition(InputPartition):
    """One read task, and where its staged file lives."""

    task: ReadTask
    staging: str


def _read_partition(
    partition: InputPartition, options: SourceOptions, schema: StructType
) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, NSQPartition):
        return iter(())  # Spark's placeholder when there is nothing to read
    staging = Staging(partition.staging)
    staging.check_owner(options.identity())
    table = fetch_task(partition.task, options, staging)
    return record_batches(table, to_arrow_schema(schema, timezone="UTC"))


# ---------------------------------------------------------------------- the cluster view


class _ClusterView:
    """Driver side: which nsqd carry our topics and how deep our channel is on each."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.sources: dict[str, list[NsqdNode]] = {}
        self.reached_lookupd = False
        self.looked_up_at: float | None = None
        self.stats: dict[tuple[str, str], ChannelStats | None] = {}

    def refresh(self) -> dict[str, list[NsqdNode]]:
        options = self.options
        now = time.monotonic()
        if (
            self.looked_up_at is not None
            and now - self.looked_up_at < options.lookupd_poll_interval
        ):
            return self.sources  # Spark may ask many times a second: nodes change slowly
        if not options.lookupd:
            http: Sequence[str | None] = options.nsqd_http or [None] * len(options.nsqd)
            nodes = [NsqdNode(tcp, h) for tcp, h in zip(options.nsqd, http, strict=True)]
            assert options.topic is not None  # topicPattern requires lookupd
            self.sources = {options.topic: sorted(nodes)}
            return self.sources
        try:
            if options.topic is not None:
                topics = [options.topic]
            else:
                assert options.topic_pattern is not None
                topics = matching_topics(
                    options.lookupd, options.topic_pattern, options.http_timeout
                )
            self.sources = {
                t: lookup_nodes(options.lookupd, t, options.http_timeout) for t in topics
            }
            self.reached_lookupd = True
            self.looked_up_at = now
        except LookupdUnreachable:
            if not self.reached_lookupd:
                raise
            log.warning("nsqlookupd unreachable: planning with the nsqd known before")
        return self.sources

    def refresh_stats(self) -> dict[tuple[str, str], ChannelStats | None]:
        options = self.options
        stats: dict[tuple[str, str], ChannelStats | None] = {}
        for topic, nodes in self.refresh().items():
            for node in nodes:
                if node.http is None:
                    stats[(topic, node.tcp)] = None
                    continue
                st = channel_stats(node.http, topic, options.channel, options.http_timeout)
                missing = st is not None and st.topic_exists and not st.exists
                if (
                    missing
                    and options.create_channel
                    and create_channel(node.http, topic, options.channel, options.http_timeout)
                ):
                    st = channel_stats(node.http, topic, options.channel, options.http_timeout)
                stats[(topic, node.tcp)] = st
        self.stats = stats
        return stats

    def available(self, stats: dict[tuple[str, str], ChannelStats | None]) -> dict[Any, int]:
        """Messages each (topic, nsqd) can give now; unknown depth counts as a full read."""
        options = self.options
        full = options.readers_per_nsqd * options.messages_per_partition
        available: dict[Any, int] = {}
        for key, st in stats.items():
            if st is None:
                available[key] = full  # no stats: read what is there, up to a full batch
            elif not st.exists:
                # SUB creates the channel (createChannel=false, or creating it failed)
                available[key] = options.messages_per_partition if st.topic_exists else 0
            else:
                available[key] = st.available
        return available

    def report(self) -> dict[str, Any]:
        nodes: dict[str, Any] = {}
        totals = {"depth": 0, "inFlight": 0, "deferred": 0}
        for (topic, nsqd), st in sorted(self.stats.items()):
            if st is None:
                nodes[f"{topic}@{nsqd}"] = None
                continue
            nodes[f"{topic}@{nsqd}"] = {
                "depth": st.available,
                "inFlight": st.in_flight,
                "deferred": st.deferred,
            }
            totals["depth"] += st.available
            totals["inFlight"] += st.in_flight
            totals["deferred"] += st.deferred
        return {**totals, "nsqds": nodes}


def _build_plan(
    shares: dict[Any, int], options: SourceOptions
) -> dict[str, dict[str, tuple[int, int]]]:
    plan: dict[str, dict[str, tuple[int, int]]] = {}
    for (topic, nsqd), messages in shares.items():
        partitions = partitions_for(
            messages, options.readers_per_nsqd, options.messages_per_partition
        )
        if partitions:
            plan.setdefault(topic, {})[nsqd] = (partitions, messages)
    return plan


# ---------------------------------------------------------------------- streaming


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("nsq")``: offsets are ticks, messages are staged then FINed."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        _check_schema(schema)
        self.options = options
        self.schema = schema
        # driver-runner state, rebuilt lazily (executors never use it)
        self._view: _ClusterView | None = None
        self._staging_claimed = False
        self._last_advance: float | None = None
        self._target: dict[Any, int] | None = None
        # AvailableNow: the last batch's tasks, until what they staged is checked
        self._unchecked: list[ReadTask] = []
        self._fruitless_batches = 0

    # ------------------------------------------------------------------ runner side

    @property
    def view(self) -> _ClusterView:
        if self._view is None:
            self._view = _ClusterView(self.options)
        return self._view

    def _claim_staging(self) -> Staging:
        staging = Staging(self.options.staging_location)
        if not self._staging_claimed:
            staging.claim(self.options.identity())
            self._staging_claimed = True
        return staging

    def initialOffset(self) -> dict[str, Any]:
        # a new query: fail fast on a wrong lookupd, and create our channel everywhere now so
        # that messages published before the first batch are kept for us
        self._claim_staging()
        self.view.refresh_stats()
        return dict(INITIAL_OFFSET)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages_per_trigger is not None:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        if self.options.min_messages_per_trigger is not None:
            return ReadMinRows(self.options.min_messages_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        stats = self.view.refresh_stats()
        unknown = [nsqd for (_, nsqd), st in stats.items() if st is None]
        if unknown:
            raise NSQOptionError(
                "nsq: Trigger.AvailableNow needs each nsqd's channel depth, which is unknown "
                f"for {unknown}: use 'lookupd', or give 'nsqdHttp' with 'nsqd'"
            )
        self._target = {key: st.available for key, st in stats.items() if st is not None}
        log.info("AvailableNow: reading up to %d messages", sum(self._target.values()))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._claim_staging()
        options = self.options
        now = time.monotonic()
        if self._last_advance is None:
            self._last_advance = now
        if self._target is not None:
            self._restore_short_reads(self._target)
        available = self.view.available(self.view.refresh_stats())
        if self._target is not None:
            available = {k: min(n, self._target.get(k, 0)) for k, n in available.items()}

        budget: int | None = None
        minimum: int | None = None
        if isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
            minimum = options.min_messages_per_trigger
        elif isinstance(limit, ReadMinRows):
            minimum = limit.min_rows
        elif not isinstance(limit, ReadAllAvailable):
            budget = options.max_messages_per_trigger
        total = sum(available.values())
        if total == 0:
            return start
        if (
            minimum is not None
            and self._target is None
            and total < minimum
            and now - self._last_advance < options.max_trigger_delay
        ):
            return start  # wait for more, up to maxTriggerDelay since the last batch

        shares = allocate(available, budget)
        end = make_offset(offset_tick(start) + 1, _build_plan(shares, options))
        if self._target is not None:
            for key, taken in shares.items():
                self._target[key] = max(0, self._target.get(key, 0) - taken)
            self._unchecked = plan_read_tasks(start, end)
        self._last_advance = now
        return end

    def _restore_short_reads(self, target: dict[Any, int]) -> None:
        """AvailableNow: give back to ``target`` what the last batch planned but did not read.

        A task stops at waitMs or an idle gap, so it can stage fewer messages than planned (a
        loaded machine, messages briefly in flight to another consumer); those are still owed
        by this run. Spark plans the next batch only after the last one ran, so its tasks'
        staged files are there to count. A batch that read nothing at all ends the giving back
        after a few tries: the channel may be paused, or others took the messages.
        """
        tasks, self._unchecked = self._unchecked, []
        staging = self._claim_staging()
        counted = [(task, staging.row_count(task.key)) for task in tasks]
        ran = [(task, rows) for task, rows in counted if rows is not None]
        if not ran:
            return  # the batch never ran (or was already committed): nothing to learn
        read = sum(rows for _, rows in ran)
        self._fruitless_batches = 0 if read else self._fruitless_batches + 1
        if self._fruitless_batches > MAX_FRUITLESS_BATCHES:
            log.warning("AvailableNow: %d batches read nothing: stopping", self._fruitless_batches)
            return
        for task, rows in ran:
            if rows < task.messages:
                key = (task.topic, task.nsqd)
                target[key] = target.get(key, 0) + task.messages - rows

    def reportLatestOffset(self) -> dict[str, Any] | None:
        if self._view is None or not self._view.stats:
            return None
        return self._view.report()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        staging = self._claim_staging()
        state = staging.read_state(COMMITTED_STATE) or {}
        committed = int(str(state.get("tick", -1)))
        if offset_tick(end) <= committed:
            message = (
                f"nsq: batch ending at tick {offset_tick(end)} is being planned again, but its "
                f"staged messages were deleted when tick {committed} was committed"
            )
            if self.options.fail_on_data_loss:
                raise StagingError(message + " (set failOnDataLoss=false to go on)")
            log.warning("%s: reading new messages instead", message)
        location = str(staging.path)
        return [NSQPartition(task, location) for task in plan_read_tasks(start, end)]

    def commit(self, end: dict[str, Any]) -> None:
        staging = self._claim_staging()
        tick = offset_tick(end)
        removed = staging.remove_through(tick)
        staging.write_state(COMMITTED_STATE, {"tick": tick})
        log.debug("committed tick %d: removed %d staged file(s)", tick, removed)

    def stop(self) -> None:
        pass  # nothing is held open between calls

    # ------------------------------------------------------------------ executor side

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition, self.options, self.schema)


# ---------------------------------------------------------------------- batch


class NSQBatchReader(DataSourceReader):
    """``spark.read.format("nsq")``: drain up to ``maxMessages`` (or the current depth).

    The drained messages are staged under ``<stagingLocation>/batch-<id>/`` and FINished;
    every action on the DataFrame replays the same staged rows. Delete the directory when the
    DataFrame is no longer needed.
    """

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        _check_schema(schema)
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        view = _ClusterView(options)
        stats = view.refresh_stats()
        available = view.available(stats)
        if options.max_messages is None and any(st is None for st in stats.values()):
            log.warning("no channel depth for some nsqd: reading up to a full batch from each")
        shares = allocate(available, options.max_messages)
        plan = _build_plan(shares, options)
        if not plan:
            return []
        location = f"{options.staging_location.rstrip('/')}/batch-{uuid.uuid4().hex}"
        Staging(location).claim(options.identity())
        end = make_offset(1, plan)
        return [NSQPartition(task, location) for task in plan_read_tasks(INITIAL_OFFSET, end)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition, self.options, self.schema)
