"""A channel: its queue of messages, its consumers, in-flight and deferred messages.

Go runs one goroutine pump per consumer competing for the channel's queue. Here the channel
hands a message straight to a ready consumer when it arrives, and pulls from its queue for a
consumer when that consumer becomes ready (RDY raised, a message finished, unpause). No
per-message timers: deadlines sit in heaps scanned by the nsqd queue-scan loop.

A channel knows its consumers only through the :class:`~nsqpy.nsqd.consumer.Consumer`
protocol (consumer.py): it reads their readiness, puts messages in flight itself (raising
their attempts) and hands them over; it never reaches into a connection.

The held mode (``--mem-queue-size=0 --sync-every=1``: each message's disk record kept until
it is finished) is beyond/channel_held.py's :class:`HeldDelivery`, the channel's ``held``.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from ..protocol.frames import FRAME_TYPE_MESSAGE
from ..protocol.message import MESSAGE_FRAME_HEAD, MESSAGE_FRAME_OVERHEAD
from ..protocol.names import is_ephemeral
from ..protocol.replica import OP_PAUSE, OP_UNPAUSE
from .backend import Backend, read_messages
from .beyond.channel_held import HeldDelivery
from .errors import BackendWriteError
from .memory_queue import ChannelMemory, RunQueue, cut
from .message import Message, MessageRun, frame_runs_in_flight, own_copies

if TYPE_CHECKING:
    from .consumer import Consumer
    from .diskqueue import DiskQueue
    from .diskqueue.holds import Hold
    from .nsqd import NSQD


def frames_size(count: int, body_bytes: int) -> int:
    """The bytes of ``count`` message frames whose bodies total ``body_bytes``: each adds its
    size prefix and the message header."""
    return body_bytes + count * (MESSAGE_FRAME_OVERHEAD + 4)


class ChannelError(Exception):
    pass


class HeldTopicCopies(Protocol):
    """The topic's copies a full disk refused a channel (beyond/topic_held.py): their records
    stay held until every channel that kept a copy in memory has settled it."""

    @property
    def pending(self) -> Mapping[bytes, object]:
        """The refused copies not yet settled, by message ID."""

    def finished(self, channel: Channel, ids: list[bytes]) -> None:
        """``channel`` is done with these messages (FIN, or moved to a dead-letter topic)."""

    def dropped(self, channel: Channel) -> None:
        """``channel`` discarded all it held (emptied or deleted)."""


class ChannelTopic(Protocol):
    """What a channel asks of the topic that owns it (Topic satisfies it structurally)."""

    @property
    def name(self) -> str: ...

    @property
    def held_copies(self) -> HeldTopicCopies | None:
        """The topic's held copies in the held route, else None."""

    def delete_channel_if_unused(self, channel: Channel) -> None:
        """Remove ``channel`` if it has no consumers left (an ephemeral channel's last one
        went)."""

    def copy_named_puts(self) -> None:
        """Copy to the channels now what replication named for them at put time."""


