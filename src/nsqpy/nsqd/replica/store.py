"""The peer's store: what one owner incarnation streamed that is not finished yet, on disk.

docs/replication.md ("The peer's store", "Takeover") is the design. The store appends each
event batch the owner sends to a log, applies it to an index in memory (per topic and channel,
the unfinished message IDs with their attempts and deferral; an MPUB's messages as one entry
until an event touches one of them), and lists the index for a takeover. Opening a store
replays its log; a record a crash cut short ends the replay.

One file per owner incarnation, ``<owner>+<incarnation>.replica`` (both percent-quoted):

    header   b"NSQR1LOG" | BE32 n | n bytes of JSON {"owner", "incarnation", "base_seq"}
    records  BE32 size | BE32 crc32 | BE64 seq | encode_events(batch)

``size`` counts what follows it; the CRC covers the sequence number and the events. A record's
events are numbered ``seq``, ``seq + 1``, ...; numbered records follow one another without gap
from ``base_seq + 1``. Records with ``seq`` 0 come first and hold a compacted snapshot: the
state after event ``base_seq``, written again as events (puts, attempts, deferrals, channel and
topic state). Compaction writes a new file (snapshot only), fsyncs it, renames it over the log
and fsyncs the directory, so a crash leaves either the old log or the new one.

Deferrals are kept as due times by the injected (monotonic) clock. A replay cannot know how
long the store was closed, so it counts each deferral again from the replay: a deferred
message is never due earlier than the owner asked, and may be due later by the downtime.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import struct
import time
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, NamedTuple
from urllib.parse import quote

from ...internal.lg import Logger
from ...protocol.replica import (
    ID_SIZE,
    OP_CREATE,
    OP_DELETE,
    OP_EMPTY,
    OP_PAUSE,
    OP_UNPAUSE,
    RECORD_FIXED,
    RECORD_HEAD,
    Attempts,
    ChannelOp,
    Defer,
    Event,
    Fanout,
    Fin,
    Put,
    Puts,
    ReplicaProtocolError,
    Run,
    TopicOp,
    decode_events,
    decode_run_at,
    encode_events,
    record_count,
    split_ids,
    split_run_at,
)

MAGIC = b"NSQR1LOG"
SUFFIX = ".replica"
_HEADER_SIZE = struct.Struct(">I")
_RECORD_HEAD = struct.Struct(">IIQ")  # size, crc32, seq
_SEQ = struct.Struct(">Q")
_U32 = struct.Struct(">I")
#: the part of a record's size that is not events: its CRC and sequence number
_RECORD_FIXED = _RECORD_HEAD.size - 4
#: sequence number of the records of a compacted snapshot
SNAPSHOT_SEQ = 0
#: a snapshot is written in records of about this many messages' events, so no one record (and
#: no one encoded buffer) grows with the store
SNAPSHOT_BATCH = 512
#: a log smaller than this is never compacted: rewriting it would cost more than it frees
DEFAULT_COMPACT_FLOOR = 1 << 20
#: the fewest messages a FANOUT or FIN splits off a pending run (fewer: the run is indexed
#: message by message), so a trickle of small batches costs each message one index entry, not
#: a copy of the rest of its run for every batch
MIN_SPLIT = 32
#: what a live message and a live copy cost in a compacted log beyond the body, roughly: the
#: estimate only decides when compaction is worth it
_MESSAGE_COST = 64
_COPY_COST = 24

LogFunc = Callable[[str, str], None]


class ReplicaStoreError(Exception):
    """The store's file is not a store of this owner incarnation, or the store is closed."""


class SequenceGap(ValueError):
    """Events were offered after a gap: the store cannot apply event ``seq`` before the ones
    between its last and it."""


# -- what a takeover puts into the local nsqd ---------------------------------------------


@dataclass(frozen=True, slots=True)
class TakenMessage:
    """One unfinished copy: ``defer`` is the remaining deferral in seconds (0: due now)."""

    msg_id: bytes
    timestamp: int
    attempts: int
    body: bytes
    defer: float


@dataclass(frozen=True, slots=True)
class TakenChannel:
    name: str
    paused: bool
    messages: tuple[TakenMessage, ...]


@dataclass(frozen=True, slots=True)
class TakenTopic:
    """A topic's channels and its topic-held messages (a Put not yet assigned to channels,
    which goes to the local topic, not to a channel)."""

    name: str
    paused: bool
    channels: dict[str, TakenChannel]
    held: tuple[TakenMessage, ...]


@dataclass(frozen=True, slots=True)
class Takeover:
    owner: str
    incarnation: str
    stored_seq: int
    topics: dict[str, TakenTopic]


# -- the index -----------------------------------------------------------------------------


#: a message with at least one unfinished copy (a channel's, or the topic's while it waits
#: there): ``(timestamp, attempts, at, length)``, its body ``length`` bytes at offset ``at`` of
#: the log, read back only for a takeover or a compaction: a peer holds the bodies of what it
#: keeps for its owners on disk, not in memory. A plain tuple, not an object with a reference
#: count, as every published message becomes one; whether a copy is left is looked up in the
#: topic's few channels instead.
_Message = tuple[int, int, int, int]
_TIMESTAMP: Final = 0
_ATTEMPTS: Final = 1
_AT: Final = 2
_LENGTH: Final = 3


class _RunRef:
    """A :class:`Run`'s messages in the log, one object for all of them (their entry in the
    topic's table): ``size`` bytes at ``at`` hold their IDs and bodies, split only when read
    back. Every MPUB a peer replicates passes here, so taking one in is a few dict updates in
    C, not a loop over its messages. Their attempts are 0: a run is a publish's."""

    __slots__ = ("at", "body_bytes", "count", "size", "timestamp")

    def __init__(self, timestamp: int, at: int, size: int, count: int, body_bytes: int) -> None:
        self.timestamp = timestamp
        self.at = at
        self.size = size
        self.count = count
        self.body_bytes = body_bytes


#: a message's entry in its topic's table: its own, or its run's
_Entry = _Message | _RunRef
#: a message as read back from the log: timestamp, attempts, body
_Read = tuple[int, int, bytes]


