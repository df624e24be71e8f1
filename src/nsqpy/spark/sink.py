"""The ``nsq`` sink: each partition publishes its rows with MPUB (DPUB for deferred rows).

Columns: ``body`` (binary or string, required), ``topic`` (string; the ``topic`` option
overrides it), ``defer_ms`` (integer, optional: rows with a positive value go out with DPUB).
Messages are batched by count (``batchSize``) and by nsqd's ``--max-body-size``; up to
``inFlightBatches`` MPUBs are outstanding at once. A body over ``maxMessageSize`` (nsqd's
``--max-msg-size``), an empty body or a null is an error that fails the task: rows are never
dropped silently.

Each task talks to one nsqd at a time (the local one first when found through nsqlookupd) and
fails over to the next on a connection error, resending what was not acknowledged.

Delivery is at-least-once: a retried task, or a micro-batch replayed after a restart,
publishes its rows again. Put a deterministic key in the payload so consumers can drop
duplicates.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, IntegralType, StringType, StructType

from ..client.errors import NoConnectionsError
from ..client.producer import Producer
from .fetch import Fault, new_event_loop_runner
from .framing import EncodedMessages, encoded_batches
from .options import NSQOptionError, SinkOptions, connection_options
from .topology import all_nodes

__all__ = ["NSQBatchWriter", "NSQSinkError", "NSQStreamWriter", "NSQWriteResult", "publish_rows"]

log = logging.getLogger("nsqpy.spark")

_MPUB_OVERHEAD = 4  # BE32 message count
_PER_MESSAGE_OVERHEAD = 4  # BE32 size of each message
_SINK_COLUMNS = {"body", "topic", "defer_ms"}


class NSQSinkError(RuntimeError):
    """A row cannot be published as it is (too large, empty, no topic)."""


@dataclass
class NSQWriteResult(WriterCommitMessage):
    """What one task published."""

    partition: int
    published: int
    deferred: int


def check_sink_schema(schema: StructType, options: SinkOptions) -> None:
    names = {f.name: f.dataType for f in schema.fields}
    body = names.get("body")
    if body is None:
        raise NSQOptionError(
            "nsq: the sink needs a 'body' column (binary or string); e.g. "
            "df.select(to_json(struct('*')).alias('body'))"
        )
    if not isinstance(body, (BinaryType, StringType)):
        raise NSQOptionError(f"nsq: column 'body' must be binary or string, not {body}")
    topic = names.get("topic")
    if options.topic is None and topic is None:
        raise NSQOptionError("nsq: give the 'topic' option, or a 'topic' column")
    if topic is not None and options.topic is None and not isinstance(topic, StringType):
        raise NSQOptionError(f"nsq: column 'topic' must be a string, not {topic}")
    defer = names.get("defer_ms")
    if defer is not None and not isinstance(defer, IntegralType):
        raise NSQOptionError(f"nsq: column 'defer_ms' must be an integer type, not {defer}")
    unused = sorted(set(names) - _SINK_COLUMNS)
    if unused:
        # Spark converts every column to Arrow for the writer (1M x 100 B: 1.5-1.6 JVM CPU s
        # with the source's seven columns, 0.55-0.65 s with body alone), and cannot be asked
        # for fewer from here
        log.warning(
            "nsq sink: columns %s are not published but Spark still ships them to the "
            "writer; select only body, topic and defer_ms before writing",
            ", ".join(unused),
        )


# ---------------------------------------------------------------------- publishing

# what one MPUB carries: bodies one by one, or already framed from an Arrow column
Payload = list[bytes] | EncodedMessages


class _FailoverPublisher:
    """One Producer on the current nsqd; on NoConnectionsError, move to the next nsqd."""

    def __init__(self, addresses: Sequence[str], options: SinkOptions) -> None:
        conn = connection_options(options.connection)
        self.kwargs = {f.name: getattr(conn, f.name) for f in fields(conn)}
        self.addresses = list(addresses)
        self.index = 0
        self.producer = Producer(self.addresses[0], **self.kwargs)
        self.retired: list[Producer] = []

    def _advance(self, failed: Producer) -> None:
        if failed is not self.producer:
            return  # another batch already moved on
        self.retired.append(failed)
        self.index += 1
        address = self.addresses[self.index % len(self.addresses)]
        log.warning("nsq sink: failing over to %s", address)
        self.producer = Producer(address, **self.kwargs)

    async def send(self, topic: str, bodies: Payload, defer_ms: int | None) -> None:
        tries = 0
        while True:
            producer = self.producer
            try:
                if isinstance(bodies, EncodedMessages):
                    await producer.multi_publish_encoded(topic, bodies.count, bodies.messages)
                elif defer_ms is not None:
                    # (ms + 0.5) / 1000 s: the Producer truncates seconds * 1000 to an int
                    await producer.deferred_publish(topic, (defer_ms + 0.5) / 1000.0, bodies[0])
                else:
                    await producer.multi_publish(topic, bodies)
                return
            except NoConnectionsError:
                tries += 1
                if tries >= len(self.addresses) + 1:
                    raise
                self._advance(producer)

    async def close(self) -> None:
        for producer in [*self.retired, self.producer]:
            await producer.close()


class _Batcher:
    """Groups rows into MPUB commands per topic, within the count and size limits."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.pending: dict[str, tuple[list[bytes], int]] = {}

    def add(self, topic: str, body: bytes) -> tuple[str, list[bytes]] | None:
        """Queue a body; returns a full batch to send first, if adding would overflow it."""
        options = self.options
        size = len(body) + _PER_MESSAGE_OVERHEAD
        bodies, total = self.pending.get(topic, ([], _MPUB_OVERHEAD))
        full: tuple[str, list[bytes]] | None = None
        if bodies and (len(bodies) >= options.batch_size or total + size > options.max_body_size):
            full = (topic, bodies)
            bodies, total = [], _MPUB_OVERHEAD
        bodies.append(body)
        self.pending[topic] = (bodies, total + size)
        return full

    def extend(
        self, topic: str, bodies: list[bytes], largest: int
    ) -> list[tuple[str, list[bytes]]]:
        """Queue many bodies (none over ``largest`` bytes); returns the full batches to send.

        When ``batchSize`` bodies of ``largest`` bytes fit in one MPUB, batches are cut by
        count alone, without looking at each body in Python.
        """
        size = self.options.batch_size
        if not self._fits_by_count(largest):
            return [full for body in bodies if (full := self.add(topic, body)) is not None]
        pending, _ = self.pending.get(topic, ([], _MPUB_OVERHEAD))
        combined = pending + bodies if pending else bodies
        cut = len(combined) - len(combined) % size
        batches = [(topic, combined[i : i + size]) for i in range(0, cut, size)]
        rest = combined[cut:]
        total = _MPUB_OVERHEAD + sum(len(b) for b in rest) + _PER_MESSAGE_OVERHEAD * len(rest)
        self.pending[topic] = (rest, total)
        return batches

    def extend_column(self, topic: str, column: pa.Array, largest: int) -> Iterator[Payload]:
        """Queue an Arrow column's bodies (none over ``largest`` bytes); yields full MPUBs.

        When ``batchSize`` bodies of ``largest`` bytes fit in one MPUB, whole batches are
        framed from the column's buffers (see ``framing``) and only the remainder becomes
        Python bytes, to fill up with the next column's rows.
        """
        if not self._fits_by_count(largest) or len(column) < self.options.batch_size:
            for _, bodies in self.extend(topic, column.to_pylist(), largest):
                yield bodies
            return
        encoded, rest = encoded_batches(column, self.options.batch_size)
        yield from encoded
        for _, bodies in self.extend(topic, rest.to_pylist(), largest):
            yield bodies

    def _fits_by_count(self, largest: int) -> bool:
        size = (largest + _PER_MESSAGE_OVERHEAD) * self.options.batch_size + _MPUB_OVERHEAD
        return size <= self.options.max_body_size

    def drain(self) -> Iterator[tuple[str, list[bytes]]]:
        for topic, (bodies, _) in self.pending.items():
            if bodies:
                yield topic, bodies
        self.pending.clear()


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index)


