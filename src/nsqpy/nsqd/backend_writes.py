"""The disk-write side of nsqd: overflow writes to topic and channel queues, the batching of
one MPUB's (or pump turn's) writes into one write(2) per queue with shared messages encoded and
framed once, --sync-every/--sync-timeout fsyncs and the acknowledgements that wait for them,
the daemon's health (a refused write makes it unhealthy, the next good one healthy again), and
the logged writes and closes of the shutdown flushes (``Channel.flush``, ``Topic.flush``).

NSQD owns one :class:`BackendWrites` (``nsqd.writes``); topics, channels and the publish
commands hold it directly, so the per-message path costs no more attribute look-ups than a
method of NSQD would.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import TYPE_CHECKING, Protocol, cast

from ..protocol.message import MESSAGE_HEADER
from .diskqueue import DiskQueue, DiskQueueError
from .errors import BackendWriteError
from .message import Message, MessageRun

if TYPE_CHECKING:
    from collections.abc import Awaitable, Iterator, Sequence

    from ..protocol.errors import ProtocolError
    from .backend import Backend
    from .diskqueue.holds import Hold
    from .memory_queue import MemoryQueue
    from .nsqd import NSQD

#: what one queue's share of a batch of writes is made of, in order: messages, and the runs
#: of published messages a topic hands on unbuilt
Pending = Message | MessageRun


_RECORD_SIZE = struct.Struct(">I")
#: a disk record's size and the message header (``MESSAGE_HEADER``: BE64 ts, BE16 attempts)
_FRAMED_HEADER = struct.Struct(">IQH")
_RECORD_OVERHEAD = MESSAGE_HEADER.size + 16  # + the 16-byte ID, then the body


class PublishTarget(Protocol):
    """What :meth:`BackendWrites.running_syncs` reads of the topic a publish goes to."""

    @property
    def name(self) -> str: ...

    @property
    def backend(self) -> Backend: ...

    def publish_writes_channels(self) -> bool: ...


# the client errors a failing backend causes, summarised under one key of the fault log
_WRITE_FAILURE_CODES = frozenset({"E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED"})
_REFUSED_WRITES = "refused-writes"


#: framed records (``DiskQueue.put_framed``) and the size of the largest
Framed = tuple[bytes, int]


class _SharedEncodings:
    """One flush of ``batched_writes``: a message shared by several channels is encoded once,
    and a run of shared messages (or of MessageRuns) overflowing to many channels' disk queues
    is framed into one buffer once, which each queue then writes whole
    (``DiskQueue.put_framed``). Keyed by the objects' ``id()`` while the batch keeps them
    alive."""

    __slots__ = ("frames", "records", "runs")

    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self.frames: dict[tuple[int, int], tuple[list[Pending], Framed]] = {}
        self.runs: dict[int, Framed] = {}

    def framed(self, items: list[Pending]) -> Framed | None:
        """The framed records of ``items`` if they are all MessageRuns or all messages
        (kept for the other queues if shared), else None."""
        if isinstance(items[0], MessageRun):
            return self._framed_runs(items)
        msgs = cast("list[Message]", items)  # checked below, before they are framed
        if not msgs[0].shared:  # one queue's own messages: framed for it alone
            return None if MessageRun in map(type, msgs) else _framed_messages(msgs)
        last = msgs[-1]
        if not (isinstance(last, Message) and last.shared):
            return None
        key = (id(msgs[0]), len(msgs))
        cached = self.frames.get(key)
        if cached is not None and cached[0] == msgs:  # list ==: identity per element, in C
            return cached[1]
        if not all([isinstance(msg, Message) and msg.shared for msg in msgs]):
            return None
        framed = _framed_messages(msgs)
        self.frames[key] = (items, framed)
        return framed

    def _framed_runs(self, items: list[Pending]) -> Framed | None:
        runs = self.runs
        pieces: list[bytes] = []
        largest = 0
        for run in items:
            if not isinstance(run, MessageRun):
                return None
            framed = runs.get(id(run))
            if framed is None:
                framed = runs[id(run)] = framed_run(run)
            pieces.append(framed[0])
            largest = max(largest, framed[1])
        return b"".join(pieces), largest


def _framed_messages(msgs: list[Message]) -> Framed:
    return framed_records(msgs), _RECORD_OVERHEAD + max([len(msg.body) for msg in msgs])


def framed_records(msgs: Sequence[Message]) -> bytes:
    """``BE32 size`` + :meth:`Message.encode` of each message, joined: the record header is
    one pack with the size, so no message's own encoding is built on the way."""
    pack = _FRAMED_HEADER.pack
    pieces: list[bytes] = []
    extend = pieces.extend
    for msg in msgs:
        body = msg.body
        extend((pack(_RECORD_OVERHEAD + len(body), msg.timestamp, msg.attempts), msg.id, body))
    return b"".join(pieces)


