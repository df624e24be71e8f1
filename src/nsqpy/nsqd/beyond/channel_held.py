"""A channel's held mode: the part of :class:`~nsqpy.nsqd.channel.Channel` that keeps each
message's disk record until the message is finished (``Channel`` inherits it).

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

In the default mode ``held_queue`` is None and nothing here runs but ``_release``, which finds
no hold; the channel's hot paths (``_take``, ``finish_many``) test ``held_queue`` themselves.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import BackendWriteError
from ..message import Message, message_from_bytes

if TYPE_CHECKING:
    from collections import deque

    from ..backend_writes import BackendWrites
    from ..consumer import Consumer
    from ..diskqueue import DiskQueue
    from ..nsqd import NSQD


#: held mode: once the committed position keeps more records than this, a deferred message at
#: its head is stored again at the tail (``_relocate_deferred``); the tests lower it
RELOCATE_AFTER = int(os.environ.get("NSQPY_HELD_RELOCATE_AFTER", "100000"))


class HeldMessages:
    """Held mode's state and methods; their ``self`` is the ``Channel`` inheriting them."""

    __slots__ = ("_early", "held_queue")

    if TYPE_CHECKING:  # the Channel's own, which held mode uses (declared for mypy only)
        name: str
        nsqd: NSQD
        writes: BackendWrites
        memory_queue: deque[Message]
        deferred: dict[bytes, Message]
        skip_ids: set[bytes]

        def _ready_client(self) -> Consumer | None: ...
        def pump(self, client: Consumer) -> None: ...
        def deliver(self, client: Consumer, msg: Message) -> None: ...
        def pump_all(self) -> None: ...
        def put(self, msg: Message) -> None: ...

    def __init__(self) -> None:
        # the disk queue holding every unfinished message (module docstring), or None
        self.held_queue: DiskQueue | None = None
        self._early: dict[bytes, Message] = {}

    def hold_messages(self, queue: DiskQueue) -> None:
        """Keep every message in ``queue`` (this channel's backend) until it is finished."""
        queue.hold_reads()
        self.held_queue = queue

    def _take_held(self, queue: DiskQueue, msgs: list[Message], count: int) -> list[Message]:
        """:meth:`_take` from a held queue: each message keeps its record's hold."""
        early = self._early
        while len(msgs) < count:
            got = queue.get_held()
            if got is None:
                break
            data, hold = got
            msg = self._decode(data)
            if msg is None:
                queue.release(hold)
                continue
            if self.skip_ids and msg.id in self.skip_ids:
                self.skip_ids.discard(msg.id)
                queue.release(hold)
                continue
            if early:
                deferred = early.pop(msg.id, None)
                if deferred is not None and self.deferred.get(msg.id) is deferred:
                    deferred.hold = hold  # still deferred: this record is now its hold
                    continue
            msg.hold = hold
            msgs.append(msg)
        return msgs

    def early_ids(self) -> set[bytes]:
        """IDs of deferred messages whose record waits in the queue (module docstring)."""
        return set(self._early)

    def _release(self, msg: Message) -> None:
        """``msg`` is finished or stored elsewhere: its record need not be kept."""
        hold = msg.hold
        if hold is not None:
            msg.hold = None
            if self.held_queue is not None:
                self.held_queue.release(hold)

    def _decode(self, data: bytes) -> Message | None:
        try:
            return message_from_bytes(data)
        except ValueError as exc:
            self.nsqd.logger.error(f"failed to decode message - {exc}")
            return None

    def _store_deferred(self, queue: DiskQueue, msg: Message) -> None:
        """Held mode: a DPUB's message is on disk for the whole of its deferral."""
        hold = self.writes.write_held(queue, msg, f"CHANNEL({self.name})")
        if hold is None:
            self._early[msg.id] = msg
        else:
            msg.hold = hold

    def _requeue_held(self, msg: Message) -> None:
        """Store ``msg`` again (as a newer record, with its attempts), then let the old go."""
        if self._early.get(msg.id) is msg:
            # its record still waits in the queue and is delivered when reached
            del self._early[msg.id]
            self.pump_all()
            return
        old = msg.hold
        msg.hold = None
        try:
            self.put(msg)
        except BackendWriteError:
            msg.hold = old  # the disk still has its earlier record
            self.memory_queue.append(msg)
            return
        if old is not None and self.held_queue is not None:
            self.held_queue.release(old)

    def _put_held(self, queue: DiskQueue, msg: Message) -> None:
        """Held mode: on disk first; held at once when it goes straight to a ready consumer."""
        msg = msg.private()  # the topic may share it with its other channels
        context = f"CHANNEL({self.name})"
        client = self._ready_client()
        if client is None:
            self.writes.write_to_backend(queue, msg, context, self.memory_queue)
            return
        hold = self.writes.write_held(queue, msg, context)
        if hold is None:  # others wait before it on disk
            self.pump(client)
            return
        msg.hold = hold
        self.deliver(client, msg)
        client.after_deliveries()

    def _relocate_deferred(self, queue: DiskQueue) -> None:
        """A message deferred for long at the head of the held records keeps every later
        record (and its files, and their bookkeeping) for its whole deferral: store it again
        at the tail, early (module docstring), so the committed position moves on. In-flight
        heads are left alone: their timeout bounds them."""
        owners = {m.hold: m for m in self.deferred.values() if m.hold is not None}
        count, head = queue.held()
        while count > RELOCATE_AFTER:
            msg = owners.pop(head, None)
            if msg is None:
                return
            try:
                self.writes.write_to_backend(queue, msg, f"CHANNEL({self.name})", self.memory_queue)
            except BackendWriteError:
                return
            self._early[msg.id] = msg
            msg.hold = None
            queue.release(head)
            count, head = queue.held()
