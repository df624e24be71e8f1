"""Bounded queues: ``--max-queue-bytes`` and ``--queue-full-policy`` (nsqpy addition;
docs/beyond-go.md, nsqio/nsq#549).

**What a queue's bytes are.** The bytes its queued messages take as disk-queue records,
``4 (length) + 26 (timestamp, attempts, ID) + body`` per message, for every message in its
memory queue plus every record its disk queue has not read yet (from the read position to the
write position: ``DiskQueue.positions()`` and the sizes of the finished files in between). So a
message counts the same in memory or on disk, and queue bytes follow ``depth`` (memory + disk).
A channel's in-flight and deferred messages are not in its queue (as for ``depth``) and do not
count.

**When it is checked.** On every publish (PUB, MPUB, DPUB, HTTP ``/pub`` and ``/mpub``, a
dead-letter move), against the topic's own queue and each of its channels' queues that has a
cap: the publish needs room for all its messages in each of them. Messages nsqd has already
accepted (a topic's backlog moving on to its channels, REQ, an in-flight timeout, a deferral
coming due) always enter their queue, which may then stand above its cap for a while.

**Policies.** ``refuse``: a publish that does not fit fails as a whole, with nothing stored
(``E_PUB_FAILED``/``E_MPUB_FAILED``/``E_DPUB_FAILED``, HTTP 503 ``QUEUE_FULL``). ``drop-oldest``:
each full queue discards its oldest messages by publish time until the publish fits: each time
the older of its memory queue's head and its disk queue's head (read from the data file at the
read position; memory first on a tie); a requeued message re-enters at the back. Lowering a
channel's cap with ``/channel/config`` under ``drop-oldest`` trims the queue at once. A publish
bigger than a cap on its own is refused under either policy. When some queues refuse and others
would drop, the publish is refused and nothing is dropped.

**Counts** (messages) are kept per topic and channel: ``queue_dropped_count`` (discarded by
drop-oldest) and ``queue_refused_count`` (refused publishes' messages; on a topic, all refused
for it, on a channel those refused because it was full). Each change is appended to
``nsqpy.queue_counts.jsonl`` with one ``write(2)`` before the publish is answered, so a killed
nsqd keeps them; a count can only exceed what was really lost (after SIGKILL a dropped record
may come back, as a finished one can in Go). Per-channel settings live in
``nsqpy.queue_limits.json``. Go ignores both files.
"""

from __future__ import annotations

import json
import os
import struct
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, SupportsIndex

from ...protocol import MESSAGE_HEADER_LENGTH
from ..diskqueue import DiskQueue
from ..metadata import read_journal, write_atomically
from ..topic import TopicError

if TYPE_CHECKING:
    from ..backend import Backend
    from ..channel import Channel
    from ..memory_queue import Run
    from ..message import Message
    from ..nsqd import NSQD
    from ..options import Options
    from ..topic import Topic

    Queue = Topic | Channel

#: A message's bytes beyond its body: the disk record's length prefix and the message header.
RECORD_OVERHEAD = 4 + MESSAGE_HEADER_LENGTH
REFUSE = "refuse"
DROP_OLDEST = "drop-oldest"
POLICIES = (REFUSE, DROP_OLDEST)
SETTINGS_FILE = "nsqpy.queue_limits.json"
COUNTS_FILE = "nsqpy.queue_counts.jsonl"
#: The counts journal is rewritten as totals at start-up once it has this many lines.
COMPACT_LINES = 10000
#: Where a message's ID sits in its disk record (after BE64 timestamp and BE16 attempts).
_ID = slice(10, 26)
#: A disk record's length prefix and its message's publish timestamp.
_HEAD = struct.Struct(">iQ")

Key = tuple[str, str]  # (topic, channel); channel "" for the topic's own queue


class QueueFullError(TopicError):
    """A publish refused by ``--queue-full-policy=refuse`` (or too big for a cap)."""