def framed_run(run: MessageRun) -> Framed:
    """:func:`framed_records` of a run's messages, without building them, and the size of
    the largest record."""
    pack = _FRAMED_HEADER.pack
    timestamp = run.timestamp
    pieces: list[bytes] = []
    extend = pieces.extend
    for msg_id, body in zip(run.ids, run.bodies, strict=True):
        extend((pack(_RECORD_OVERHEAD + len(body), timestamp, 0), msg_id, body))
    return b"".join(pieces), _RECORD_OVERHEAD + max(map(len, run.bodies), default=0)


def _encode_all(items: list[Pending], encoded: dict[int, bytes]) -> list[bytes]:
    """The disk records of ``items``, one per message; a message shared by several channels
    is encoded once per batch (``encoded``)."""
    out: list[bytes] = []
    for item in items:
        if isinstance(item, MessageRun):
            out.extend(msg.encode() for msg in item.messages())
        elif not item.shared:
            out.append(item.encode())
        else:
            data = encoded.get(id(item))
            if data is None:
                data = encoded[id(item)] = item.encode()
            out.append(data)
    return out


def _record_count(items: list[Pending]) -> int:
    return sum([len(item) if isinstance(item, MessageRun) else 1 for item in items])


def _unstored(items: list[Pending], stored: int) -> list[Pending]:
    """``items`` less their first ``stored`` messages (a run cut where they end)."""
    for index, item in enumerate(items):
        size = len(item) if isinstance(item, MessageRun) else 1
        if stored < size:
            rest = items[index:]
            if isinstance(item, MessageRun) and stored:
                rest[0] = item.slice(stored)
            return rest
        stored -= size
    return []


def _messages_of(items: list[Pending]) -> list[Message]:
    msgs: list[Message] = []
    for item in items:
        if isinstance(item, MessageRun):
            msgs += item.messages()
        else:
            msgs.append(item)
    return msgs


def ack_after(
    waits: tuple[asyncio.Task[None], ...], response: bytes
) -> bytes | Awaitable[bytes | None]:
    """``response`` now, or once ``waits`` (fsyncs, channel pre-creation) are done."""
    if not waits:
        return response
    return _ack_after(waits, response)


async def _ack_after(waits: tuple[asyncio.Task[None], ...], response: bytes) -> bytes:
    await asyncio.wait(waits)
    return response