def _attempts_of(entry: _Entry) -> int:
    return 0 if isinstance(entry, _RunRef) else entry[_ATTEMPTS]


def _length_of(entry: _Entry) -> int:
    """A message's body length: a run's messages count as its average, as the length only
    feeds the estimate of what is live."""
    if isinstance(entry, _RunRef):
        return entry.body_bytes // entry.count
    return entry[_LENGTH]


class _Channel:
    """A channel's unfinished copies: ID -> attempts, and the deferred ones' due times."""

    __slots__ = ("copies", "deferred", "paused")

    def __init__(self) -> None:
        self.paused = False
        self.copies: dict[bytes, int] = {}
        self.deferred: dict[bytes, float] = {}


class _PendingRun:
    """A run taken in but not yet indexed message by message: its messages' IDs end to end
    in one bytes object (16 bytes a message, where a dict of them would hold a bytes object
    and an entry each: a backlog's peer would grow by about 100 bytes a message), and the
    channels it was put to (None: held by the topic). Nothing has touched its messages since,
    so they are all as the run left them: on each of ``channels`` (or held), attempts 0, not
    deferred. A backlog a peer holds for its owner stays in these, one per MPUB, instead of
    in tables with an entry per message, which grow (and are resized whole) with it."""

    __slots__ = ("channels", "id_bytes", "ref")

    def __init__(self, ref: _RunRef, id_bytes: bytes, channels: tuple[str, ...] | None) -> None:
        self.ref = ref
        self.id_bytes = id_bytes
        self.channels = channels

    def count(self) -> int:
        return len(self.id_bytes) // ID_SIZE

    def ids(self) -> tuple[bytes, ...]:
        return split_ids(self.id_bytes, 0, self.count())

    def first(self) -> bytes:
        """The run's lowest ID (its first)."""
        return self.id_bytes[:ID_SIZE]

    def last(self) -> bytes:
        """The run's highest ID (its last)."""
        return self.id_bytes[-ID_SIZE:]

    def holds(self, msg_id: bytes) -> bool:
        if len(msg_id) != ID_SIZE:
            return False
        at = self.id_bytes.find(msg_id)
        while at > 0 and at % ID_SIZE:  # a match across two IDs: look further
            at = self.id_bytes.find(msg_id, at + 1)
        return at >= 0

    def starts(self, ids: Sequence[bytes]) -> bool:
        """Whether ``ids`` (of ID_SIZE bytes each, as decoded) are this run's first
        ``len(ids)`` IDs, in order."""
        return self.id_bytes.startswith(b"".join(ids))

    def split(self, count: int) -> _PendingRun:
        """Keep the IDs after the first ``count``; those first, as a run of their own."""
        cut = count * ID_SIZE
        head = _PendingRun(self.ref, self.id_bytes[:cut], self.channels)
        self.id_bytes = self.id_bytes[cut:]
        return head

    def copies(self) -> int:
        return self.count() * (1 if self.channels is None else len(self.channels))

    def cost(self) -> int:
        """What it adds to the estimate of live bytes: its share of the run's bodies, and
        each message's and channel copy's (a topic's hold costs nothing more)."""
        count = self.count()
        body_bytes = self.ref.body_bytes * count // self.ref.count
        per_message = _MESSAGE_COST + len(self.channels or ()) * _COPY_COST
        return body_bytes + count * per_message


class _Topic:
    __slots__ = ("channels", "held", "messages", "paused", "pending", "pending_firsts")

    def __init__(self) -> None:
        self.paused = False
        self.messages: dict[bytes, _Entry] = {}
        #: IDs waiting in the topic for a Fanout, with a DPUB's due time (0.0: none)
        self.held: dict[bytes, float] = {}
        self.channels: dict[str, _Channel] = {}
        #: runs not indexed message by message yet, in ID order, their IDs' ranges apart
        #: (``pending_firsts`` holds each one's lowest ID, to find the run of an ID)
        self.pending: list[_PendingRun] = []
        self.pending_firsts: list[bytes] = []

    def unused(self, msg_id: bytes) -> bool:
        """Whether no copy of the message is left: neither the topic's nor a channel's."""
        if msg_id in self.held:
            return False
        return not any(msg_id in channel.copies for channel in self.channels.values())


def store_file_name(owner: str, incarnation: str) -> str:
    # quote() escapes "+" and "/", so the name is one path component and the pair is unique
    return f"{quote(owner, safe='')}+{quote(incarnation, safe='')}{SUFFIX}"


def list_stores(directory: Path) -> list[tuple[str, str]]:
    """(owner, incarnation) of every store in ``directory``, read from the files' headers;
    a file whose header cannot be read is left out."""
    found = []
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        with contextlib.suppress(OSError, ReplicaStoreError), path.open("rb") as handle:
            header = _read_header(handle)
            found.append((header.owner, header.incarnation))
    return found