def validate_queue_options(opts: Options) -> None:
    if opts.max_queue_bytes < 0:
        raise ValueError("--max-queue-bytes must not be negative")
    if opts.queue_full_policy not in POLICIES:
        raise ValueError("--queue-full-policy must be 'refuse' or 'drop-oldest'")
    if opts.max_defer_timeout < 0:
        raise ValueError("--max-defer-timeout must not be negative")


def record_size(msg: Message) -> int:
    return RECORD_OVERHEAD + len(msg.body)


class SizedQueue(deque["Message"]):
    """A capped queue's memory queue: a deque that keeps its messages' bytes in ``nbytes`` and
    carries the cap. Only capped queues get one, so uncapped queues keep the plain deque's speed.
    """

    __slots__ = ("limit", "nbytes", "policy", "span")

    def __init__(self, limit: int, policy: str, items: Iterable[Message] = ()) -> None:
        super().__init__()
        self.limit = limit
        self.policy = policy
        self.nbytes = 0
        # (read file, write file, bytes of the finished files from read to write - 1)
        self.span: tuple[int, int, int] = (-1, -1, 0)
        self.extend(items)

    def append(self, msg: Message) -> None:
        super().append(msg)
        self.nbytes += RECORD_OVERHEAD + len(msg.body)

    def appendleft(self, msg: Message) -> None:
        super().appendleft(msg)
        self.nbytes += RECORD_OVERHEAD + len(msg.body)

    def extend(self, msgs: Iterable[Message]) -> None:
        msgs = list(msgs)
        super().extend(msgs)
        self.nbytes += RECORD_OVERHEAD * len(msgs) + sum([len(m.body) for m in msgs])

    def __iadd__(self, msgs: Iterable[Message]) -> SizedQueue:
        self.extend(msgs)
        return self

    def popleft(self) -> Message:
        msg = super().popleft()
        self.nbytes -= RECORD_OVERHEAD + len(msg.body)
        return msg

    def pop(self) -> Message:  # type: ignore[override]  # deque.pop takes no index
        msg = super().pop()
        self.nbytes -= RECORD_OVERHEAD + len(msg.body)
        return msg

    def clear(self) -> None:
        super().clear()
        self.nbytes = 0

    # rare edits: recount
    def remove(self, msg: Message) -> None:
        super().remove(msg)
        self._recount()

    def extendleft(self, msgs: Iterable[Message]) -> None:
        super().extendleft(msgs)
        self._recount()

    def insert(self, index: int, msg: Message) -> None:
        super().insert(index, msg)
        self._recount()

    def __delitem__(self, index: SupportsIndex) -> None:  # type: ignore[override]
        super().__delitem__(index)
        self._recount()

    def __setitem__(self, index: SupportsIndex, msg: Message) -> None:  # type: ignore[override]
        super().__setitem__(index, msg)
        self._recount()

    def _recount(self) -> None:
        self.nbytes = RECORD_OVERHEAD * len(self) + sum([len(m.body) for m in self])

    def take(self, count: int) -> list[Message]:
        """Up to ``count`` messages from the head (a channel's consumers take in batches)."""
        popleft = self.popleft
        return [popleft() for _ in range(min(count, len(self)))]

    def take_runs(self, count: int) -> list[Run]:
        """:meth:`take` as one run (a capped queue keeps messages, never runs)."""
        taken = self.take(count)
        return [taken] if taken else []


class QueueCounts:
    __slots__ = ("dropped", "refused")

    def __init__(self) -> None:
        self.dropped = 0
        self.refused = 0

    def __bool__(self) -> bool:
        return bool(self.dropped or self.refused)


def disk_bytes(backend: Backend, memory: SizedQueue | None = None) -> int:
    """Bytes of the records ``backend`` has not read yet (0 for a non-disk backend).
    ``memory``, if given, caches the finished files' sizes while the positions stay in them."""
    queue = backend.disk_queue()
    if queue is None:
        return 0
    _, read_num, read_pos, write_num, write_pos = queue.positions()
    if read_num == write_num:
        return max(0, write_pos - read_pos)
    span = memory.span if memory is not None else (-1, -1, 0)
    if span[0] != read_num or span[1] != write_num:
        total = 0
        for num in range(read_num, write_num):  # finished files: their size no longer changes
            try:
                total += os.path.getsize(queue.file_name(num))
            except OSError:
                pass  # gone (corrupt, renamed .bad): the reader skips it too
        span = (read_num, write_num, total)
        if memory is not None:
            memory.span = span
    return max(0, span[2] - read_pos + write_pos)