def _deferral(batch: pa.RecordBatch) -> pa.Array | None:
    """Which rows go out with DPUB (a positive ``defer_ms``), or None if no row does."""
    defers = _column(batch, "defer_ms")
    if defers is None:
        return None
    mask = pc.fill_null(pc.greater(defers, 0), False)
    return mask if pc.any(mask).as_py() else None


def _checked_bodies(column: pa.Array, options: SinkOptions) -> tuple[pa.Array, int]:
    """The bodies as a binary column and the largest one's size; a bad body fails (never
    dropped).

    The checks run on the whole Arrow column at once; only a failing column is looked at
    row by row, for the error message.
    """
    if pa.types.is_string(column.type):
        column = column.cast(pa.binary())
    elif pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary())
    if len(column) == 0:
        return column, 0
    lengths = pc.binary_length(column)
    bounds = pc.min_max(lengths)
    smallest, largest = bounds["min"].as_py(), bounds["max"].as_py()
    too_large = options.max_body_size - _MPUB_OVERHEAD - _PER_MESSAGE_OVERHEAD
    if column.null_count or smallest == 0 or largest > min(options.max_message_size, too_large):
        for value in column.to_pylist():
            _checked_body(value, options)  # raises with the row's reason
    return column, largest


def _plain_rows(batch: pa.RecordBatch, options: SinkOptions) -> Iterator[tuple[str, pa.Array, int]]:
    """(topic, bodies, largest size) for the rows published with MPUB, grouped by topic."""
    bodies = _column(batch, "body")
    assert bodies is not None  # the schema was checked
    deferral = _deferral(batch)
    topics = None if options.topic else _column(batch, "topic")
    if deferral is not None:
        keep = pc.invert(deferral)
        bodies = bodies.filter(keep)
        topics = None if topics is None else topics.filter(keep)
    if options.topic:
        yield options.topic, *_checked_bodies(bodies, options)
        return
    assert topics is not None
    if topics.null_count or (len(topics) and pc.min(pc.utf8_length(topics)).as_py() == 0):
        raise NSQSinkError("nsq: a row has no topic (null 'topic' column)")
    for topic in pc.unique(topics).to_pylist():
        yield topic, *_checked_bodies(bodies.filter(pc.equal(topics, topic)), options)


