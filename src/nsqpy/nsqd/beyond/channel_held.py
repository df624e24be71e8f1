"""A channel's held mode: the part of a :class:`~nsqpy.nsqd.channel.Channel` that keeps each
message's disk record until the message is finished (the channel's ``held``, a
:class:`HeldDelivery` composed in by ``Channel.hold_messages``).

With ``--mem-queue-size=0 --sync-every=1`` (``hold_messages``), nothing acknowledged is lost
to a SIGKILL: a message is in the channel's disk queue before any consumer gets it, and its
record stays *held* there until the message is finished, requeued as a newer record or
dead-lettered (diskqueue/holds.py): the queue's metadata records the start of the oldest held
record, so after a SIGKILL every in-flight and deferred message is read again (at least once;
its attempts as on disk, which a redelivery raises to what the consumer saw). A message handed
straight to a ready consumer is appended and held at once (``_put_held``). A DPUB or restored
deferral whose record lands behind waiting records is *early*: when the cursor reaches that
record it becomes the deferred message's hold instead of a delivery; if the deferral ends
first, that record is delivered when reached.

In the default mode the channel's ``held`` is None and nothing here runs; the channel's hot
paths (``_take``, ``finish_many``, ``put``) test it themselves.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

from ..errors import BackendWriteError
from ..message import Message, decode_records, message_from_bytes

if TYPE_CHECKING:
    from ..backend_writes import BackendWrites
    from ..consumer import Consumer
    from ..diskqueue import DiskQueue
    from ..diskqueue.holds import Hold
    from ..memory_queue import ChannelMemory
    from ..nsqd import NSQD


#: held mode: once the committed position keeps more records than this, a deferred message at
#: its head is stored again at the tail (:meth:`HeldDelivery.relocate_deferred`); the tests
#: lower it
RELOCATE_AFTER = int(os.environ.get("NSQPY_HELD_RELOCATE_AFTER", "100000"))


class HeldChannel(Protocol):
    """What held mode uses of its channel."""

    name: str
    nsqd: NSQD
    writes: BackendWrites
    memory_queue: ChannelMemory
    deferred: dict[bytes, Message]
    skip_ids: set[bytes]

    def _ready_client(self) -> Consumer | None: ...
    def pump(self, client: Consumer) -> None: ...
    def deliver(self, client: Consumer, msg: Message) -> None: ...
    def pump_all(self) -> None: ...


class HeldDelivery:
    """A channel's held mode: its disk queue, read with holds, and its early deferrals."""

    __slots__ = ("channel", "early", "queue")

    def __init__(self, channel: HeldChannel, queue: DiskQueue) -> None:
        queue.hold_reads()
        self.channel = channel
        self.queue = queue  # the channel's backend, holding every unfinished message
        # deferred messages whose record waits in the queue (module docstring), by ID
        self.early: dict[bytes, Message] = {}

    def take(self, msgs: list[Message], count: int) -> list[Message]:
        """The channel's ``_take`` from the queue: each message keeps its record's hold."""
        queue = self.queue
        while len(msgs) < count:
            records, holds = queue.get_many_held(count - len(msgs))
            if not records:
                break
            decoded: list[Message] = []
            if self.early or self.channel.skip_ids or decode_records(records, decoded):
                self._take_each(records, holds, msgs)  # ones to skip, or a bad record
                continue
            for msg, hold in zip(decoded, holds, strict=True):
                msg.hold = hold
            msgs += decoded
        return msgs

    def _take_each(self, records: list[bytes], holds: list[Hold], msgs: list[Message]) -> None:
        """:meth:`take`'s records one at a time: a record that does not decode is let go, as
        is a restored deferred message's disk copy; the record of a message still deferred
        becomes its hold."""
        channel = self.channel
        queue = self.queue
        early = self.early
        skip_ids = channel.skip_ids
        for data, hold in zip(records, holds, strict=True):
            msg = self._decode(data)
            if msg is None:
                queue.release(hold)
                continue
            if skip_ids and msg.id in skip_ids:
                skip_ids.discard(msg.id)
                queue.release(hold)
                continue
            if early:
                deferred = early.pop(msg.id, None)
                if deferred is not None and channel.deferred.get(msg.id) is deferred:
                    deferred.hold = hold  # still deferred: this record is now its hold
                    continue
            msg.hold = hold
            msgs.append(msg)

    def _decode(self, data: bytes) -> Message | None:
        try:
            return message_from_bytes(data)
        except ValueError as exc:
            self.channel.nsqd.logger.error(f"failed to decode message - {exc}")
            return None

    def store_deferred(self, msg: Message) -> None:
        """A DPUB's message is on disk for the whole of its deferral."""
        hold = self.channel.writes.write_held(self.queue, msg, f"CHANNEL({self.channel.name})")
        if hold is None:
            self.early[msg.id] = msg
        else:
            msg.hold = hold

    def restore_deferred(self, msg: Message) -> None:
        """A deferral restored at start-up: its record from the shutdown becomes its hold when
        read (not skipped)."""
        self.channel.skip_ids.discard(msg.id)
        self.early[msg.id] = msg

    def requeue(self, msg: Message) -> None:
        """Store ``msg`` again (as a newer record, with its attempts), then let the old go."""
        if self.early.get(msg.id) is msg:
            # its record still waits in the queue and is delivered when reached
            del self.early[msg.id]
            self.channel.pump_all()
            return
        old = msg.hold
        msg.hold = None
        try:
            self.put(msg)
        except BackendWriteError:
            msg.hold = old  # the disk still has its earlier record
            self.channel.memory_queue.append(msg)
            return
        if old is not None:
            self.queue.release(old)

    def put(self, msg: Message) -> None:
        """On disk first; held at once when it goes straight to a ready consumer."""
        channel = self.channel
        msg = msg.private()  # the topic may share it with its other channels
        context = f"CHANNEL({channel.name})"
        client = channel._ready_client()
        if client is None:
            channel.writes.write_to_backend(self.queue, msg, context, channel.memory_queue)
            return
        hold = channel.writes.write_held(self.queue, msg, context)
        if hold is None:  # others wait before it on disk
            channel.pump(client)
            return
        msg.hold = hold
        channel.deliver(client, msg)
        client.after_deliveries()

    def relocate_deferred(self) -> None:
        """A message deferred for long at the head of the held records keeps every later
        record (and its files, and their bookkeeping) for its whole deferral: store it again
        at the tail, early (module docstring), so the committed position moves on. In-flight
        heads are left alone: their timeout bounds them."""
        queue = self.queue
        count, head = queue.held()
        if count <= RELOCATE_AFTER:
            return
        channel = self.channel
        owners = {m.hold: m for m in channel.deferred.values() if m.hold is not None}
        while count > RELOCATE_AFTER:
            msg = owners.pop(head, None)
            if msg is None:
                return
            try:
                channel.writes.write_to_backend(
                    queue, msg, f"CHANNEL({channel.name})", channel.memory_queue
                )
            except BackendWriteError:
                return
            self.early[msg.id] = msg
            msg.hold = None
            queue.release(head)
            count, head = queue.held()