class DiskHead:
    """Reads the publish timestamp of the next record a disk queue will read, from its data
    file at the read position (the queue's reader is not touched). The file stays open for the
    reads of one drop run; :meth:`close` ends it."""

    __slots__ = ("_fd", "_num", "backend")

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._fd: int | None = None
        self._num = -1

    def timestamp(self) -> int | None:
        """None when the queue has no record or it cannot be read."""
        queue = self.backend.disk_queue()
        if queue is None:
            return None
        _, read_num, read_pos, write_num, write_pos = queue.positions()
        if read_num == write_num and read_pos >= write_pos:
            return None
        # at the end of a finished file, the next record starts the following file
        for num, pos in ((read_num, read_pos), (read_num + 1, 0)):
            if num > write_num:
                break
            try:
                head = os.pread(self._open(queue, num), _HEAD.size, pos)
            except OSError:
                return None
            if len(head) == _HEAD.size:
                return int(_HEAD.unpack(head)[1])
        return None

    def _open(self, backend: DiskQueue, num: int) -> int:
        if self._fd is None or self._num != num:
            self.close()
            self._fd = os.open(backend.file_name(num), os.O_RDONLY)
            self._num = num
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def queue_bytes(queue: Queue) -> int:
    memory = queue.memory_queue
    if isinstance(memory, SizedQueue):
        return memory.nbytes + disk_bytes(queue.backend, memory)
    return sum([record_size(m) for m in memory]) + disk_bytes(queue.backend)


def _key(queue: Queue) -> Key:
    from ..channel import Channel

    if isinstance(queue, Channel):
        return (queue.topic.name, queue.name)
    return (queue.name, "")


def _describe(queue: Queue) -> str:
    key = _key(queue)
    return f"channel {key[1]}" if key[1] else f"topic {key[0]}"