def _deferred_rows(batch: pa.RecordBatch, options: SinkOptions) -> Iterator[tuple[str, bytes, int]]:
    """(topic, body, defer_ms) of the rows published with DPUB, one by one."""
    deferral = _deferral(batch)
    if deferral is None:
        return
    rows = batch.filter(deferral)
    bodies = _column(rows, "body")
    assert bodies is not None
    topics = None if options.topic else _column(rows, "topic")
    delays = _column(rows, "defer_ms")
    assert delays is not None
    for i, (value, delay) in enumerate(zip(bodies.to_pylist(), delays.to_pylist(), strict=True)):
        topic = options.topic or (topics[i].as_py() if topics is not None else None)
        if not topic:
            raise NSQSinkError("nsq: a row has no topic (null 'topic' column)")
        yield topic, _checked_body(value, options), int(delay)


def _sink_addresses(options: SinkOptions, partition: int) -> list[str]:
    """The nsqd to try in order: local ones first (as NSQ recommends), partitions spread."""
    if options.nsqd:
        return _rotate(list(options.nsqd), partition)
    nodes = all_nodes(options.lookupd, options.http_timeout)
    if not nodes:
        raise NSQSinkError(f"nsq: nsqlookupd {list(options.lookupd)} lists no nsqd")
    names = _local_names()
    local = [n.tcp for n in nodes if n.tcp.rsplit(":", 1)[0].strip("[]") in names]
    remote = [n.tcp for n in nodes if n.tcp not in local]
    return _rotate(local, partition) + _rotate(remote, partition)


def _rotate(addresses: list[str], partition: int) -> list[str]:
    if not addresses:
        return addresses
    shift = partition % len(addresses)
    return addresses[shift:] + addresses[:shift]


