"""What nsqd keeps in its data path besides the queues themselves: ``nsqd.dat`` (the topics,
channels and pause states, written off the event loop one write per loop turn, retried with
a backoff when the disk refuses it) and the deferred messages saved at shutdown and restored
at start when their queues have not changed meanwhile.

The file formats are metadata.py's and beyond/deferred_store.py's; this module decides when they are
read and written. NSQD owns one :class:`Persistence` (``nsqd.persistence``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from typing import TYPE_CHECKING

from ..protocol import is_valid_name
from . import metadata
from .beyond import deferred_store
from .beyond.deferred_store import DeferredRecord
from .diskqueue import queue_names

if TYPE_CHECKING:
    from collections.abc import Callable

    from .backend import Backend
    from .message import Message
    from .nsqd import NSQD


class Persistence:
    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self.logger = nsqd.logger
        self.data_path = nsqd.data_path
        self.loading = False  # recreating topics from nsqd.dat: nothing to persist or announce
        self._persist_scheduled = False
        # One worker keeps metadata writes (and their fsync) ordered and off the event loop.
        self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nsqd-io")
        self._persisting: asyncio.Future[OSError | None] | None = None
        self._metadata_retry = 0.0  # seconds before retrying a failed nsqd.dat write
        self._deferred_records: dict[str, DeferredRecord] = {}

    # ------------------------------------------------------------------ metadata

    @property
    def metadata_path(self) -> str:
        return os.path.join(self.data_path, metadata.METADATA_FILE)

    def load_metadata(self) -> None:
        """Recreate topics, channels and pause state from ``nsqd.dat``."""
        self.loading = True
        try:
            for entry in metadata.load(self.metadata_path):
                if not is_valid_name(entry.name):
                    self.logger.warn(f"skipping creation of invalid topic {entry.name}")
                    continue
                topic = self.nsqd.get_topic(entry.name)
                if entry.paused:
                    topic.pause()
                for meta in entry.channels:
                    if not is_valid_name(meta.name):
                        self.logger.warn(f"skipping creation of invalid channel {meta.name}")
                        continue
                    channel = topic.get_channel(meta.name)
                    if meta.paused:
                        channel.pause()
            self._restore_unlisted_queues()
        finally:
            self.loading = False

    def _restore_unlisted_queues(self) -> None:
        """Bring back topics and channels whose disk queue exists but ``nsqd.dat`` misses.

        ``nsqd.dat`` is written a moment after a topic is created, so a crash in between leaves
        acknowledged messages in a queue that Go opens only once the topic is used again.
        Deleting a topic or channel removes its queue files first, so a queue on disk is one
        that still exists.
        """
        topics = self.nsqd.topics
        for queue in sorted(queue_names(self.data_path)):  # a topic before its channels
            topic_name, _, channel_name = queue.partition(":")  # new_channel's queue name
            names = [topic_name, channel_name] if channel_name else [topic_name]
            if not all(is_valid_name(name) for name in names):
                continue
            topic = topics.get(topic_name)
            if topic is not None and (not channel_name or channel_name in topic.channels):
                continue
            what = f"TOPIC({topic_name})"
            if channel_name:
                what += f": CHANNEL({channel_name})"
            self.logger.warn(f"{what}: found on disk but not in {metadata.METADATA_FILE}, restored")
            topic = self.nsqd.get_topic(topic_name)
            if channel_name:
                topic.get_channel(channel_name)

    def persist_metadata(self) -> None:
        """Schedule one write of ``nsqd.dat`` for this event-loop turn (off the loop)."""
        if self.loading or self.nsqd.exiting or self._persist_scheduled:
            return
        self._persist_scheduled = True
        self.nsqd.loop.call_soon(self._persist_soon)

    def _persist_soon(self) -> None:
        self._persist_scheduled = False
        if self.nsqd.exiting:  # the shutdown writes the last nsqd.dat (write_metadata_last)
            return
        data = metadata.snapshot(list(self.nsqd.topics.values()))
        future = self.nsqd.loop.run_in_executor(self._io, self._write_metadata, data)
        self._persisting = asyncio.ensure_future(future)
        self._persisting.add_done_callback(self._metadata_written)

    def _write_metadata(self, data: bytes) -> OSError | None:
        try:
            metadata.write_atomically(self.metadata_path, data)
        except OSError as exc:
            return exc
        return None

    def _metadata_written(self, done: asyncio.Future[OSError | None]) -> None:
        """A failed write of nsqd.dat is said once and retried with a
        backoff, so a topic or channel created on a full disk is recorded once space is back."""
        fault_log = self.nsqd.fault_log
        error = None if done.cancelled() else done.result()
        if error is None:
            self._metadata_retry = 0.0
            fault_log.recovered(metadata.METADATA_FILE, "NSQ: persisted metadata again")
            return
        fault_log.failed(metadata.METADATA_FILE, f"failed to persist metadata - {error}")
        self._metadata_retry = min(5.0, max(0.1, self._metadata_retry * 2))
        if not self.nsqd.exiting:
            self.nsqd.loop.call_later(self._metadata_retry, self.persist_metadata)

    def write_metadata_now(self) -> None:
        """Write ``nsqd.dat`` on the calling thread: at start and at shutdown."""
        self.logger.info(f"NSQ: persisting topic/channel metadata to {self.metadata_path}")
        error = self._write_metadata(metadata.snapshot(list(self.nsqd.topics.values())))
        if error is not None:
            self.nsqd.fault_log.failed(
                metadata.METADATA_FILE, f"failed to persist metadata - {error}"
            )

    async def write_metadata_last(self) -> None:
        """Shutdown: after the write under way (if any), the final ``nsqd.dat``."""
        if self._persisting is not None:
            await self._persisting
        self.write_metadata_now()

    def close(self) -> None:
        """Shutdown, after every write: stop the metadata writer thread."""
        self._io.shutdown(wait=True)

    # ------------------------------------------------------------------ deferred across restarts

    def remember_deferred(self, backend: Backend, deferred: list[tuple[Message, float]]) -> None:
        """Shutdown: the deferred messages of a queue being flushed, for ``save_deferred``."""
        if deferred and backend.disk_queue() is not None:
            self._deferred_records[backend.name] = DeferredRecord([], deferred)

    def save_deferred(self) -> None:
        """After every queue is closed: record where each queue stands, then write the file."""
        queues = {q.name: q for b in self.nsqd.backends() if (q := b.disk_queue()) is not None}
        records = {}
        for name, record in self._deferred_records.items():
            queue = queues.get(name)
            if queue is not None:
                record.positions = list(queue.positions())
                records[name] = record
        try:
            deferred_store.save(self.data_path, records)
        except OSError as exc:
            self.logger.error(f"failed to persist deferred messages - {exc}")

    def restore_deferred(self) -> None:
        try:
            records = deferred_store.load(self.data_path)
        except ValueError as exc:
            self.logger.error(f"ignoring deferred messages: {exc}")
            records = {}
        for topic in self.nsqd.topics.values():
            self._restore_queue(records, topic.backend, topic.skip_ids, topic.restore_deferred)
            for channel in topic.channels.values():
                self._restore_queue(
                    records, channel.backend, channel.skip_ids, channel.restore_deferred
                )
        deferred_store.remove(self.data_path)

    def _restore_queue(
        self,
        records: dict[str, DeferredRecord],
        backend: Backend,
        skip_ids: set[bytes],
        restore: Callable[[Message, float], None],
    ) -> None:
        disk_queue = backend.disk_queue()
        if disk_queue is None or backend.name not in records:
            return
        record = records[backend.name]
        if record.positions != list(disk_queue.positions()):
            self.logger.warn(
                f"DISKQUEUE({backend.name}): changed since shutdown; deferred messages "
                "will be delivered when read, as Go does"
            )
            return
        for msg, remaining in record.messages:
            skip_ids.add(msg.id)
            restore(msg, remaining)
        self.logger.info(
            f"DISKQUEUE({backend.name}): restored {len(record.messages)} deferred messages"
        )