class Channel:
    __slots__ = (
        "_client_list",
        "_deferred_pq",
        "_in_flight_capped",
        "_in_flight_groups",
        "_rr",
        "backend",
        "clients",
        "dead_letter_count",
        "dead_letter_suffix",
        "deferred",
        "e2e",
        "ephemeral",
        "exiting",
        "held",
        "in_flight",
        "max_attempts",
        "mem_capacity",
        "memory_queue",
        "message_count",
        "name",
        "nsqd",
        "paused",
        "requeue_count",
        "skip_ids",
        "timeout_count",
        "topic",
        "writes",
    )

    def __init__(self, topic: ChannelTopic, name: str, nsqd: NSQD, backend: Backend) -> None:
        self.topic = topic
        self.name = name
        self.nsqd = nsqd
        self.writes = nsqd.writes  # the disk-write side (backend_writes.py)
        self.ephemeral = is_ephemeral(name)
        self.mem_capacity = nsqd.options.mem_queue_size
        self.memory_queue: ChannelMemory = RunQueue()
        self.backend = backend
        self.clients: dict[int, Consumer] = {}
        self._client_list: list[Consumer] = []
        self._rr = 0
        self.in_flight: dict[bytes, Message] = {}
        # the group of the usual timeout is ``in_flight`` itself (see "in flight" below)
        self._in_flight_groups: dict[float, dict[bytes, Message]] = {
            nsqd.options.msg_timeout: self.in_flight
        }
        self._in_flight_capped: list[tuple[float, bytes, Message]] = []
        self.deferred: dict[bytes, Message] = {}
        self._deferred_pq: list[tuple[float, bytes, Message]] = []
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.e2e = nsqd.new_e2e_stream()
        # IDs of deferred messages restored at start-up whose disk copies must be skipped.
        self.skip_ids: set[bytes] = set()
        # nsqpy dead-lettering (beyond/dead_letter.py): 0 = off, Go's behaviour
        self.max_attempts = 0
        self.dead_letter_suffix = ""
        self.dead_letter_count = 0
        self.held: HeldDelivery | None = None  # held mode: off until hold_messages()

    # ------------------------------------------------------------------ held mode

    def hold_messages(self, queue: DiskQueue) -> None:
        """Keep every message in ``queue`` (this channel's backend) until it is finished
        (beyond/channel_held.py)."""
        self.held = HeldDelivery(self, queue)

    def early_ids(self) -> set[bytes]:
        """IDs of deferred messages whose record waits in the queue (held mode)."""
        return set(self.held.early) if self.held is not None else set()

    def _release(self, msg: Message) -> None:
        """``msg`` is finished or stored elsewhere: its record need not be kept."""
        hold = msg.hold
        if hold is not None:
            msg.hold = None
            if self.held is not None:
                self.held.queue.release(hold)

    # ------------------------------------------------------------------ consumers

    def add_client(self, client: Consumer) -> None:
        if self.exiting:
            raise ChannelError("exiting")
        if client.id in self.clients:
            return
        limit = self.nsqd.options.max_channel_consumers
        if limit and len(self.clients) >= limit:
            raise ChannelError(
                f"consumers for {self.topic.name}:{self.name} exceeds limit of {limit}"
            )
        self.clients[client.id] = client
        self._client_list = list(self.clients.values())

    def remove_client(self, client: Consumer) -> None:
        if self.exiting or self.clients.pop(client.id, None) is None:
            return
        self._client_list = list(self.clients.values())
        if not self.clients and self.ephemeral:
            self.nsqd.loop.call_soon(self.topic.delete_channel_if_unused, self)

    def _ready_client(self) -> Consumer | None:
        """The next ready consumer, round-robin, or None."""
        clients = self._client_list
        count = len(clients)
        if not count or self.paused:
            return None
        start = self._rr
        for offset in range(count):
            client = clients[(start + offset) % count]
            if client.ready_count > client.in_flight_count and client.ready_count > 0:
                self._rr = (start + offset + 1) % count
                return client
        return None

    def pump(self, client: Consumer) -> None:
        """Deliver queued messages to ``client`` while it is ready: its whole free window at
        once (one timestamp, one in-flight group lookup, frames built in one loop)."""
        if self.paused or self.exiting:
            return
        ready = client.ready_count
        want = ready - client.in_flight_count
        if want > 0 and ready > 0:
            if client.sample_rate:
                self._pump_sampled(client)
            else:
                self._send_window(client, want)
        client.after_deliveries()

    def _send_window(self, client: Consumer, want: int) -> None:
        """Up to ``want`` messages put in flight to ``client`` and sent in one write, in queue
        order: the memory queue's runs first (MPUBs' :class:`MessageRun` built straight into
        flight, each consecutive stretch of them in one loop; a run of messages each made this
        channel's own copy), then the backend's."""
        frames: list[bytes] = []
        now = self.nsqd.now()
        counts: list[tuple[int, int]] = []  # (messages sent, frame bytes) of each stretch
        published: list[MessageRun] = []
        taken = 0
        for run in self.memory_queue.take_runs(want):
            taken += len(run)
            if type(run) is MessageRun:
                published.append(run)
                continue
            if published:
                counts.append(self.start_runs_in_flight(published, client, now, frames))
                published = []
            counts.append(self.start_in_flight_many(own_copies(run), client, now, frames))
        if published:
            counts.append(self.start_runs_in_flight(published, client, now, frames))
        if taken < want:
            msgs = self._take_backend([], want - taken)
            if msgs:
                counts.append(self.start_in_flight_many(msgs, client, now, frames))
        sent = sum([count[0] for count in counts])
        if sent:
            client.send_messages(frames, sent, sum([count[1] for count in counts]))

    def _take(self, count: int) -> list[Message]:
        """Up to ``count`` messages from the memory queue, then from the backend (a message
        the topic shares between channels becomes this channel's own copy here)."""
        return self._take_backend(own_copies(self.memory_queue.take(count)), count)

    def _take_backend(self, msgs: list[Message], count: int) -> list[Message]:
        """``msgs`` with messages from the backend appended until it holds ``count``."""
        if len(msgs) >= count:
            return msgs
        if self.held is not None:
            return self.held.take(msgs, count)
        read_messages(self.backend, msgs, count, self.skip_ids, self.nsqd.logger.error)
        return msgs

    def _pump_sampled(self, client: Consumer) -> None:
        """One message at a time: a sampled-out message does not take a slot of RDY."""
        memory_queue = self.memory_queue
        while client.ready_count > client.in_flight_count and client.ready_count > 0:
            if memory_queue:
                self.deliver(client, memory_queue.popleft().private())
                continue
            msgs = self._take(1)
            if not msgs:
                break
            self.deliver(client, msgs[0])

    def pump_all(self) -> None:
        for client in self._client_list:
            self.pump(client)

    # ------------------------------------------------------------------ putting messages

    def put_message(self, msg: Message) -> None:
        """A message from the topic (counted in ``message_count``); a failed disk write
        fails the publish."""
        self.message_count += 1
        self.put(msg)

    def put_messages(self, msgs: Sequence[Message] | MessageRun) -> None:
        """:meth:`put_message` for a batch: with no consumer ready, one extend of the memory
        queue and the overflow to the backend, instead of a call chain per message. The
        messages may be shared with the topic's other channels (``Message.shared``, or a
        MessageRun, from which this channel builds its own messages as it takes them)."""
        if self._ready_client() is not None:
            for msg in msgs:
                self.put_message(msg)
            return
        self.message_count += len(msgs)
        memory_queue = self.memory_queue
        room = self.mem_capacity - len(memory_queue)
        if room >= len(msgs):
            memory_queue.extend(msgs)
            return
        if room > 0:
            memory_queue.extend(cut(msgs, 0, room))
            msgs = cut(msgs, room, None)
        self.writes.write_many_to_backend(self.backend, msgs, f"CHANNEL({self.name})", memory_queue)

    def put_message_deferred(self, msg: Message, delay: float) -> None:
        self.message_count += 1
        if self.held is not None:
            self.held.store_deferred(msg)
        self.start_deferred_timeout(msg, delay)

    def requeue(self, msg: Message) -> None:
        """Put back a message nsqd already accepted (REQ, timeout, deferral due): if the disk
        refuses it, keep it in memory beyond --mem-queue-size rather than lose it."""
        msg = msg.detached()
        if self.held is not None:
            self.held.requeue(msg)
            return
        try:
            self.put(msg)
        except BackendWriteError:
            self.memory_queue.append(msg)

    def put(self, msg: Message) -> None:
        """Hand ``msg`` to a ready consumer, else queue it in memory, else in the backend."""
        if self.held is not None:
            self.held.put(msg)
            return
        client = self._ready_client()
        if client is not None:
            if self.memory_queue:  # keep FIFO order with what is already queued
                self.memory_queue.append(msg)
                self.pump(client)
            else:
                self.deliver(client, msg.private())
                client.after_deliveries()
            return
        if len(self.memory_queue) < self.mem_capacity:
            self.memory_queue.append(msg)
            return
        self.writes.write_to_backend(self.backend, msg, f"CHANNEL({self.name})", self.memory_queue)

    # ------------------------------------------------------------------ in flight
    #
    # In-flight messages are kept in insertion-ordered dicts, one per client msg_timeout: within
    # one dict deadlines (delivery time + that timeout) are in insertion order, so FIN is an O(1)
    # delete and the timeout scan reads each dict from its head. A TOUCH capped by
    # --max-msg-timeout can break that order; those few go to a small heap instead.
    #
    # The group of nsqd's --msg-timeout, which nearly every client uses, is ``in_flight``
    # itself (one dict to fill and empty per message, not two). ``in_flight`` also holds the
    # other groups' and the capped messages: its scan passes over those (``msg.group`` is not
    # ``in_flight``); a message put back in it out of order goes to the heap.

    def _in_flight_group(self, timeout: float) -> dict[bytes, Message]:
        """The in-flight group of messages due ``timeout`` seconds after delivery."""
        group = self._in_flight_groups.get(timeout)
        if group is None:
            group = self._in_flight_groups[timeout] = {}
        return group

    def deliver(self, client: Consumer, msg: Message) -> None:
        """Put one message in flight to ``client``, its attempts raised, and send it; unless
        ``client`` samples it out (consumed and dropped, as Go does: its held record is let
        go), or it is a second copy of a message already in flight (see
        :meth:`start_in_flight_many`)."""
        sample_rate = client.sample_rate
        if sample_rate and random.randrange(100) > sample_rate:
            self._release(msg)
            self._settled([msg.id])
            return
        msg_id = msg.id
        if msg_id in self.in_flight:
            self._release(msg)
            return
        now = self.nsqd.now()
        timeout = client.msg_timeout
        msg.attempts += 1
        msg.client = client
        msg.delivery_ts = now
        msg.pri = now + timeout
        self.in_flight[msg_id] = msg
        group = self._in_flight_groups.get(timeout)  # inline: once per message delivered
        if group is None:
            group = self._in_flight_groups[timeout] = {}
        group[msg_id] = msg
        msg.group = group
        client.send_message(msg)

    def start_in_flight_many(
        self, msgs: list[Message], client: Consumer, now: float, frames: list[bytes]
    ) -> tuple[int, int]:
        """:meth:`deliver`'s bookkeeping for a window of messages delivered at once, each with
        its attempts raised, and their message frames appended to ``frames`` (header and ID
        packed as one part, the body as another), all in one loop; how many were put in
        flight and the size of their frames.

        A second copy of a message already in flight on this channel (the same ID, read again
        from a disk queue after a crash, when its first copy had been delivered but not yet
        recorded as read) is dropped, not sent: the copy in flight stands for it, and two
        copies with one ID would leave the client's in-flight count too high."""
        timeout = client.msg_timeout
        deadline = now + timeout
        in_flight = self.in_flight
        group = self._in_flight_group(timeout)
        put_in_flight = in_flight.setdefault  # one lookup: the duplicate check and the insert
        duplicates: list[Message] = []
        append = frames.append
        pack = MESSAGE_FRAME_HEAD.pack
        size = 0
        for msg in msgs:
            msg_id = msg.id
            if put_in_flight(msg_id, msg) is not msg:
                duplicates.append(msg)
                continue
            attempts = msg.attempts + 1
            msg.attempts = attempts
            msg.client = client
            msg.delivery_ts = now
            msg.pri = deadline
            msg.group = group
            body = msg.body
            append(
                pack(
                    MESSAGE_FRAME_OVERHEAD + len(body),
                    FRAME_TYPE_MESSAGE,
                    msg.timestamp,
                    attempts,
                    msg_id,
                )
            )
            append(body)
            size += len(body)
        sent = len(msgs) - len(duplicates)
        if group is not in_flight:
            group.update([(msg.id, msg) for msg in msgs if msg.group is group])
        for msg in duplicates:
            self._release(msg)
        return sent, frames_size(sent, size)

    def start_runs_in_flight(
        self, runs: list[MessageRun], client: Consumer, now: float, frames: list[bytes]
    ) -> tuple[int, int]:
        """:meth:`start_in_flight_many` for runs of published messages, each message built
        already in flight (:func:`~nsqpy.nsqd.message.frame_runs_in_flight`) rather than
        built by :meth:`MessageRun.messages` and then put in flight: the SUB of MPUBs'
        messages from memory."""
        timeout = client.msg_timeout
        in_flight = self.in_flight
        group = self._in_flight_group(timeout)
        sent, size = frame_runs_in_flight(
            runs, in_flight, group, client, now, now + timeout, frames
        )
        if group is not in_flight:
            started = [(msg_id, in_flight[msg_id]) for run in runs for msg_id in run.ids]
            group.update([(msg_id, msg) for msg_id, msg in started if msg.group is group])
        return sent, frames_size(sent, size)

    def finish_many(self, client: Consumer, ids: list[bytes], start: int = 0) -> int:
        """FIN each ID in order from ``ids[start]``, stopping at the first that is not
        ``client``'s in flight; the index it stopped at, ``len(ids)`` if none failed (the
        caller reports the failing one with :meth:`finish_message`)."""
        in_flight = self.in_flight
        e2e = self.e2e
        now_ns = self.nsqd.wall_ns() if e2e is not None else 0
        held = self.held.queue if self.held is not None else None
        released: list[Hold] = []  # held mode: given back in one call
        finished = len(ids)
        get = in_flight.get
        for index in range(start, finished):
            msg_id = ids[index]
            msg = get(msg_id)
            if msg is None or msg.client is not client:  # another client's stays where it is
                finished = index
                break
            del in_flight[msg_id]
            group = msg.group
            if group is not None:
                if group is not in_flight:
                    del group[msg_id]
                msg.group = None
            msg.client = None
            if held is not None and msg.hold is not None:
                released.append(msg.hold)
                msg.hold = None
            if e2e is not None:
                e2e.insert(now_ns - msg.timestamp)
        if released and held is not None:
            held.release_many(released)
        self._settled(ids[start:finished] if start else ids[:finished])
        return finished

    def _pop_in_flight(self, client: Consumer, msg_id: bytes) -> Message:
        msg = self.in_flight.get(msg_id)
        if msg is None:
            raise ChannelError("ID not in flight")
        if msg.client is not client:
            raise ChannelError("client does not own message")
        self._ungroup(msg)
        return msg

    def _ungroup(self, msg: Message) -> None:
        """Take ``msg`` out of ``in_flight`` and of its group."""
        in_flight = self.in_flight
        del in_flight[msg.id]
        group = msg.group
        if group is not None:
            if group is not in_flight:
                del group[msg.id]
            msg.group = None

    def finish_message(self, client: Consumer, msg_id: bytes) -> None:
        msg = self._pop_in_flight(client, msg_id)
        msg.client = None
        self._release(msg)
        self._settled([msg_id])
        if self.e2e is not None:
            self.e2e.insert(self.nsqd.wall_ns() - msg.timestamp)

    def requeue_message(self, client: Consumer, msg_id: bytes, delay: float) -> None:
        msg = self._pop_in_flight(client, msg_id)
        msg.client = None
        self.requeue_count += 1
        if self.nsqd.replication is not None:
            self.nsqd.replication.requeued(self, msg, delay)
        if self.max_attempts and msg.attempts >= self.max_attempts and self._dead_letter(msg):
            return
        if delay == 0:
            if self.exiting:
                raise ChannelError("exiting")
            self.requeue(msg)
            return
        self.start_deferred_timeout(msg, delay)

    def touch_message(self, client: Consumer, msg_id: bytes, now: float) -> None:
        msg = self._pop_in_flight(client, msg_id)
        msg.client = client
        self.in_flight[msg_id] = msg
        timeout = client.msg_timeout
        max_timeout = self.nsqd.options.max_msg_timeout
        if now + timeout - msg.delivery_ts >= max_timeout:
            msg.pri = msg.delivery_ts + max_timeout
            heapq.heappush(self._in_flight_capped, (msg.pri, msg_id, msg))
            return
        msg.pri = now + timeout
        group = self._in_flight_groups.setdefault(timeout, {})
        group[msg_id] = msg
        msg.group = group

    def process_in_flight_queue(self, now: float) -> bool:
        """Requeue timed-out messages; True if any timed out (the channel was dirty)."""
        expired: list[Message] = []
        for group in self._in_flight_groups.values():
            for msg in group.values():
                if msg.group is not group:
                    continue  # in ``in_flight``, of another group or capped
                if msg.pri > now:
                    break
                expired.append(msg)
        capped = self._in_flight_capped
        while capped and capped[0][0] <= now:
            pri, msg_id, msg = heapq.heappop(capped)
            if self.in_flight.get(msg_id) is msg and msg.group is None and msg.pri == pri:
                expired.append(msg)
        for msg in expired:
            self._ungroup(msg)
            self.timeout_count += 1
            owner = msg.client
            msg.client = None
            if owner is not None:
                owner.timed_out_message()
            if self.nsqd.replication is not None:
                self.nsqd.replication.requeued(self, msg)
            if self.max_attempts and msg.attempts >= self.max_attempts and self._dead_letter(msg):
                continue
            self.requeue(msg)
        return bool(expired)

    def _dead_letter(self, msg: Message) -> bool:
        """nsqpy --max-attempts: move ``msg`` to the dead-letter topic (True) or, if that
        fails, leave it to be requeued (False)."""
        if not self.nsqd.dead_letters.divert(self, msg):
            return False
        self._release(msg)
        self._settled([msg.id])
        return True

    def _settled(self, ids: list[bytes]) -> None:
        """This channel is done with these messages: the topic may let go of the records of
        copies a full disk refused (beyond/topic_held.py)."""
        copies = self.topic.held_copies
        if copies is not None and copies.pending:
            copies.finished(self, ids)
        if self.nsqd.replication is not None:
            self.nsqd.replication.fin(self, ids)

    # ------------------------------------------------------------------ deferred

    def start_deferred_timeout(self, msg: Message, delay: float) -> None:
        msg = msg.detached()
        if msg.id in self.deferred:
            raise ChannelError("ID already deferred")
        msg.pri = self.nsqd.now() + delay
        self.deferred[msg.id] = msg
        heapq.heappush(self._deferred_pq, (msg.pri, msg.id, msg))

    def process_deferred_queue(self, now: float) -> bool:
        pq = self._deferred_pq
        dirty = False
        while pq and pq[0][0] <= now:
            _, msg_id, msg = heapq.heappop(pq)
            if self.deferred.pop(msg_id, None) is not msg:
                continue
            dirty = True
            self.requeue(msg)
        if self.held is not None:
            self.held.relocate_deferred()
        return dirty

    # ------------------------------------------------------------------ state

    @staticmethod
    def uncapped_memory_queue(msgs: Iterable[Message]) -> ChannelMemory:
        """The memory queue of a channel with no ``--max-queue-bytes`` cap."""
        return RunQueue(msgs)

    def depth(self) -> int:
        # restored deferred messages still have a disk copy that will be skipped; an early
        # deferred message's record is counted as deferred
        early = len(self.held.early) if self.held is not None else 0
        return len(self.memory_queue) + self.backend.depth() - len(self.skip_ids) - early

    def pause(self) -> None:
        if self.nsqd.replication is not None and not self.paused:  # group-wide, on a change
            self.nsqd.replication.channel_op(self.topic.name, self.name, OP_PAUSE)
        self.paused = True

    def unpause(self) -> None:
        if self.nsqd.replication is not None and self.paused:
            self.nsqd.replication.channel_op(self.topic.name, self.name, OP_UNPAUSE)
        self.paused = False
        self.pump_all()

    def empty(self) -> None:
        """Discard queued, in-flight and deferred messages (HTTP /channel/empty)."""
        self.topic.copy_named_puts()  # those published before it first reach this channel
        self.in_flight.clear()
        self._in_flight_groups = {self.nsqd.options.msg_timeout: self.in_flight}
        self._in_flight_capped = []
        self.deferred.clear()
        self._deferred_pq = []
        if self.held is not None:
            self.held.early.clear()
        for client in self._client_list:
            client.empty_in_flight()
        self.memory_queue.clear()
        self.backend.empty()
        copies = self.topic.held_copies
        if copies is not None and copies.pending:
            copies.dropped(self)

    def close_clients(self) -> None:
        for client in list(self._client_list):
            client.close()

    def delete(self) -> None:
        """Stop serving: close consumers, discard everything, remove backing files."""
        self.exiting = True
        self.close_clients()
        self.empty()
        self.backend.delete()

    def close(self) -> None:
        """Clean shutdown: keep queued, in-flight and deferred messages in the backend."""
        self.exiting = True
        self.close_clients()
        stored = self.flush()
        if stored and self.held is not None:
            self.held.queue.release_all()  # every held message was just stored again
        self.writes.close_backend(self.backend, f"CHANNEL({self.name})")

    def flush(self) -> bool:
        """Shutdown: memory, in-flight, then deferred messages to disk, in Go's order; False
        if the disk refused them."""
        now = self.nsqd.now()
        deferred = [(m, max(0.0, m.pri - now)) for m in self.deferred.values()]
        msgs = self.messages_to_persist()
        stored = True
        if msgs and not self.ephemeral:
            context = f"CHANNEL({self.name})"
            self.nsqd.logger.info(f"{context}: flushing {len(msgs)} memory messages to backend")
            stored = self.writes.put_many_logged(self.backend, msgs, context)
        self.nsqd.persistence.remember_deferred(self.backend, deferred)
        return stored

    def restore_deferred(self, msg: Message, remaining: float) -> None:
        if self.held is not None:
            self.held.restore_deferred(msg)
        self.start_deferred_timeout(msg, remaining)

    def messages_to_persist(self) -> list[Message]:
        """Memory, in-flight and deferred messages, in Go's shutdown order; an early
        deferred message's record is already waiting in the queue."""
        msgs = list(self.memory_queue)
        msgs.extend(self.in_flight.values())
        early = self.held.early if self.held is not None else {}
        msgs.extend(m for m in self.deferred.values() if early.get(m.id) is not m)
        self.memory_queue.clear()
        return msgs
