"""The source's read task: take messages from one nsqd, stage them durably, then FIN them.

One low-level :class:`~nsqpy.client.Connection` per task, because FIN is accepted only on the
connection that received the message and the task must FIN exactly the messages it staged::

    SUB topic channel; RDY n
    receive until n messages, the deadline (waitMs), or an idle gap after the first message
    RDY 0 (and take what was already on the wire)
    stage the rows (temp file, fsync, link to the final name only if absent)
    won  -> FIN them all         lost -> REQ them all and replay the winner's file
    CLS, wait for CLOSE_WAIT (nsqd has applied every FIN before it), close

A retried task, or a restarted query re-planning the same tick, finds the staged file and
replays it without touching nsqd. A task that dies between staging and FIN leaves its messages
in flight; nsqd redelivers them (same id, attempts + 1) after msg_timeout, so the output holds
them twice and dropping duplicates on (nsqd, id) restores effectively-once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .. import __version__
from ..client.connection import Connection, ConnectionOptions
from ..client.errors import ConnectionClosedError, ServerError
from ..client.message import Message
from ..protocol import commands
from .options import SourceOptions, connection_options
from .plan import ReadTask, split_messages
from .receive import FrameConnection, answer_lines, frames_table
from .staging import STAGED_SCHEMA, Staging, StagingError

__all__ = ["FaultInjected", "PoisonMessageError", "fetch_task", "new_event_loop_runner"]

log = logging.getLogger("nsqpy.spark")

#: how long to keep listening after RDY 0 for messages nsqd had already sent
SETTLE_SECONDS = 0.05
CLOSE_TIMEOUT = 5.0


class PoisonMessageError(RuntimeError):
    """A message exceeded maxAttempts and the poison policy is ``fail``."""


class FaultInjected(RuntimeError):
    """Raised by the test-only ``_faultInjection`` option (``mode: raise``)."""


def new_event_loop_runner() -> asyncio.Runner:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


# ---------------------------------------------------------------------- fault injection


@dataclass(frozen=True)
class Fault:
    """Test-only: fail some tasks once at a named point (``after_stage``, ``after_fin``...)."""

    point: str
    directory: str
    every: int = 1
    mode: str = "raise"
    #: fail at most this many tasks in all (0: no limit)
    limit: int = 0

    @classmethod
    def parse(cls, spec: str | None) -> Fault | None:
        if not spec:
            return None
        data = json.loads(spec)
        return cls(
            point=str(data["point"]),
            directory=str(data["dir"]),
            every=int(data.get("every", 1)),
            mode=str(data.get("mode", "raise")),
            limit=int(data.get("max", 0)),
        )

    def trigger(self, point: str, key: str) -> None:
        """Fail here if this is the fault's point, the key is selected, and it has not yet."""
        if point != self.point or zlib.crc32(key.encode()) % self.every != 0:
            return
        os.makedirs(self.directory, exist_ok=True)
        if self.limit and len(os.listdir(self.directory)) >= self.limit:
            return
        try:
            fd = os.open(os.path.join(self.directory, f"{key}.{point}"), os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return  # already failed once here
        os.close(fd)
        log.warning("fault injection: failing task %s at %s (%s)", key, point, self.mode)
        if self.mode == "exit":
            os._exit(17)  # the Python worker dies, as in a real crash
        raise FaultInjected(f"injected failure at {point} for {key}")


# ---------------------------------------------------------------------- receiving


class _Collector:
    """Delegate of the task's connections: counts deliveries, wakes the task when enough."""

    def __init__(self) -> None:
        #: messages kept so far, over every connection (their frames stay in each connection)
        self.received = 0
        #: deliveries after the task stopped taking messages (requeued as they arrive)
        self.late_count = 0
        self.want = 0
        self.last_arrival = 0.0
        self.error: BaseException | None = None
        self.closed = False
        self.wakeup = asyncio.Event()

    def on_frames(self, conn: FrameConnection, count: int) -> None:
        first = self.received == 0
        self.received += count
        self.last_arrival = time.monotonic()
        if self.received >= self.want or first:
            self.wakeup.set()  # enough, or the first: the idle timer starts

    def on_late_message(self, conn: FrameConnection) -> None:
        self.late_count += 1

    def on_message(self, conn: Connection, message: Message) -> None:
        # a FrameConnection keeps message frames itself; nothing to stage here
        conn.write(commands.req(message.id, 0))

    def on_message_finished(self, conn: Connection, message: Message) -> None:
        conn.write(commands.fin(message.id))

    def on_message_requeued(
        self, conn: Connection, message: Message, delay: float | None, backoff: bool
    ) -> None:
        conn.write(commands.req(message.id, int((delay or 0) * 1000)))

    def on_response(self, conn: Connection, data: bytes) -> None:
        pass

    def on_server_error(self, conn: Connection, error: ServerError) -> None:
        if error.fatal:
            self.error = error
            self.wakeup.set()
        else:
            log.warning("(%s) %s", conn.address, error)

    def on_close(self, conn: Connection, exc: BaseException | None) -> None:
        if not conn.closing:
            self.closed = True
            self.wakeup.set()

    async def gather(self, want: int, wait: float, idle: float) -> None:
        """Until ``want`` messages, ``wait`` seconds in all, or ``idle`` seconds of silence."""
        self.want = want
        deadline = time.monotonic() + wait
        while self.received < want and not self.closed and self.error is None:
            now = time.monotonic()
            if now >= deadline:
                return
            timeout = deadline - now
            if self.received:
                quiet_until = self.last_arrival + idle
                if now >= quiet_until:
                    return
                timeout = min(timeout, quiet_until - now)
            self.wakeup.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.wakeup.wait()

    async def settle(self, quiet: float) -> None:
        """Take what is still arriving after RDY 0: return after ``quiet`` s without a message."""
        while not self.closed:
            before = self.received
            self.wakeup.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(quiet):
                    await self.wakeup.wait()
            if self.received == before:
                return


# ---------------------------------------------------------------------- the task


@dataclass
class _Received:
    """One connection's deliveries as staged rows: FIN and REQ go back on that connection."""

    conn: Connection
    table: pa.Table

    def answer(self, verb: bytes) -> None:
        """FIN (``verb`` b"FIN") or REQ (b"REQ") every delivery, in one write."""
        lines = answer_lines(self.table.column("id"), verb)
        if lines:
            self.conn.write(lines)


def messages_table(parts: list[_Received]) -> pa.Table:
    """Every connection's rows in one table."""
    tables = [p.table for p in parts if p.table.num_rows]
    if not tables:
        return empty_table()
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def empty_table() -> pa.Table:
    return STAGED_SCHEMA.empty_table()


def _source_connection_options(options: SourceOptions) -> ConnectionOptions:
    # a short output buffer timeout: the last messages of a burst should not sit in nsqd's
    # buffer for its default 250 ms while the task waits for them
    return connection_options(
        options.connection,
        output_buffer_timeout=0.025,
        user_agent=f"nsqpy-spark/{__version__}",
    )


def fetch_task(task: ReadTask, options: SourceOptions, staging: Staging) -> pa.Table:
    """The rows of ``task``: replayed from its staged file, or taken from nsqd and staged."""
    fault = Fault.parse(options.fault_injection)
    table = _replay(task, options, staging)
    if table is not None:
        return table
    with new_event_loop_runner() as runner:
        table = runner.run(_fetch(task, options, staging, fault))
    if fault is not None:
        fault.trigger("after_fin", task.key)
    return table


def _replay(task: ReadTask, options: SourceOptions, staging: Staging) -> pa.Table | None:
    try:
        return staging.load(task.key)
    except StagingError:
        if options.fail_on_data_loss:
            raise
        log.warning("dropping unreadable staged file of %s (failOnDataLoss=false)", task.key)
        staging.discard(task.key)
        return None


async def _fetch(
    task: ReadTask, options: SourceOptions, staging: Staging, fault: Fault | None
) -> pa.Table:
    collector = _Collector()
    conn_options = _source_connection_options(options)
    first = FrameConnection(task.nsqd, conn_options, collector)
    try:
        await first.connect()
    except ConnectionClosedError as exc:
        # its messages stay on that nsqd for a later tick; staging "nothing" keeps a replay
        # of this batch identical to the first run
        log.warning("task %s: nsqd %s unreachable (%s): staging no rows", task.key, task.nsqd, exc)
        staging.publish(task.key, empty_table())
        return _replay(task, options, staging) or empty_table()
    # IdentifyError (TLS, compression or AUTH settings) propagates: say so, do not skip
    conns = [first]
    try:
        # one connection holds at most max_rdy_count un-FINished messages: a larger task
        # reads over several connections to the same nsqd
        wanted = math.ceil(task.messages / max(1, first.max_rdy_count))
        conns += await _open_more(task, conn_options, collector, wanted - 1)
        return await _consume(conns, collector, task, options, staging, fault)
    except BaseException:
        for conn in conns:
            conn.abort()  # unstaged messages return to the channel after msg_timeout
        raise


async def _open_more(
    task: ReadTask, conn_options: ConnectionOptions, collector: _Collector, count: int
) -> list[FrameConnection]:
    if count <= 0:
        return []
    conns = [FrameConnection(task.nsqd, conn_options, collector) for _ in range(count)]
    results = await asyncio.gather(*(c.connect() for c in conns), return_exceptions=True)
    opened = []
    for conn, result in zip(conns, results, strict=True):
        if isinstance(result, BaseException):
            log.warning("task %s: extra connection failed: %s", task.key, result)
        else:
            opened.append(conn)
    return opened


async def _consume(
    conns: list[FrameConnection],
    collector: _Collector,
    task: ReadTask,
    options: SourceOptions,
    staging: Staging,
    fault: Fault | None,
) -> pa.Table:
    for conn in conns:
        response = await conn.handshake_command(commands.sub(task.topic, options.channel))
        if response != b"OK":
            raise ServerError(b"E_INVALID unexpected SUB response " + response[:64])
    want = 0
    for i, conn in enumerate(conns):
        conn.start_streaming()
        share = min(split_messages(task.messages, len(conns), i), conn.max_rdy_count)
        conn.send_rdy(share)
        want += share
    await collector.gather(want, options.wait, options.idle)
    if collector.error is not None:
        raise collector.error
    for conn in conns:
        conn.send_rdy(0)
    if collector.received < want:
        await collector.settle(SETTLE_SECONDS)
    logs = [conn.freeze() for conn in conns]
    if collector.closed:
        # nothing can be FINished on a dead connection: stage nothing, nsqd redelivers them
        raise ConnectionClosedError(f"{task.nsqd}: connection lost while reading {task.key}")

    received = [
        _Received(conn, frames_table(frames, task.topic, options.channel, task.nsqd))
        for conn, frames in zip(conns, logs, strict=True)
    ]
    keep, poison = _split_poison(received, options)
    if poison and options.poison_policy == "fail":
        _answer(received, b"REQ")
        await _close(conns)
        raise _poison_error(messages_table(poison), task, options)

    table = messages_table(keep)
    if fault is not None:
        fault.trigger("before_stage", task.key)
    if not staging.publish(task.key, table):
        # another attempt staged this task first: its rows are the task's rows
        _answer(received, b"REQ")
        await _close(conns)
        return _replay(task, options, staging) or empty_table()
    if fault is not None:
        fault.trigger("after_stage", task.key)

    _answer(keep, b"FIN")
    if poison:
        disposed = await _dispose_poison(conns[0], messages_table(poison), task, options)
        _answer(poison, b"FIN" if disposed else b"REQ")
    await _close(conns)
    return table


def _answer(parts: list[_Received], verb: bytes) -> None:
    for part in parts:
        part.answer(verb)


def _split_poison(
    received: list[_Received], options: SourceOptions
) -> tuple[list[_Received], list[_Received]]:
    """(rows to stage, poison rows: delivered more than maxAttempts times), by connection."""
    limit = options.max_attempts
    if limit <= 0:
        return received, []
    keep, poison = [], []
    for part in received:
        over = pc.greater(part.table.column("attempts"), limit)
        if not pc.any(over).as_py():
            keep.append(part)
            continue
        keep.append(_Received(part.conn, part.table.filter(pc.invert(over))))
        poison.append(_Received(part.conn, part.table.filter(over)))
    return keep, poison


def _poison_error(poison: pa.Table, task: ReadTask, options: SourceOptions) -> PoisonMessageError:
    worst = max(poison.select(["id", "attempts"]).to_pylist(), key=lambda row: row["attempts"])
    return PoisonMessageError(
        f"message {worst['id']} from {task.nsqd} was delivered {worst['attempts']} times "
        f"(maxAttempts={options.max_attempts}); set poisonPolicy to 'skip' or 'deadletter'"
    )


async def _dispose_poison(
    conn: Connection, poison: pa.Table, task: ReadTask, options: SourceOptions
) -> bool:
    """Skip or dead-letter poison messages; True if they may now be FINished."""
    if options.poison_policy == "skip":
        log.warning("task %s: dropping %d poison message(s)", task.key, poison.num_rows)
        return True
    assert options.dead_letter_topic is not None
    bodies = poison.column("body").to_pylist()
    try:
        response = await asyncio.wait_for(
            conn.request(commands.mpub(options.dead_letter_topic, bodies)), CLOSE_TIMEOUT
        )
    except (TimeoutError, ConnectionClosedError, ServerError) as exc:
        log.error("task %s: dead-letter publish failed (%s): requeueing", task.key, exc)
        return False
    if response != b"OK":
        return False
    log.warning(
        "task %s: moved %d poison message(s) to %s",
        task.key,
        poison.num_rows,
        options.dead_letter_topic,
    )
    return True


async def _close(conns: Sequence[Connection]) -> None:
    """CLS and wait for CLOSE_WAIT: nsqd has processed every FIN/REQ written before it."""
    waits = []
    for conn in conns:
        if conn.is_open:
            try:
                waits.append(conn.start_close())
            except ConnectionClosedError:
                pass
    results = await asyncio.gather(
        *(asyncio.wait_for(w, CLOSE_TIMEOUT) for w in waits), return_exceptions=True
    )
    for result in results:
        if isinstance(result, BaseException):
            log.warning("no CLOSE_WAIT from nsqd: %s", result)
    for conn in conns:
        conn.close()


def record_batches(table: pa.Table, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``table``'s rows with the columns (and exact Arrow types) Spark expects."""
    if table.num_rows == 0:
        return
    columns: list[Any] = [table.column(field.name) for field in target]
    projected = pa.Table.from_arrays(columns, schema=target)
    yield from projected.to_batches()