class ReplicaStore:
    """The unfinished copies one owner incarnation streamed to this node, durably."""

    __slots__ = (
        "_applied_seq",
        "_clock",
        "_compact_floor",
        "_compacted_size",
        "_fd",
        "_last_sync",
        "_live_bytes",
        "_log",
        "_log_size",
        "_stored_seq",
        "_sync_every",
        "_sync_timeout",
        "_topics",
        "_unsynced",
        "compactions",
        "incarnation",
        "owner",
        "path",
    )

    def __init__(
        self,
        directory: Path,
        owner: str,
        incarnation: str,
        *,
        sync_every: int,
        sync_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        logger: LogFunc | None = None,
        compact_floor: int = DEFAULT_COMPACT_FLOOR,
    ) -> None:
        self.owner = owner
        self.incarnation = incarnation
        self.path = Path(directory) / store_file_name(owner, incarnation)
        self._sync_every = max(1, sync_every)
        self._sync_timeout = sync_timeout
        self._clock = clock
        self._log: LogFunc = logger if logger is not None else Logger("[nsqd] ")
        self._compact_floor = compact_floor
        self._topics: dict[str, _Topic] = {}
        self._live_bytes = 0
        self._applied_seq = 0
        self._stored_seq = 0
        self._unsynced = 0
        self._last_sync = clock()
        self._fd = -1
        self._log_size = 0
        self._compacted_size = 0
        #: rewrites of the log since the store was opened
        self.compactions = 0
        self._open(Path(directory))

    # -- public ------------------------------------------------------------------------

    @property
    def stored_seq(self) -> int:
        """The last sequence number stored durably under the sync settings (0: none)."""
        return self._stored_seq

    @property
    def applied_seq(self) -> int:
        """The last sequence number applied (written, perhaps not yet fsynced)."""
        return self._applied_seq

    @property
    def log_size(self) -> int:
        return self._log_size

    def apply(
        self,
        seq: int,
        events: Sequence[Event],
        encoded: bytes | memoryview | None = None,
        stored: Callable[[], None] | None = None,
        *,
        sync: bool = True,
    ) -> None:
        """Append events ``seq``, ``seq + 1``, ... to the log and apply them. Events already
        applied (a resend after a reconnect) are skipped; a gap raises :class:`SequenceGap`.
        ``encoded`` is ``encode_events(events)`` if the caller has it (as it came from the
        owner): logged as it is. ``stored`` is called once the events are logged (and
        fsynced if the sync settings say so), before the index takes them in: the owner
        waits for the ACK it sends, not for the index. With ``sync`` False the store does
        not fsync: the caller does, off its loop (:meth:`sync_wanted`, :meth:`begin_sync`)."""
        self._check_open()
        if seq < 1:
            raise ValueError(f"sequence numbers start at 1, not {seq}")
        already = self._applied_seq + 1 - seq
        if already < 0:
            raise SequenceGap(f"events from {seq} offered after {self._applied_seq}")
        if already >= len(events):
            return
        if already:
            events, seq, encoded = events[already:], seq + already, None
        if encoded is None:  # encoded here, and decoded again for where the bodies are
            encoded = encode_events(events)
            events = decode_events(bytes(encoded))
        at = self._append(seq, encoded)
        # --sync-every counts messages, as nsqd's own queues do: a PUTS counts its records
        self._unsynced += sum(map(_message_count, events))
        self._applied_seq = seq + len(events) - 1
        if sync and self.sync_wanted():
            self.sync()
        if stored is not None:
            stored()
        self._apply_events(events, at)
        self._maybe_compact()

    @property
    def acks_after_sync(self) -> bool:
        """Whether what is logged counts as stored only once fsynced (--sync-every=1); else
        once written, its fsync to follow the sync settings, as nsqd's own OK does."""
        return self._sync_every == 1

    @property
    def acknowledgeable_seq(self) -> int:
        """The last sequence number stored under the sync settings' promise."""
        return self._stored_seq if self.acks_after_sync else self._applied_seq

    def sync_wanted(self) -> bool:
        """Whether --sync-every or --sync-timeout makes an fsync due."""
        return self._unsynced >= self._sync_every or self.sync_due()

    def begin_sync(self) -> tuple[int, int] | None:
        """An fsync to run off the caller's loop: a duplicate of the log's descriptor (for
        the runner to fsync and close) and the sequence number it covers, for
        :meth:`end_sync`; None if nothing is unsynced. Later appends count toward the next."""
        if self._fd < 0 or not self._unsynced:
            return None
        self._unsynced = 0
        return os.dup(self._fd), self._applied_seq

    def end_sync(self, seq: int, ok: bool) -> None:
        """The fsync :meth:`begin_sync` gave ended: what it covers is stored, or (``ok``
        False) still unsynced."""
        if not ok:
            self._unsynced = max(self._unsynced, 1)
            return
        self._stored_seq = max(self._stored_seq, seq)
        self._last_sync = self._clock()

    def sync_due(self) -> bool:
        """Whether events are unsynced and --sync-timeout has passed since the last fsync."""
        return self._unsynced > 0 and self._clock() - self._last_sync >= self._sync_timeout

    def sync(self) -> None:
        self._check_open()
        if self._unsynced:
            os.fsync(self._fd)
            self._unsynced = 0
        self._stored_seq = self._applied_seq
        self._last_sync = self._clock()

    def live_count(self) -> int:
        """Unfinished copies: one per channel holding a message, plus the topic-held ones."""
        return sum(
            len(topic.held)
            + sum(len(channel.copies) for channel in topic.channels.values())
            + sum(run.copies() for run in topic.pending)
            for topic in self._topics.values()
        )

    def forget_copies(self, topic: str, channel: str, ids: Sequence[bytes]) -> int:
        """Drop copies another node owns now (it took them over and streams them as its
        own); how many. Not logged: a replay brings them back, a duplicate at worst."""
        topic_index = self._topics.get(topic)
        held = topic_index.channels.get(channel) if topic_index is not None else None
        if topic_index is None or held is None:
            return 0
        self._unpend(topic_index, ids)
        dropped = 0
        for msg_id in ids:
            if msg_id in held.copies:
                self._drop_copy(topic_index, held, msg_id)
                dropped += 1
        return dropped

    def takeover(self) -> Takeover:
        self._check_open()
        now = self._clock()
        read = self._reader()
        for topic in self._topics.values():
            self._unpend_all(topic)
        topics = {
            name: _taken_topic(name, topic, read, now) for name, topic in self._topics.items()
        }
        return Takeover(self.owner, self.incarnation, self._stored_seq, topics)

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            self.sync()
        finally:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        """Close and remove the store's file (once its messages were taken over)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        _fsync_directory(self.path.parent)

    # -- the log -----------------------------------------------------------------------

    def _reader(self) -> Callable[[bytes, _Entry], _Read | None]:
        """A function reading a message back from the log, for a takeover or a compaction
        (which list the messages in the order they were put): a run is read and split once
        for its messages, the last one kept. None for a message of a run that does not
        split into its IDs' messages (logged): the owner sent it so, nothing else has it."""
        last: list[tuple[_RunRef, dict[bytes, bytes]]] = []

        def read(msg_id: bytes, entry: _Entry) -> _Read | None:
            if not isinstance(entry, _RunRef):
                return entry[_TIMESTAMP], entry[_ATTEMPTS], self._read(entry[_AT], entry[_LENGTH])
            if not last or last[0][0] is not entry:
                last[:] = [(entry, self._run_bodies(entry))]
            body = last[0][1].get(msg_id)
            return None if body is None else (entry.timestamp, 0, body)

        return read

    def _pending_event(self, topic: str, run: _PendingRun) -> Run | None:
        """A pending run's messages as a Run event (a part of the run the owner sent, if a
        Fanout split it); None if the run does not read back (logged)."""
        ref = run.ref
        if run.count() == ref.count:  # whole: its bytes as they are
            with contextlib.suppress(ReplicaProtocolError):  # (else logged just below)
                ids, as_sent = split_run_at(self._read(ref.at, ref.size))
                return Run(topic, ref.timestamp, ids, as_sent, run.channels)
        bodies = self._run_bodies(ref)
        if not bodies:
            return None
        ids = run.ids()
        parts = [bodies[msg_id] for msg_id in ids]
        sized = b"".join(part for body in parts for part in (_U32.pack(len(body)), body))
        return Run(topic, ref.timestamp, ids, sized, run.channels)

    def _run_bodies(self, run: _RunRef) -> dict[bytes, bytes]:
        try:
            ids, bodies = decode_run_at(self._read(run.at, run.size))
        except ReplicaProtocolError as exc:
            self._log("ERROR", f"{self.path.name}: a run at {run.at} does not read back: {exc}")
            return {}
        return dict(zip(ids, bodies, strict=True))

    def _read(self, at: int, length: int) -> bytes:
        data = os.pread(self._fd, length, at)
        if len(data) != length:
            raise ReplicaStoreError(f"{self.path.name}: the bytes at {at} are cut short")
        return data

    def _check_open(self) -> None:
        if self._fd < 0:
            raise ReplicaStoreError(f"replica store {self.path.name} is closed")

    def _open(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self._temp_path().unlink()  # a compaction a crash interrupted
        if not self.path.exists():
            self._rewrite(())
            return
        good_end = self._replay()
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        if good_end < self.path.stat().st_size:
            # drop the torn tail, so the next record follows the last good one
            os.ftruncate(self._fd, good_end)
        # what the replay read may still be only in the page cache of a crashed process
        os.fsync(self._fd)
        self._log_size = self._compacted_size = good_end
        self._stored_seq = self._applied_seq

    def _replay(self) -> int:
        """Apply the log's records; the offset after the last good one."""
        with self.path.open("rb") as handle:
            header = _read_header(handle)
            if (header.owner, header.incarnation) != (self.owner, self.incarnation):
                raise ReplicaStoreError(f"{self.path.name} belongs to {header}")
            self._applied_seq = header.base_seq
            file_size = os.fstat(handle.fileno()).st_size
            offset = handle.tell()
            numbered = False
            for seq, events, at, end in _records(handle, file_size, self._log):
                if seq == SNAPSHOT_SEQ and numbered:
                    self._log("ERROR", f"{self.path.name}: snapshot record at {offset}")
                    break
                if seq != SNAPSHOT_SEQ and seq != self._applied_seq + 1:
                    self._log("ERROR", f"{self.path.name}: record {seq} at {offset} out of order")
                    break
                self._apply_events(events, at)
                if seq != SNAPSHOT_SEQ:
                    numbered = True
                    self._applied_seq = seq + len(events) - 1
                offset = end
        return offset

    def _append(self, seq: int, encoded: bytes | memoryview) -> int:
        """Log the encoded events as record ``seq``; where in the file the events start."""
        head = _record_head(seq, encoded)
        size = len(head) + len(encoded)
        try:
            written = os.writev(self._fd, (head, encoded))
            if written < size:  # a short write: the rest
                _write_all(self._fd, memoryview(head + bytes(encoded))[written:])
        except OSError:
            # a short write (a full disk) must not leave a torn record for later ones to follow
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._log_size)
            raise
        at = self._log_size + _RECORD_HEAD.size
        self._log_size += size
        return at

    def _temp_path(self) -> Path:
        return self.path.with_name(self.path.name + ".tmp")

    def _rewrite(self, snapshot: Iterable[Event]) -> None:
        """Replace the log with a header and ``snapshot``: written to a temporary file,
        fsynced, renamed over the log, the directory fsynced. The index is built anew from
        what is written, as a replay of the new file would (the bodies' places change)."""
        temp = self._temp_path()
        # O_APPEND: after a failed write is truncated away, the next one follows the good end
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        old_index = self._topics, self._live_bytes
        self._topics, self._live_bytes = {}, 0
        try:
            size = _write_all(fd, _header(self.owner, self.incarnation, self._applied_seq))
            for batch in _batches(snapshot, SNAPSHOT_BATCH):
                encoded = encode_events(batch)
                size += _write_all(fd, _record(SNAPSHOT_SEQ, encoded))
                self._apply_events(decode_events(encoded), size - len(encoded))
            os.fsync(fd)
            os.rename(temp, self.path)
        except BaseException:
            self._topics, self._live_bytes = old_index
            os.close(fd)
            with contextlib.suppress(OSError):
                temp.unlink()
            raise
        # from the rename on, appends must go to the new file whatever fails next
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._log_size = self._compacted_size = size
        self._unsynced = 0
        self._last_sync = self._clock()
        _fsync_directory(self.path.parent)
        self._stored_seq = self._applied_seq

    def _maybe_compact(self) -> None:
        # the finished part passed half: the log is over twice what is live (and over twice
        # the last compaction's size, so an estimate that runs low cannot rewrite in a loop)
        threshold = 2 * max(self._live_bytes, self._compacted_size)
        if self._log_size <= self._compact_floor or self._log_size <= threshold:
            return
        try:
            self._rewrite(self._snapshot(self._topics))
            self.compactions += 1
        except OSError as exc:
            self._log("ERROR", f"{self.path.name}: compaction failed: {exc}")
            self._compacted_size = self._log_size  # try again once the log has doubled

    def _snapshot(self, topics: dict[str, _Topic]) -> Iterator[Event]:
        """The index written as events which, applied to an empty store, rebuild it."""
        now = self._clock()
        read = self._reader()
        for name, topic in topics.items():
            yield TopicOp(name, OP_CREATE)
            if topic.paused:
                yield TopicOp(name, OP_PAUSE)
            for channel_name, channel in topic.channels.items():
                yield ChannelOp(name, channel_name, OP_CREATE)
                if channel.paused:
                    yield ChannelOp(name, channel_name, OP_PAUSE)
            for msg_id, entry in list(topic.messages.items()):
                message = read(msg_id, entry)
                if message is not None:
                    yield from _message_events(name, topic, msg_id, message, now)
            for run in list(topic.pending):  # to stay pending after the rewrite
                event = self._pending_event(name, run)
                if event is not None:
                    yield event

    # -- the index ---------------------------------------------------------------------

    def _apply_events(self, events: Sequence[Event], at: int) -> None:
        """Apply ``events``, decoded from the log at offset ``at``, to the index."""
        for event in events:
            if isinstance(event, Run):
                self._run(event, at + _place(event))
            elif isinstance(event, Puts):
                self._puts(event, at + _place(event))
            elif isinstance(event, Put):
                self._put_message(
                    event.topic,
                    event.msg_id,
                    (event.timestamp, event.attempts, at + _place(event), len(event.body)),
                    event.channels,
                    self._due(event.defer_ms),
                )
            elif isinstance(event, Fin):
                self._fin(event)
            elif isinstance(event, Fanout):
                self._fanout(event)
            elif isinstance(event, Attempts):
                self._attempts(event)
            elif isinstance(event, Defer):
                self._defer(event)
            elif isinstance(event, ChannelOp):
                self._channel_op(event)
            else:
                self._topic_op(event)

    def _topic(self, name: str) -> _Topic:
        topic = self._topics.get(name)
        if topic is None:
            topic = self._topics[name] = _Topic()
        return topic

    def _channel(self, topic: _Topic, name: str) -> _Channel:
        channel = topic.channels.get(name)
        if channel is None:
            channel = topic.channels[name] = _Channel()
        return channel

    def _due(self, defer_ms: int) -> float:
        return self._clock() + defer_ms / 1000 if defer_ms > 0 else 0.0

    def _put_message(
        self,
        topic_name: str,
        msg_id: bytes,
        message: _Entry,
        channels: tuple[str, ...] | None,
        due: float,
    ) -> None:
        """A Put: the message (kept as first put, its attempts raised by a later put), held
        by the topic (``channels`` None) or copied to ``channels``."""
        topic = self._topic(topic_name)
        self._unpend(topic, (msg_id,))
        known = topic.messages.get(msg_id)
        attempts = _attempts_of(message)
        if known is None:
            topic.messages[msg_id] = message
            self._live_bytes += _length_of(message) + _MESSAGE_COST
        elif attempts <= _attempts_of(known):
            attempts = _attempts_of(known)
        elif isinstance(known, _RunRef):  # the later put's own copy of the body serves
            topic.messages[msg_id] = message
        else:
            timestamp, _, at, length = known
            topic.messages[msg_id] = (timestamp, attempts, at, length)
        if channels is None:
            topic.held[msg_id] = due
            return
        for name in channels:
            self._add_copy(topic, name, msg_id, attempts, due)
        if not channels and topic.unused(msg_id):  # put to no channel at all
            self._forget(topic, msg_id)

    def _puts(self, event: Puts, at: int) -> None:
        """A Put of each record (with the event's channels, no deferral), the records logged
        at offset ``at``. Every published message passes here: when all of them
        are new, the usual case, the index takes them in with a few dict updates."""
        topic = self._topic(event.topic)
        copies = None
        if event.channels is not None:
            copies = [self._channel(topic, name).copies for name in event.channels]
        records = event.records
        unpack = RECORD_HEAD.unpack_from
        first = at + RECORD_HEAD.size  # where the first record's body is in the log
        ids: list[bytes] = []
        entries: list[_Message] = []
        end = len(records)
        pos = 0
        while pos < end:
            size, timestamp, attempts, msg_id = unpack(records, pos)
            ids.append(msg_id)
            entries.append((timestamp, attempts, first + pos, size - RECORD_FIXED))
            pos += 4 + size
        count = len(ids)
        messages = topic.messages
        self._unpend(topic, ids)
        if copies == [] or not messages.keys().isdisjoint(ids) or len(set(ids)) != count:
            for msg_id, message in zip(ids, entries, strict=True):
                self._put_message(event.topic, msg_id, message, event.channels, 0.0)
            return
        # a copy implies its message: a new message is on no channel yet
        messages.update(zip(ids, entries, strict=True))
        if copies is None:
            topic.held.update(dict.fromkeys(ids, 0.0))
        else:
            attempts_of = dict(zip(ids, [entry[_ATTEMPTS] for entry in entries], strict=True))
            for channel_copies in copies:
                channel_copies.update(attempts_of)
        body_bytes = end - count * (4 + RECORD_FIXED)
        per_message = _MESSAGE_COST + len(copies or ()) * _COPY_COST
        self._live_bytes += body_bytes + count * per_message

    def _run(self, event: Run, at: int) -> None:
        """A Put of each of the run's messages (with the event's channels, no deferral), the
        run logged at offset ``at``: when all of them are new, the usual case, the run waits
        as one :class:`_PendingRun` until an event touches one of its messages."""
        topic = self._topic(event.topic)
        ids = event.ids
        count = len(ids)
        run = _RunRef(event.timestamp, at, event.size, count, len(event.bodies))
        channels = event.channels
        if channels:  # a pending run's copies count one per channel
            channels = tuple(dict.fromkeys(channels))
        # a run's IDs are new: its owner minted them for one publish, and its stream is sent
        # once (a resend is skipped by its sequence numbers). So no lookup of each in the
        # topic's table, which holds every unfinished message; only one ID twice in the run
        # itself (never from a sound owner) is taken message by message.
        if channels == () or len(set(ids)) != count:
            for msg_id in ids:
                self._put_message(event.topic, msg_id, run, channels, 0.0)
            return
        whole = _PendingRun(run, b"".join(ids), channels)
        self._live_bytes += whole.cost()
        first, last = ids[0], ids[-1]
        pending = topic.pending
        # an owner mints a topic's IDs in order, so its runs' ranges follow one another;
        # anything else is indexed now
        if min(ids) == first and max(ids) == last and (not pending or first > pending[-1].last()):
            pending.append(whole)
            topic.pending_firsts.append(first)
            for name in channels or ():  # as a Put of its messages would create them
                self._channel(topic, name)
        else:
            self._index_run(topic, run, ids, channels)

    def _index_run(
        self,
        topic: _Topic,
        run: _RunRef,
        ids: Sequence[bytes],
        channels: tuple[str, ...] | None,
    ) -> None:
        """A run's new messages ``ids`` into the topic's tables, in a few dict updates."""
        # a copy implies its message: a new message is on no channel yet
        topic.messages.update(dict.fromkeys(ids, run))
        if channels is None:
            topic.held.update(dict.fromkeys(ids, 0.0))
        else:
            fresh = dict.fromkeys(ids, 0)
            for name in channels:
                self._channel(topic, name).copies.update(fresh)

    def _unpend(self, topic: _Topic, ids: Collection[bytes]) -> None:
        """Index the pending runs that hold any of ``ids``, before an event touches them."""
        messages, pending, firsts = topic.messages, topic.pending, topic.pending_firsts
        if not pending or messages.keys() >= set(ids):  # the usual case: indexed already
            return
        for msg_id in ids:
            if msg_id in messages or not pending:
                continue
            place = bisect.bisect_right(firsts, msg_id) - 1
            if place >= 0 and pending[place].holds(msg_id):
                self._index_pending(topic, place)

    def _unpend_all(self, topic: _Topic) -> None:
        while topic.pending:
            self._index_pending(topic, 0)

    def _index_pending(self, topic: _Topic, place: int) -> None:
        run = topic.pending.pop(place)
        del topic.pending_firsts[place]
        self._index_run(topic, run.ref, run.ids(), run.channels)

    def _add_copy(self, topic: _Topic, name: str, msg_id: bytes, attempts: int, due: float) -> None:
        channel = self._channel(topic, name)
        known = channel.copies.get(msg_id)
        if known is None:
            self._live_bytes += _COPY_COST
            channel.copies[msg_id] = attempts
        elif attempts > known:
            channel.copies[msg_id] = attempts
        if due:
            channel.deferred[msg_id] = due

    def _forget(self, topic: _Topic, msg_id: bytes) -> None:
        entry = topic.messages.pop(msg_id)
        self._live_bytes -= _length_of(entry) + _MESSAGE_COST

    def _fanout(self, event: Fanout) -> None:
        topic = self._topics.get(event.topic)
        if topic is None:
            return
        ids = self._fan_out_pending(topic, event.ids, event.channels)
        self._unpend(topic, ids)
        held, messages = topic.held, topic.messages
        # not unknown, finished, or assigned already
        assigned = [msg_id for msg_id in dict.fromkeys(ids) if msg_id in held]
        if not assigned:
            return
        channels = [self._channel(topic, name) for name in event.channels]
        added = 0
        # _add_copy per message, inlined: every published message may pass here
        for msg_id in assigned:
            due = held.pop(msg_id)
            attempts = _attempts_of(messages[msg_id])
            for channel in channels:
                copies = channel.copies
                known = copies.get(msg_id)
                if known is None:
                    added += 1
                    copies[msg_id] = attempts
                elif attempts > known:
                    copies[msg_id] = attempts
                if due:
                    channel.deferred[msg_id] = due
            if not channels and topic.unused(msg_id):
                self._forget(topic, msg_id)
        self._live_bytes += added * _COPY_COST

    def _fan_out_pending(
        self, topic: _Topic, ids: tuple[bytes, ...], channels: tuple[str, ...]
    ) -> tuple[bytes, ...]:
        """A Fanout of held pending runs, as the owner's pump sends them: each run it names
        (see :meth:`_named_pending`) moves to ``channels`` and stays pending. The IDs left."""
        if not channels:
            return ids
        runs, rest = self._named_pending(topic, ids, lambda run: run.channels is None)
        channels = tuple(dict.fromkeys(channels))
        for run in runs:
            self._assign_pending(topic, run, channels)
        return rest

    def _finish_pending(
        self, topic: _Topic, ids: tuple[bytes, ...], name: str
    ) -> tuple[bytes, ...]:
        """A Fin of pending runs' copies on channel ``name``, as a consumer keeping up
        finishes them: each run it names (see :meth:`_named_pending`) leaves that channel,
        and the store once on no channel. The IDs left."""
        runs, rest = self._named_pending(
            topic, ids, lambda run: run.channels is not None and name in run.channels
        )
        for run in runs:
            channels = tuple(channel for channel in run.channels or () if channel != name)
            self._live_bytes -= run.cost() if not channels else run.count() * _COPY_COST
            run.channels = channels
            if not channels:
                place = bisect.bisect_left(topic.pending_firsts, run.first())
                del topic.pending[place], topic.pending_firsts[place]
        return rest

    def _named_pending(
        self, topic: _Topic, ids: tuple[bytes, ...], fits: Callable[[_PendingRun], bool]
    ) -> tuple[list[_PendingRun], tuple[bytes, ...]]:
        """The pending runs that ``ids`` name whole, one after the other from the first ID,
        each one that ``fits``; and of the next, the first part they name (``MIN_SPLIT`` or
        more), split off as a run of its own. The IDs after those are left: they take the
        message-by-message path."""
        pending, firsts = topic.pending, topic.pending_firsts
        named: list[_PendingRun] = []
        pos, end = 0, len(ids)
        while pos < end and pending:
            place = bisect.bisect_right(firsts, ids[pos]) - 1
            if place < 0 or firsts[place] != ids[pos] or not fits(pending[place]):
                break
            run = pending[place]
            size = run.count()
            if end - pos >= size and run.starts(ids[pos : pos + size]):
                named.append(run)
                pos += size
                continue
            if MIN_SPLIT <= end - pos < size and run.starts(ids[pos:]):
                named.append(self._split_pending(topic, place, end - pos))
                pos = end
            break
        return named, ids[pos:]

    def _split_pending(self, topic: _Topic, place: int, count: int) -> _PendingRun:
        """Split the pending run at ``place`` after its first ``count`` messages: the first
        part, a run of its own at ``place`` now."""
        head = topic.pending[place].split(count)
        topic.pending_firsts[place] = topic.pending[place].first()
        topic.pending.insert(place, head)
        topic.pending_firsts.insert(place, head.first())
        return head

    def _assign_pending(self, topic: _Topic, run: _PendingRun, channels: tuple[str, ...]) -> None:
        """A held pending run's messages copied to ``channels`` (new copies: attempts 0)."""
        run.channels = channels
        self._live_bytes += run.count() * len(channels) * _COPY_COST
        for name in channels:
            self._channel(topic, name)

    def _fin(self, event: Fin) -> None:
        topic = self._topics.get(event.topic)
        channel = topic.channels.get(event.channel) if topic is not None else None
        if topic is None or channel is None:
            return
        ids = self._finish_pending(topic, event.ids, event.channel)
        self._unpend(topic, ids)
        copies, deferred, messages, held = (
            channel.copies,
            channel.deferred,
            topic.messages,
            topic.held,
        )
        others = [other.copies for other in topic.channels.values() if other is not channel]
        dropped = freed = 0
        # _drop_copy per message, inlined: every finished message passes here
        for msg_id in ids:
            if copies.pop(msg_id, None) is None:
                continue
            if deferred:
                deferred.pop(msg_id, None)
            dropped += 1
            if msg_id in held or any(msg_id in other for other in others):
                continue
            freed += _length_of(messages.pop(msg_id)) + _MESSAGE_COST
        self._live_bytes -= dropped * _COPY_COST + freed

    def _drop_copy(self, topic: _Topic, channel: _Channel, msg_id: bytes) -> None:
        if channel.copies.pop(msg_id, None) is None:
            return
        channel.deferred.pop(msg_id, None)
        self._live_bytes -= _COPY_COST
        if topic.unused(msg_id):
            self._forget(topic, msg_id)

    def _copy_of(self, topic_name: str, channel_name: str, msg_id: bytes) -> _Channel | None:
        """The channel that holds a copy of the message, if any."""
        topic = self._topics.get(topic_name)
        channel = topic.channels.get(channel_name) if topic is not None else None
        if topic is None or channel is None:
            return None
        self._unpend(topic, (msg_id,))
        return channel if msg_id in channel.copies else None

    def _attempts(self, event: Attempts) -> None:
        channel = self._copy_of(event.topic, event.channel, event.msg_id)
        if channel is not None and event.attempts > channel.copies[event.msg_id]:
            channel.copies[event.msg_id] = event.attempts

    def _defer(self, event: Defer) -> None:
        channel = self._copy_of(event.topic, event.channel, event.msg_id)
        if channel is None:
            return
        if event.remaining_ms > 0:
            channel.deferred[event.msg_id] = self._due(event.remaining_ms)
        else:
            channel.deferred.pop(event.msg_id, None)

    def _channel_op(self, event: ChannelOp) -> None:
        if event.op in (OP_EMPTY, OP_DELETE):
            topic = self._topics.get(event.topic)
            channel = topic.channels.get(event.channel) if topic is not None else None
            if topic is None or channel is None:
                return
            self._unpend_all(topic)
            for msg_id in list(channel.copies):
                self._drop_copy(topic, channel, msg_id)
            if event.op == OP_DELETE:
                del topic.channels[event.channel]
            return
        # create, pause, unpause: the owner has the channel, so this node records it
        channel = self._channel(self._topic(event.topic), event.channel)
        if event.op in (OP_PAUSE, OP_UNPAUSE):
            channel.paused = event.op == OP_PAUSE

    def _drop_held(self, topic: _Topic) -> None:
        for msg_id in list(topic.held):
            del topic.held[msg_id]
            if topic.unused(msg_id):
                self._forget(topic, msg_id)

    def _topic_op(self, event: TopicOp) -> None:
        if event.op == OP_DELETE:
            topic = self._topics.get(event.topic)
            if topic is not None:
                self._live_bytes -= sum(run.cost() for run in topic.pending)
                for channel in topic.channels.values():
                    for msg_id in list(channel.copies):
                        self._drop_copy(topic, channel, msg_id)
                self._drop_held(topic)
                del self._topics[event.topic]
            return
        if event.op == OP_EMPTY:
            # Go's topic.Empty(): the topic's own queue only; the channels keep their copies
            topic = self._topics.get(event.topic)
            if topic is not None:
                self._unpend_all(topic)
                self._drop_held(topic)
            return
        topic = self._topic(event.topic)
        if event.op in (OP_PAUSE, OP_UNPAUSE):
            topic.paused = event.op == OP_PAUSE


