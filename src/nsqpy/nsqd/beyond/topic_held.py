"""Go's route for a disk-backed topic, without Go's loss on a full disk.

With --mem-queue-size=0 (and --sync-every above 1) a publish is acknowledged once the message is
in the topic's disk queue, and the topic's pump copies it to the channels' disk queues later, as
Go's topic does: one write and one queue's fsyncs before the OK, however many channels. When a
channel's disk refuses the copy, Go logs "failed to write message to backend" and the copy is
gone. Here the topic's disk queue holds its reads (diskqueue/holds.py): its metadata moves past a
message only once every channel has settled its copy.

* A copy stored in every channel's queue settles at once, with the pump's batch.
* A copy a channel's disk refused waits in that channel's memory, deliverable at once, and
  settles when that channel has finished it (FIN, or moved it to a dead-letter topic) or
  dropped it (the channel was emptied or deleted).
* After a SIGKILL the topic copies again what it had not settled: at least once, never lost.

(With --sync-every=1 a publish still writes every channel's queue before its OK, which then
waits for their fsyncs: see Topic.publish_writes_channels.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..backend import Backend
    from ..channel import Channel
    from ..diskqueue import DiskQueue
    from ..diskqueue.holds import Hold
    from ..message import Message


class HeldCopies:
    """The topic's held disk queue and the copies that keep its records."""

    __slots__ = ("_batch", "_loose", "pending", "queue")

    def __init__(self, queue: DiskQueue) -> None:
        self.queue = queue
        queue.hold_reads()
        #: message ID -> (the hold on its record, the channels whose copy has not settled)
        self.pending: dict[bytes, tuple[Hold, set[Channel]]] = {}
        self._batch: dict[bytes, Hold] = {}  # the pump's current batch, by message ID
        self._loose: list[Hold] = []  # records of the batch that made no message

    def read_many(self, limit: int) -> tuple[list[bytes], list[Hold]]:
        """Up to ``limit`` records of the topic's queue, oldest first, and their holds."""
        return self.queue.get_many_held(limit)

    def taken(self, msg_id: bytes, hold: Hold) -> None:
        self._batch[msg_id] = hold

    def skipped(self, hold: Hold) -> None:
        self._loose.append(hold)

    def settle(self, refused: list[tuple[Backend, list[Message]]], channels: list[Channel]) -> None:
        """After the batch's writes: the records of refused copies stay held, one entry per
        message with every channel that refused it; the others are released together."""
        batch = self._batch
        if refused:
            pending = self.pending
            channel_of = {channel.backend: channel for channel in channels}
            for backend, msgs in refused:
                channel = channel_of[backend]
                for msg in msgs:
                    hold = batch.pop(msg.id, None)
                    if hold is not None:
                        pending[msg.id] = (hold, {channel})
                    elif msg.id in pending:  # refused by another channel of this batch too
                        pending[msg.id][1].add(channel)
        released = self._loose
        released.extend(batch.values())
        if released:
            self.queue.release_many(released)
        self._batch = {}
        self._loose = []

    def finished(self, channel: Channel, ids: list[bytes]) -> None:
        """``channel`` has finished these messages: a copy that was refused settles."""
        pending = self.pending
        released: list[Hold] = []
        for msg_id in ids:
            entry = pending.get(msg_id)
            if entry is None or channel not in entry[1]:
                continue
            entry[1].discard(channel)
            if not entry[1]:
                del pending[msg_id]
                released.append(entry[0])
        if released:
            self.queue.release_many(released)

    def dropped(self, channel: Channel) -> None:
        """``channel`` was emptied or deleted: its refused copies are gone on purpose."""
        released: list[Hold] = []
        for msg_id, (hold, waiting) in list(self.pending.items()):
            waiting.discard(channel)
            if not waiting:
                del self.pending[msg_id]
                released.append(hold)
        if released:
            self.queue.release_many(released)

    def clear(self) -> None:
        """The topic's queue is emptied (its holds with it)."""
        self.pending.clear()
        self._batch = {}
        self._loose = []