def _local_names() -> set[str]:
    names = {"127.0.0.1", "localhost", "::1", socket.gethostname(), socket.getfqdn()}
    try:
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return names


def _checked_body(value: Any, options: SinkOptions) -> bytes:
    if value is None:
        raise NSQSinkError("nsq: a row has a null body; NSQ cannot publish it")
    body = value.encode() if isinstance(value, str) else bytes(value)
    if not body:
        raise NSQSinkError("nsq: a row has an empty body; nsqd rejects empty messages")
    if len(body) > options.max_message_size:
        raise NSQSinkError(
            f"nsq: a row's body is {len(body)} bytes, over maxMessageSize "
            f"{options.max_message_size} (nsqd's --max-msg-size); rows are never dropped: "
            "filter or split them before writing"
        )
    if len(body) + _MPUB_OVERHEAD + _PER_MESSAGE_OVERHEAD > options.max_body_size:
        raise NSQSinkError(
            f"nsq: a row's body is {len(body)} bytes, too large for maxBodySize "
            f"{options.max_body_size} (nsqd's --max-body-size)"
        )
    return body


async def _publish(
    batches: Iterator[pa.RecordBatch], options: SinkOptions, partition: int
) -> NSQWriteResult:
    publisher = _FailoverPublisher(_sink_addresses(options, partition), options)
    window = asyncio.Semaphore(options.in_flight_batches)
    tasks: set[asyncio.Task[None]] = set()
    errors: list[BaseException] = []
    published = deferred = 0

    async def send(topic: str, bodies: Payload, defer_ms: int | None = None) -> None:
        try:
            await publisher.send(topic, bodies, defer_ms)
        except BaseException as exc:
            errors.append(exc)
        finally:
            window.release()

    async def submit(topic: str, bodies: Payload, defer_ms: int | None = None) -> None:
        await window.acquire()
        if errors:
            window.release()
            raise errors[0]
        task = asyncio.get_running_loop().create_task(send(topic, bodies, defer_ms))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    batcher = _Batcher(options)
    try:
        for batch in batches:
            for topic, bodies, largest in _plain_rows(batch, options):
                for payload in batcher.extend_column(topic, bodies, largest):
                    await submit(topic, payload)
                published += len(bodies)
            for topic, body, delay in _deferred_rows(batch, options):
                await submit(topic, [body], delay)
                deferred += 1
            await asyncio.sleep(0)  # let acknowledgements in while Spark feeds the next batch
        for topic, pending in batcher.drain():
            await submit(topic, pending)
        while tasks:
            await asyncio.gather(*list(tasks))
        if errors:
            raise errors[0]
    finally:
        for task in list(tasks):
            task.cancel()
        await publisher.close()
    return NSQWriteResult(partition, published + deferred, deferred)


def publish_rows(batches: Iterator[pa.RecordBatch], options: SinkOptions) -> NSQWriteResult:
    """Publish every row of a partition; returns once nsqd acknowledged all of them."""
    partition = _partition_id()
    with new_event_loop_runner() as runner:
        result = runner.run(_publish(batches, options, partition))
    fault = Fault.parse(options.fault_injection)
    if fault is not None:
        fault.trigger("after_publish", f"p{partition}")
    return result


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


# ---------------------------------------------------------------------- writers


class NSQBatchWriter(DataSourceArrowWriter):
    """``df.write.format("nsq")``."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        check_sink_schema(schema, options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return publish_rows(iterator, self.options)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.published for m in messages if isinstance(m, NSQWriteResult))
        log.info("nsq sink: published %d message(s)", total)


class NSQStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("nsq")``: each micro-batch published at least once."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        check_sink_schema(schema, options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return publish_rows(iterator, self.options)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # nothing to finalise: messages are visible once nsqd acknowledged them, and a
        # repeated commit of the same batchId changes nothing
        total = sum(m.published for m in messages if isinstance(m, NSQWriteResult))
        log.info("nsq sink: batch %d published %d message(s)", batchId, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("nsq sink: batch %d aborted; its retry publishes the rows again", batchId)