# -- helpers -----------------------------------------------------------------------------


def _remaining(due: float, now: float) -> float:
    return max(0.0, due - now) if due else 0.0


def _remaining_ms(due: float, now: float) -> int:
    # rounded up: a rewritten deferral never ends earlier than the one it stands for
    return math.ceil(_remaining(due, now) * 1000)


def _taken_topic(
    name: str, topic: _Topic, read: Callable[[bytes, _Entry], _Read | None], now: float
) -> TakenTopic:
    """The topic's copies oldest first: in ID order, which is the order the owner put them
    (an owner mints a topic's IDs in order), however the index took them in."""
    messages: dict[bytes, _Read] = {}
    for msg_id, entry in sorted(topic.messages.items()):  # read once for all the copies
        message = read(msg_id, entry)
        if message is not None:
            messages[msg_id] = message

    def taken(msg_id: bytes, message: _Read, attempts: int, due: float) -> TakenMessage:
        timestamp, _, body = message
        return TakenMessage(msg_id, timestamp, attempts, body, _remaining(due, now))

    channels = {}
    for channel_name, channel in topic.channels.items():
        copies, deferred = channel.copies, channel.deferred
        copied = tuple(
            taken(msg_id, message, max(copies[msg_id], message[1]), deferred.get(msg_id, 0.0))
            for msg_id, message in messages.items()
            if msg_id in copies
        )
        channels[channel_name] = TakenChannel(channel_name, channel.paused, copied)
    held = tuple(
        taken(msg_id, message, message[1], topic.held[msg_id])
        for msg_id, message in messages.items()
        if msg_id in topic.held
    )
    return TakenTopic(name, topic.paused, channels, held)


