"""A topic: accepts published messages and gives every channel its own copy (nsqd/topic.go).

Go moves messages from the topic to its channels in a pump goroutine. Here fan-out happens at
publish time when the topic has channels and is not paused; otherwise messages wait in the
topic's memory queue or backend and are drained when a channel appears or on unpause.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from ..protocol.names import is_ephemeral
from .backend import Backend
from .channel import Channel
from .guid import GUIDFactory
from .message import Message, message_from_bytes

if TYPE_CHECKING:
    from .nsqd import NSQD

#: Messages moved per event-loop turn when draining a backlog into channels.
DRAIN_BATCH = 1000


class TopicError(Exception):
    pass


class Topic:
    __slots__ = (
        "_channel_list",
        "_draining",
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
    )

    def __init__(self, name: str, nsqd: NSQD, backend: Backend) -> None:
        self.name = name
        self.nsqd = nsqd
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
        self._draining = False
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
            self._schedule_drain()
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
        """An MPUB's messages (never deferred). Callers hold ``nsqd.batched_writes()``, so a
        refused disk write surfaces after this returns."""
        if self.exiting:
            raise TopicError("exiting")
        if self.nsqd.queue_limits.active:  # nsqpy --max-queue-bytes (queue_limits.py)
            self.nsqd.queue_limits.admit(self, msgs)
        channels = self._channel_list
        if channels and self.started and not self.paused and not self._draining:
            first = True
            for channel in channels:  # the first channel takes the originals, as _fan_out
                channel.put_messages(msgs if first else [msg.copy() for msg in msgs])
                first = False
            self.message_count += len(msgs)
            self.message_bytes += sum([len(msg.body) for msg in msgs])
            return
        total = 0
        try:
            for count, msg in enumerate(msgs):  # noqa: B007 - count is used on failure
                self._put(msg)
                total += len(msg.body)
        except Exception:
            self.message_count += count
            self.message_bytes += total
            raise
        self.message_count += len(msgs)
        self.message_bytes += total

    def start(self) -> None:
        self.started = True
        self._schedule_drain()

    def _put(self, msg: Message) -> None:
        if self._channel_list and self.started and not self.paused and not self._draining:
            self._fan_out(msg)
            return
        if self.mem_capacity > 0 or self.ephemeral or msg.deferred:
            if len(self.memory_queue) < self.mem_capacity:
                self.memory_queue.append(msg)
                return
            if self.ephemeral:
                return  # Go's dummy backend: overflow is dropped
        self.nsqd.write_to_backend(self.backend, msg, f"TOPIC({self.name})", self.memory_queue)

    def _fan_out(self, msg: Message) -> None:
        channels = self._channel_list
        first = True
        for channel in channels:
            copy = msg if first else msg.copy()
            first = False
            if copy.deferred:
                channel.put_message_deferred(copy, copy.deferred)
            else:
                channel.put_message(copy)

    # ------------------------------------------------------------------ backlog

    def _schedule_drain(self) -> None:
        if self._draining or not self._channel_list or self.paused or not self.started:
            return
        if not self.memory_queue and self.backend.depth() == 0:
            return
        self._draining = True
        self.nsqd.loop.call_soon(self._drain_some)

    def _drain_some(self) -> None:
        """Move a batch of the backlog to the channels, yielding between batches."""
        if self.exiting or self.paused or not self._channel_list or not self.started:
            self._draining = False
            return
        # lenient: messages a full disk refuses stay in the channel's memory, never lost
        with self.nsqd.batched_writes(lenient=True):
            more = self._drain_batch()
        if more:
            self.nsqd.loop.call_soon(self._drain_some)
        else:
            self._draining = False

    def _drain_batch(self) -> bool:
        """Fan out up to DRAIN_BATCH backlog messages; True if more remain."""
        for _ in range(DRAIN_BATCH):
            if self.memory_queue:
                msg = self.memory_queue.popleft()
            else:
                data = self.backend.get()
                if data is None:
                    return False
                try:
                    msg = message_from_bytes(data)
                except ValueError as exc:
                    self.nsqd.logger.error(f"failed to decode message - {exc}")
                    continue
                if self.skip_ids and msg.id in self.skip_ids:
                    self.skip_ids.discard(msg.id)
                    continue
            self._fan_out(msg)
        return True

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
        self._schedule_drain()

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
        self.nsqd.flush_topic_to_backend(self)
        self.nsqd.close_backend(self.backend, f"TOPIC({self.name})")
