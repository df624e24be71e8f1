"""A topic: accepts published messages and gives every channel its own copy (nsqd/topic.go).

As in Go, a publish is acknowledged once the topic holds the message, and the topic's pump
moves messages to the channels afterwards (see "publishing" below for the two exceptions).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from ..protocol.names import is_ephemeral
from .backend import Backend
from .channel import Channel
from .guid import GUIDFactory
from .message import Message, message_from_bytes

if TYPE_CHECKING:
    from .nsqd import NSQD

#: The most channel copies the topic's pump makes per event-loop turn (messages x channels);
#: between turns the loop reads and answers publishers, so fan-out cannot hold their OKs back.
PUMP_BUDGET = 10000
#: ... but at least this many messages per turn, however many channels.
PUMP_MIN_BATCH = 50
#: Once a message's copies cost more than this (seconds, all its channels together: many
#: channels whose memory is full, so every copy is a disk write), the pump works in slices
#: of PUMP_SLICE per turn instead, at least PUMP_MIN_SLICED messages: publishers are answered
#: between slices and the topic's backlog grows, as Go's pump (one goroutine, a write round
#: trip per channel's disk queue) lags its publishers. Below it the pump keeps up: a backlog
#: would overflow to the topic's own disk queue, and writing and reading that back costs
#: more than the copies it postpones.
PUMP_DEFER_COST = 4e-6
PUMP_SLICE = 0.0005
PUMP_MIN_SLICED = 10


class TopicError(Exception):
    pass


class Topic:
    __slots__ = (
        "_channel_list",
        "_copy_cost",
        "_deferred_waiting",
        "_pump_scheduled",
        "backend",
        "channels",
        "ephemeral",
        "exiting",
        "guid",
        "mem_capacity",
        "memory_queue",
        "message_bytes",
        "message_count",
        "name",
        "nsqd",
        "paused",
        "skip_ids",
        "started",
        "writes",
    )

    def __init__(self, name: str, nsqd: NSQD, backend: Backend) -> None:
        self.name = name
        self.nsqd = nsqd
        self.writes = nsqd.writes  # the disk-write side (backend_writes.py)
        self.ephemeral = is_ephemeral(name)
        self.mem_capacity = nsqd.options.mem_queue_size
        self.memory_queue: deque[Message] = deque()
        self.backend = backend
        self.channels: dict[str, Channel] = {}
        self._channel_list: list[Channel] = []
        self.guid = GUIDFactory(nsqd.options.node_id)
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        self._pump_scheduled = False
        self._copy_cost = 0.0  # seconds per channel copy, measured by the pump
        self._deferred_waiting = 0  # DPUB messages in the topic's queue (paused, no channels)
        self.skip_ids: set[bytes] = set()
        # Go's Topic.Start(): until then messages wait in the topic even if channels exist,
        # so channels pre-created from nsqlookupd get the first messages too.
        self.started = True

    # ------------------------------------------------------------------ channels

    def get_channel(self, name: str) -> Channel:
        channel = self.channels.get(name)
        if channel is None:
            channel = self.nsqd.new_channel(self, name)
            self.channels[name] = channel
            self._channel_list = list(self.channels.values())
            self.nsqd.channel_created(self, channel)
            self._schedule_pump()
        return channel

    def get_existing_channel(self, name: str) -> Channel | None:
        return self.channels.get(name)

    def delete_existing_channel(self, name: str) -> None:
        channel = self.channels.pop(name, None)
        if channel is None:
            raise TopicError("channel does not exist")
        self._channel_list = list(self.channels.values())
        self.nsqd.channel_deleted(self, channel)
        channel.delete()
        if not self.channels and self.ephemeral:
            self.nsqd.loop.call_soon(self.nsqd.delete_ephemeral_topic, self)

    def delete_channel_if_unused(self, channel: Channel) -> None:
        """Ephemeral channels go when their last consumer does."""
        if self.channels.get(channel.name) is channel and not channel.clients:
            self.delete_existing_channel(channel.name)

    # ------------------------------------------------------------------ publishing
    #
    # As Go's topic: a publish is acknowledged once the message is in the topic (its memory
    # queue, or its disk queue when that is full or --mem-queue-size=0 asks for disk), and
    # the topic's pump copies it to the channels on a later turn of the event loop, a bounded
    # batch per turn, so publishers and fan-out share the loop as Go's goroutines share CPUs.
    # Two publishes skip the topic queue when nothing waits in it: a DPUB goes straight to the
    # channels' deferred queues (keeping its deferral, which a disk queue cannot hold), and
    # with --mem-queue-size=0 a message goes straight to the channels' disk queues, so the
    # publish is acknowledged after the very writes (and syncs) that deliver it. (Go writes
    # the topic's disk queue and copies to the channels' later; when a channel's disk is full
    # by then, Go logs "failed to write message to backend" and the copy is lost. Here a
    # full disk refuses the publish instead.)

    def new_message(self, body: bytes) -> Message:
        return Message(self.guid.new_id(), body, self.nsqd.wall_ns())

    def new_messages(self, bodies: list[bytes]) -> list[Message]:
        """An MPUB's messages: consecutive IDs and one publish timestamp."""
        timestamp = self.nsqd.wall_ns()
        ids = self.guid.new_ids(len(bodies))
        return [Message(msg_id, body, timestamp) for msg_id, body in zip(ids, bodies, strict=True)]

    def put_message(self, msg: Message) -> None:
        if self.exiting:
            raise TopicError("exiting")
        if self.nsqd.queue_limits.active:  # nsqpy --max-queue-bytes (queue_limits.py)
            self.nsqd.queue_limits.admit(self, (msg,))
        self._put(msg)
        self.message_count += 1
        self.message_bytes += len(msg.body)

    def put_messages(self, msgs: list[Message]) -> None:
        """An MPUB's messages (never deferred). Callers hold ``nsqd.writes.batched_writes()``, so a
        refused disk write surfaces after this returns."""
        if self.exiting:
            raise TopicError("exiting")
        if not msgs:
            return
        if self.nsqd.queue_limits.active:  # nsqpy --max-queue-bytes (queue_limits.py)
            self.nsqd.queue_limits.admit(self, msgs)
            return
        if self._direct_to_channels():
            self._fan_out(msgs)
        else:
            self._enqueue(msgs)
        self.message_count += len(msgs)
        self.message_bytes += sum([len(msg.body) for msg in msgs])

    def start(self) -> None:
        self.started = True
        self._schedule_pump()

    def flowing(self) -> bool:
        """True while the pump may move messages to the channels."""
        return bool(self._channel_list) and self.started and not self.paused and not self.exiting

    def _direct_to_channels(self) -> bool:
        """Nothing waits in the topic and a publish must reach the channels before its OK:
        see :meth:`publish_writes_channels`."""
        return (
            self.publish_writes_channels()
            and self.flowing()
            and not self.memory_queue
            and self.backend.depth() == 0
        )

    def publish_writes_channels(self) -> bool:
        """Whether a publish now may write the channels' queues before its OK (so its OK
        waits for their running fsyncs too, ``BackendWrites.running_syncs``): with
        --mem-queue-size=0 (see "publishing" above) and while --max-queue-bytes caps are set
        (a publish is admitted against the channels' bytes, so it must reach them at once)."""
        return self.mem_capacity <= 0 or self.nsqd.queue_limits.active

    def _put(self, msg: Message) -> None:
        if msg.deferred and self.flowing():
            self._fan_out_deferred([msg])
        elif self._direct_to_channels():
            with self.writes.batched_writes():  # each channel's write of one shared encoding
                self._fan_out([msg])
        else:
            self._enqueue([msg])

    def _enqueue(self, msgs: list[Message]) -> None:
        """Into the topic's memory queue while it has room and nothing waits on disk (so the
        pump, reading memory first, keeps publish order), else its disk queue; then wake the
        pump. An ephemeral topic has no disk: its overflow is dropped, as Go's."""
        memory_queue = self.memory_queue
        room = self.mem_capacity - len(memory_queue)
        deferred = msgs[0].deferred  # only a DPUB (one message) waits in the topic deferred
        if room > 0 and not deferred and not self.ephemeral and self.backend.depth() > 0:
            room = 0  # (a deferred message has no place in the order: memory keeps its delay)
        if room >= len(msgs):
            memory_queue.extend(msgs)
            if deferred:
                self._deferred_waiting += 1
        else:
            if room > 0:
                memory_queue.extend(msgs[:room])
            if not self.ephemeral:
                context = f"TOPIC({self.name})"
                write = self.writes.write_to_backend
                for msg in msgs[max(room, 0) :]:
                    write(self.backend, msg, context, memory_queue)
        # (a publish's disk writes may still be pending in nsqd.writes.batched_writes(), so
        # the topic can look empty now: the pump runs anyway and finds them)
        self._schedule_pump(pending_writes=True)

    def _fan_out(self, msgs: list[Message]) -> None:
        """Every channel gets the batch: one channel the messages themselves, several the
        same objects marked shared (each copies a message only when it delivers it)."""
        channels = self._channel_list
        if self._deferred_waiting:
            deferred = [msg for msg in msgs if msg.deferred]
            self._deferred_waiting = max(0, self._deferred_waiting - len(deferred))
            if deferred:
                self._fan_out_deferred(deferred)
                msgs = [msg for msg in msgs if not msg.deferred]
        if not msgs:
            return
        if len(channels) > 1:
            for msg in msgs:
                msg.shared = True
        for channel in channels:
            channel.put_messages(msgs)

    def _fan_out_deferred(self, msgs: list[Message]) -> None:
        first = True
        for channel in self._channel_list:
            for msg in msgs:
                copy = msg if first else msg.copy()
                channel.put_message_deferred(copy, copy.deferred)
            first = False

    # ------------------------------------------------------------------ the pump

    def _schedule_pump(self, pending_writes: bool = False) -> None:
        if self._pump_scheduled or not self.flowing():
            return
        if not pending_writes and not self.memory_queue and self.backend.depth() == 0:
            return
        self._pump_scheduled = True
        self.nsqd.loop.call_soon(self._pump)

    def _pump(self) -> None:
        """Move one batch from the topic to its channels; again next turn if more wait. The
        batch is PUMP_BUDGET channel copies, or a PUMP_SLICE's worth when copies are dear
        (PUMP_DEFER_COST): fewer messages per turn the more channels."""
        self._pump_scheduled = False
        if not self.flowing():
            return
        channels = len(self._channel_list)
        limit = self._pump_batch(channels)
        started = time.perf_counter()
        # lenient: messages a full disk refuses stay in the channel's memory, never lost
        with self.writes.batched_writes(lenient=True):
            msgs = self._take(limit)
            if msgs:
                self._fan_out(msgs)
        if msgs:
            cost = (time.perf_counter() - started) / (len(msgs) * channels)
            self._copy_cost = (self._copy_cost + cost) / 2
        if len(msgs) >= limit or self.memory_queue:
            self._schedule_pump()

    def _pump_batch(self, channels: int) -> int:
        """Messages for the next pump turn (see PUMP_DEFER_COST)."""
        by_budget = max(PUMP_MIN_BATCH, PUMP_BUDGET // channels)
        per_message = self._copy_cost * channels
        if per_message <= PUMP_DEFER_COST:
            return by_budget
        return max(PUMP_MIN_SLICED, min(by_budget, int(PUMP_SLICE / per_message)))

    def _take(self, limit: int) -> list[Message]:
        """Up to ``limit`` messages: the memory queue first, then the disk queue."""
        memory_queue = self.memory_queue
        if len(memory_queue) >= limit:
            popleft = memory_queue.popleft
            return [popleft() for _ in range(limit)]
        msgs = list(memory_queue)
        memory_queue.clear()
        backend = self.backend
        while len(msgs) < limit:
            data = backend.get()
            if data is None:
                break
            try:
                msg = message_from_bytes(data)
            except ValueError as exc:
                self.nsqd.logger.error(f"failed to decode message - {exc}")
                continue
            if self.skip_ids and msg.id in self.skip_ids:
                self.skip_ids.discard(msg.id)
                continue
            msgs.append(msg)
        return msgs

    # ------------------------------------------------------------------ state

    def restore_deferred(self, msg: Message, remaining: float) -> None:
        """A DPUB message that waited in the topic at shutdown (its deferral not yet begun)."""
        msg.deferred = remaining
        self._put(msg)

    def depth(self) -> int:
        # restored deferred messages still have a disk copy that will be skipped
        return len(self.memory_queue) + self.backend.depth() - len(self.skip_ids)

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self._schedule_pump()

    def empty(self) -> None:
        self.memory_queue.clear()
        self.backend.empty()

    def delete(self) -> None:
        self.exiting = True
        for name in list(self.channels):
            channel = self.channels.pop(name)
            self.nsqd.channel_deleted(self, channel)
            channel.delete()
        self._channel_list = []
        self.empty()
        self.backend.delete()

    def close(self) -> None:
        """Clean shutdown: channels persist their messages, then the topic persists its own."""
        self.exiting = True
        for channel in self._channel_list:
            channel.close()
        self.writes.flush_topic_to_backend(self)
        self.writes.close_backend(self.backend, f"TOPIC({self.name})")