def _message_events(
    name: str, topic: _Topic, msg_id: bytes, message: _Read, now: float
) -> Iterator[Event]:
    """One live message as events: its topic hold, its channel copies, their attempts above
    the message's own and their deferrals."""
    timestamp, attempts, body = message
    if msg_id in topic.held:
        defer_ms = _remaining_ms(topic.held[msg_id], now)
        yield Put(name, msg_id, timestamp, attempts, body, None, defer_ms)
    holders = [
        (channel_name, channel)
        for channel_name, channel in topic.channels.items()
        if msg_id in channel.copies
    ]
    if not holders:
        return
    names = tuple(channel_name for channel_name, _ in holders)
    yield Put(name, msg_id, timestamp, attempts, body, names)
    for channel_name, channel in holders:
        copy_attempts = channel.copies[msg_id]
        if copy_attempts > attempts:
            yield Attempts(name, channel_name, msg_id, copy_attempts)
        defer_ms = _remaining_ms(channel.deferred.get(msg_id, 0.0), now)
        if defer_ms:
            yield Defer(name, channel_name, msg_id, defer_ms)


def _header(owner: str, incarnation: str, base_seq: int) -> bytes:
    body = json.dumps(
        {"owner": owner, "incarnation": incarnation, "base_seq": base_seq},
        separators=(",", ":"),
    ).encode()
    return MAGIC + _HEADER_SIZE.pack(len(body)) + body