class BackendWrites:
    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self.logger = nsqd.logger
        self.fault_log = nsqd.fault_log
        self.health_error: str | None = None
        self._syncing: dict[Backend, asyncio.Task[None]] = {}
        self._write_batch: dict[Backend, tuple[MemoryQueue, list[Pending]]] | None = None

    # ------------------------------------------------------------------ writes

    def write_to_backend(
        self, backend: Backend, msg: Message, context: str, owner: MemoryQueue
    ) -> None:
        """Overflow to disk; BackendWriteError (and unhealthy) if the write fails.

        ``owner`` is the memory queue of the topic or channel the backend belongs to."""
        batch = self._write_batch
        if batch is not None:  # inside batched_writes(): one write(2) per queue at the end
            pending = batch.get(backend)
            if pending is None:
                pending = batch[backend] = (owner, [])
            pending[1].append(msg)
            return
        try:
            backend.put(msg.encode())
        except (DiskQueueError, OSError) as exc:
            self.set_health(str(exc))
            self.fault_log.failed(
                backend.name, f"{context} ERROR: failed to write message to backend - {exc}"
            )
            raise BackendWriteError(str(exc)) from None
        if self.health_error is not None or self.fault_log.active:
            self._backend_writable(backend)
        if backend not in self._syncing and backend.sync_due():
            self._start_sync(backend)

    def write_many_to_backend(
        self,
        backend: Backend,
        msgs: Sequence[Message] | MessageRun,
        context: str,
        owner: MemoryQueue,
    ) -> None:
        """:meth:`write_to_backend` for several messages (one list extend inside a batch, a
        MessageRun kept whole)."""
        batch = self._write_batch
        if batch is None:
            if isinstance(msgs, MessageRun):
                with self.batched_writes():  # (raises as write_to_backend)
                    self.write_many_to_backend(backend, msgs, context, owner)
                return
            for msg in msgs:
                self.write_to_backend(backend, msg, context, owner)
            return
        pending = batch.get(backend)
        if pending is None:
            pending = batch[backend] = (owner, [])
        if isinstance(msgs, MessageRun):
            pending[1].append(msgs)
        else:
            pending[1].extend(msgs)

    def write_held(self, queue: DiskQueue, msg: Message, context: str) -> Hold | None:
        """A held channel's write (beyond/channel_held.py), never batched, as the caller may
        deliver or pump at once: handed out and held when nothing waits before it (the Hold),
        otherwise stored as waiting (None). BackendWriteError as :meth:`write_to_backend`."""
        try:
            data = msg.encode()
            hold = queue.put_held(data)
            if hold is None:
                queue.put(data)
        except (DiskQueueError, OSError) as exc:
            self.set_health(str(exc))
            self.fault_log.failed(
                queue.name, f"{context} ERROR: failed to write message to backend - {exc}"
            )
            raise BackendWriteError(str(exc)) from None
        if self.health_error is not None or self.fault_log.active:
            self._backend_writable(queue)
        if queue not in self._syncing and queue.sync_due():
            self._start_sync(queue)
        return hold

    @contextlib.contextmanager
    def batched_writes(
        self, lenient: bool = False, refused: list[tuple[Backend, list[Message]]] | None = None
    ) -> Iterator[None]:
        """Collect the disk writes of one MPUB (or drain turn) and write each queue's share
        with one write(2). A refused write raises BackendWriteError (the publish fails), or
        with ``lenient`` keeps the unwritten messages in their owner's memory queue (and
        lists them in ``refused``, by queue, if given)."""
        if self._write_batch is not None:
            assert refused is None, "a batch that lists its refusals cannot be nested"
            yield
            return
        batch: dict[Backend, tuple[MemoryQueue, list[Pending]]] = {}
        self._write_batch = batch
        try:
            yield
        finally:
            self._write_batch = None
            failure: BackendWriteError | None = None
            encoded = _SharedEncodings()
            for backend, (owner, msgs) in batch.items():
                try:
                    unwritten = self._put_many(backend, msgs, lenient, encoded)
                except BackendWriteError as exc:
                    failure = exc
                    continue
                if unwritten:
                    kept = _messages_of(unwritten)
                    owner.extend(kept)
                    if refused is not None:
                        refused.append((backend, kept))
            if failure is not None:
                raise failure

    def _put_many(
        self,
        backend: Backend,
        msgs: list[Pending],
        keep: bool,
        encoded: _SharedEncodings,
    ) -> list[Pending]:
        """Write ``msgs`` to ``backend``. A refused write raises BackendWriteError, or with
        ``keep`` returns the messages it left unwritten."""
        try:
            written = False
            if backend.disk_queue() is not None:  # a memory-only backend drops them anyway
                framed = encoded.framed(msgs)
                if framed is not None:
                    written = backend.put_framed(framed[0], _record_count(msgs), framed[1])
            if not written:
                backend.put_many(_encode_all(msgs, encoded.records))
        except (DiskQueueError, OSError) as exc:
            self.set_health(str(exc))
            self.fault_log.failed(
                backend.name, f"DISKQUEUE({backend.name}) ERROR: failed to write messages - {exc}"
            )
            if not keep:
                raise BackendWriteError(str(exc)) from None
            stored = exc.stored if isinstance(exc, DiskQueueError) else 0
            return _unstored(msgs, stored)
        if self.health_error is not None or self.fault_log.active:
            self._backend_writable(backend)
        if backend not in self._syncing and backend.sync_due():
            self._start_sync(backend)
        return []

    # ------------------------------------------------------------------ syncs

    # --sync-every as go-diskqueue: the write that makes a sync due is acknowledged, and the
    # next write waits until that fsync is done. Here the next write is performed while the
    # fsync runs (in a thread) but is acknowledged only after it: at most sync_every
    # acknowledged messages are ever unsynced, and the fsync overlaps with work.

    async def sync_loop(self) -> None:
        """fsync disk queues when --sync-timeout has passed with activity (in worker threads);
        every sync is tracked, so publishes are acknowledged after the ones under way."""
        interval = max(0.001, min(self.nsqd.options.sync_timeout, 0.1))
        while True:
            await asyncio.sleep(interval)
            for queue in self.nsqd.backends():
                if queue in self._syncing:
                    continue
                if queue.sync_due():
                    self._start_sync(queue)

    def _start_sync(self, queue: Backend) -> None:
        task = self.nsqd.loop.create_task(queue.sync())
        self._syncing[queue] = task
        task.add_done_callback(lambda done: self._sync_finished(queue, done))

    def _sync_finished(self, queue: Backend, task: asyncio.Task[None]) -> None:
        self._syncing.pop(queue, None)
        if not task.cancelled() and task.exception() is not None:
            self.logger.error(f"failed to sync disk queue - {task.exception()}")
        elif not self.nsqd.exiting and queue.sync_due():  # writes made meanwhile are due already
            self._start_sync(queue)

    def running_syncs(self, topic: PublishTarget | None = None) -> tuple[asyncio.Task[None], ...]:
        """Syncs under way now: a publish arriving now is acknowledged after them. Only the
        queues a publish to ``topic`` can write count: with --mem-queue-size > 0 the topic's
        own (its pump writes the channels' later), else the topic's and its channels' (named
        ``topic:channel``), whose writes precede the OK."""
        if not self._syncing:
            return ()
        if topic is None:
            return tuple(self._syncing.values())
        if not topic.publish_writes_channels():
            task = self._syncing.get(topic.backend)
            return (task,) if task is not None else ()
        name = topic.name
        return tuple(
            task for queue, task in self._syncing.items() if queue.name.partition(":")[0] == name
        )

    # ------------------------------------------------------------------ health and fault logging

    def set_health(self, error: str | None) -> None:
        self.health_error = error

    @property
    def health(self) -> str:
        return "OK" if self.health_error is None else f"NOK - {self.health_error}"

    def _backend_writable(self, backend: Backend) -> None:
        """A write succeeded after failures: healthy again (as Go), and say the fault ended."""
        self.set_health(None)
        self.fault_log.recovered(backend.name, f"DISKQUEUE({backend.name}): writing again")
        self.fault_log.recovered(_REFUSED_WRITES, "clients' publishes succeed again")

    def log_client_error(self, remote_address: str, err: ProtocolError) -> None:
        """Go logs every error sent to a client; the refusals of a failing disk are said once
        and then summarised, as one refused PUB per client attempt would flood the log."""
        line = f"[{remote_address}] - {err}"
        if err.code in _WRITE_FAILURE_CODES:
            self.fault_log.failed(_REFUSED_WRITES, line)
        else:
            self.logger.error(line)

    # ------------------------------------------------------------------ shutdown

    def put_many_logged(self, backend: Backend, msgs: list[Message], context: str) -> bool:
        try:
            backend.put_many([m.encode() for m in msgs])
        except (DiskQueueError, OSError) as exc:
            self.logger.error(f"{context} ERROR: failed to write messages to backend - {exc}")
            return False
        return True

    def close_backend(self, backend: Backend, context: str) -> None:
        try:
            backend.close()
        except (DiskQueueError, OSError) as exc:
            self.logger.error(f"{context} ERROR: failed to close backend - {exc}")