class QueueLimits:
    """The caps of every queue, the publish check, the drops, the counts and their files."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        #: True when any queue may have a cap: the publish path calls :meth:`admit` only then.
        self.active = False
        self.overrides: dict[Key, tuple[int, str]] = {}  # per channel: (max bytes, policy)
        self.counts: dict[Key, QueueCounts] = {}
        self._journal: int | None = None
        self._journal_failed = False
        self._journal_lines = 0

    # ------------------------------------------------------------------ settings

    def load(self) -> None:
        """Settings and counts, at start-up before topics and channels exist."""
        self._load_settings()
        self._load_counts()
        self._refresh_active()

    def _refresh_active(self) -> None:
        self.active = self.nsqd.options.max_queue_bytes > 0 or any(
            limit > 0 for limit, _ in self.overrides.values()
        )

    def effective(self, key: Key) -> tuple[int, str]:
        override = self.overrides.get(key)
        if override is not None:
            return override
        opts = self.nsqd.options
        return opts.max_queue_bytes, opts.queue_full_policy

    def apply(self, queue: Queue) -> None:
        """Give a topic or channel its cap: a :class:`SizedQueue` if it has one, else its
        usual memory queue back."""
        key = _key(queue)
        limit, policy = self.effective(key)
        memory = queue.memory_queue
        if limit > 0:
            if isinstance(memory, SizedQueue):
                memory.limit, memory.policy = limit, policy
            else:
                queue.memory_queue = SizedQueue(limit, policy, memory)
        elif isinstance(memory, SizedQueue):
            queue.memory_queue = queue.uncapped_memory_queue(memory)

    def configure(self, channel: Channel, limit: int, policy: str) -> None:
        """``POST /channel/config``: keep the setting; under drop-oldest, trim at once."""
        key = _key(channel)
        self.overrides[key] = (limit, policy)
        self._save_settings()
        self._refresh_active()
        self.apply(channel)
        memory = channel.memory_queue
        if isinstance(memory, SizedQueue) and policy == DROP_OLDEST:
            excess = queue_bytes(channel) - limit
            if excess > 0:
                self._drop_oldest(channel, excess)

    def forget(self, topic: str, channel: str | None = None) -> None:
        """A deleted topic (and its channels) or channel loses its settings and counts."""

        def doomed(key: Key) -> bool:
            return key[0] == topic and (channel is None or key[1] == channel)

        settings = [k for k in self.overrides if doomed(k)]
        for key in settings:
            del self.overrides[key]
        if settings:
            self._save_settings()
            self._refresh_active()
        counted = [k for k in self.counts if doomed(k)]
        for key in counted:
            del self.counts[key]
        if counted:
            self._append({"topic": topic, "channel": channel, "reset": True})

    def describe(self, queue: Queue) -> dict[str, Any] | None:
        """The extra keys for /stats and /channel/config; None for a queue without a cap or
        counts (it keeps exactly Go's keys)."""
        key = _key(queue)
        limit, policy = self.effective(key)
        counts = self.counts.get(key)
        if limit <= 0 and not counts and key not in self.overrides:
            return None
        return {
            "max_queue_bytes": limit,
            "queue_full_policy": policy,
            "queue_bytes": queue_bytes(queue),
            "queue_dropped_count": counts.dropped if counts else 0,
            "queue_refused_count": counts.refused if counts else 0,
        }

    # ------------------------------------------------------------------ the check

    def admit(self, topic: Topic, msgs: Sequence[Message]) -> None:
        """Before ``msgs`` are published to ``topic``: make room (drop-oldest) or raise
        :class:`QueueFullError` (refuse), having stored and dropped nothing."""
        capped: list[Queue] = [topic] if isinstance(topic.memory_queue, SizedQueue) else []
        capped.extend(c for c in topic.channels.values() if isinstance(c.memory_queue, SizedQueue))
        if not capped:
            return
        incoming = RECORD_OVERHEAD * len(msgs) + sum([len(m.body) for m in msgs])
        full: list[tuple[Queue, int]] = []
        over: list[tuple[Queue, int]] = []
        for queue in capped:
            memory = queue.memory_queue
            assert isinstance(memory, SizedQueue)
            used = memory.nbytes + disk_bytes(queue.backend, memory)
            if used + incoming <= memory.limit:
                continue
            if memory.policy == REFUSE or incoming > memory.limit:
                full.append((queue, used))
            else:
                over.append((queue, used + incoming - memory.limit))
        if full:
            self._refuse(topic, full, len(msgs), incoming)
        for queue, excess in over:
            self._drop_oldest(queue, excess)

    def _refuse(self, topic: Topic, full: list[tuple[Queue, int]], count: int, size: int) -> None:
        keys = {(topic.name, "")} | {_key(queue) for queue, _ in full}
        for key in sorted(keys):
            self.counts.setdefault(key, QueueCounts()).refused += count
            self._append({"topic": key[0], "channel": key[1], "refused": count})
        queue, used = full[0]
        memory = queue.memory_queue
        assert isinstance(memory, SizedQueue)
        raise QueueFullError(
            f"queue full ({_describe(queue)}: {used} + {size} > {memory.limit} bytes)"
        )

    def _drop_oldest(self, queue: Queue, excess: int) -> None:
        """Discard ``queue``'s oldest messages (by publish time: the older of its memory
        queue's head and its disk queue's head, each time) until ``excess`` bytes are free."""
        memory = queue.memory_queue
        assert isinstance(memory, SizedQueue)
        backend = queue.backend
        skip_ids = queue.skip_ids
        freed = dropped = 0
        head = DiskHead(backend)
        disk_ts: int | None = None  # the disk head's, until a record is taken from the disk
        peeked = False
        try:
            while freed < excess:
                if memory and not peeked:
                    disk_ts, peeked = head.timestamp(), True
                if memory and (disk_ts is None or memory[0].timestamp <= disk_ts):
                    freed += record_size(memory.popleft())
                    dropped += 1
                    continue
                data = backend.get()
                peeked = False
                if data is None:
                    break
                freed += 4 + len(data)
                if skip_ids and bytes(data[_ID]) in skip_ids:
                    skip_ids.discard(bytes(data[_ID]))  # a restored deferred message's old copy
                    continue
                dropped += 1
        finally:
            head.close()
        if dropped:
            key = _key(queue)
            self.counts.setdefault(key, QueueCounts()).dropped += dropped
            self._append({"topic": key[0], "channel": key[1], "dropped": dropped})

    # ------------------------------------------------------------------ files

    def _load_settings(self) -> None:
        path = os.path.join(self.nsqd.data_path, SETTINGS_FILE)
        try:
            with open(path, "rb") as handle:
                data = json.loads(handle.read())
            for entry in data.get("channels", []):
                policy = str(entry["queue_full_policy"])
                limit = int(entry["max_queue_bytes"])
                if policy in POLICIES and limit >= 0:
                    self.overrides[(entry["topic"], entry["channel"])] = (limit, policy)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.nsqd.logger.error(f"ignoring {SETTINGS_FILE}: {exc}")

    def _save_settings(self) -> None:
        entries = [
            {"topic": t, "channel": c, "max_queue_bytes": limit, "queue_full_policy": policy}
            for (t, c), (limit, policy) in sorted(self.overrides.items())
        ]
        data = json.dumps({"version": 1, "channels": entries}).encode()
        try:
            write_atomically(os.path.join(self.nsqd.data_path, SETTINGS_FILE), data)
        except OSError as exc:
            self.nsqd.logger.error(f"failed to persist {SETTINGS_FILE} - {exc}")

    def _load_counts(self) -> None:
        path = os.path.join(self.nsqd.data_path, COUNTS_FILE)
        entries, line_count = read_journal(path, self.nsqd.logger)
        for entry in entries:
            try:
                self._replay(entry)
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash, or a field of the wrong kind
        self._journal_lines = line_count
        if line_count > COMPACT_LINES:
            self._compact()

    def _replay(self, entry: dict[str, Any]) -> None:
        topic, channel = str(entry["topic"]), entry["channel"]
        if entry.get("reset"):
            for key in [k for k in self.counts if k[0] == topic and channel in (None, k[1])]:
                del self.counts[key]
            return
        counts = self.counts.setdefault((topic, str(channel)), QueueCounts())
        counts.dropped += int(entry.get("dropped", 0))
        counts.refused += int(entry.get("refused", 0))

    def _append(self, entry: dict[str, Any]) -> None:
        """One line per change, written (to the kernel) before the publish is answered."""
        line = (json.dumps(entry) + "\n").encode()
        try:
            if self._journal is None:
                path = os.path.join(self.nsqd.data_path, COUNTS_FILE)
                self._journal = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(self._journal, line)
            self._journal_lines += 1
            self._journal_failed = False
        except OSError as exc:
            if not self._journal_failed:  # said once per failing spell, not per publish
                self.nsqd.logger.error(f"failed to record queue counts - {exc}")
            self._journal_failed = True

    def _compact(self) -> None:
        """Rewrite the journal as one line of totals per queue."""
        entries = [
            {"topic": t, "channel": c, "dropped": n.dropped, "refused": n.refused}
            for (t, c), n in sorted(self.counts.items())
            if n
        ]
        data = "".join(json.dumps(e) + "\n" for e in entries).encode()
        self.close()
        try:
            write_atomically(os.path.join(self.nsqd.data_path, COUNTS_FILE), data)
            self._journal_lines = len(entries)
        except OSError as exc:
            self.nsqd.logger.error(f"failed to compact {COUNTS_FILE} - {exc}")

    def shutdown(self) -> None:
        """Clean shutdown: the journal becomes its totals."""
        if self._journal_lines > len(self.counts):
            self._compact()
        self.close()

    def close(self) -> None:
        if self._journal is not None:
            os.close(self._journal)
            self._journal = None