class _Header(NamedTuple):
    owner: str
    incarnation: str
    base_seq: int


def _read_header(handle: BinaryIO) -> _Header:
    # the header is written with the file, atomically: a bad one is not a torn write
    head = handle.read(len(MAGIC) + _HEADER_SIZE.size)
    if len(head) < len(MAGIC) + _HEADER_SIZE.size or not head.startswith(MAGIC):
        raise ReplicaStoreError("not a replica store (bad magic)")
    (size,) = _HEADER_SIZE.unpack_from(head, len(MAGIC))
    try:
        header = json.loads(handle.read(size))
        owner, incarnation, base_seq = header["owner"], header["incarnation"], header["base_seq"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ReplicaStoreError(f"bad replica store header: {exc}") from None
    if not isinstance(owner, str) or not isinstance(incarnation, str):
        raise ReplicaStoreError("bad replica store header")
    if not isinstance(base_seq, int) or base_seq < 0:
        raise ReplicaStoreError("bad replica store header")
    return _Header(owner, incarnation, base_seq)


def _record_head(seq: int, payload: bytes | memoryview) -> bytes:
    """The head of a log record of ``payload``, encoded events."""
    crc = zlib.crc32(payload, zlib.crc32(_SEQ.pack(seq)))
    return _RECORD_HEAD.pack(len(payload) + _RECORD_FIXED, crc, seq)


def _record(seq: int, payload: bytes | memoryview) -> bytes:
    """A log record of ``payload``, encoded events."""
    return _record_head(seq, payload) + payload


def _records(
    handle: BinaryIO, file_size: int, log: LogFunc
) -> Iterator[tuple[int, list[Event], int, int]]:
    """(seq, events, offset of the events, end offset) of each good record from the
    handle's position; stops (and logs) at the first record that is cut short or does not
    check."""
    offset = handle.tell()
    name = os.path.basename(str(getattr(handle, "name", "")))
    while offset < file_size:
        head = handle.read(_RECORD_HEAD.size)
        if len(head) < _RECORD_HEAD.size:
            log("WARN", f"{name}: ignoring a record cut short at {offset}")
            return
        size, crc, seq = _RECORD_HEAD.unpack(head)
        end = offset + 4 + size
        if size < _RECORD_FIXED or end > file_size:
            log("WARN", f"{name}: ignoring a record cut short at {offset}")
            return
        payload = handle.read(size - _RECORD_FIXED)
        if zlib.crc32(payload, zlib.crc32(_SEQ.pack(seq))) != crc:
            log("WARN", f"{name}: ignoring a record that fails its checksum at {offset}")
            return
        try:
            events = decode_events(payload)
        except ReplicaProtocolError as exc:
            log("ERROR", f"{name}: ignoring an undecodable record at {offset}: {exc}")
            return
        yield seq, events, offset + _RECORD_HEAD.size, end
        offset = end


def _message_count(event: Event) -> int:
    """What an event counts toward --sync-every: a PUTS its records, any other event one."""
    if isinstance(event, Puts):
        return event.count or record_count(event.records)
    if isinstance(event, Run):
        return len(event.ids)
    return 1


def _place(event: Put | Puts | Run) -> int:
    """Where the event's body (records) starts in its batch, as decoded."""
    if event.at < 0:
        raise ValueError("an event not decoded from a batch: its body has no place")
    return event.at


def _batches(events: Iterable[Event], size: int) -> Iterator[list[Event]]:
    """The events in batches of about ``size`` messages (a run counts each of its own)."""
    batch: list[Event] = []
    messages = 0
    for event in events:
        batch.append(event)
        messages += _message_count(event)
        if messages >= size:
            yield batch
            batch = []
            messages = 0
    if batch:
        yield batch


def _write_all(fd: int, data: bytes | memoryview) -> int:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return len(data)


def _fsync_directory(directory: Path) -> None:
    """Make a rename or an unlink in ``directory`` survive a power loss."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
