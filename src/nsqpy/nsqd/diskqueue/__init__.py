"""A disk-backed FIFO byte queue, file for file compatible with go-diskqueue v1.1.0.

Go nsqd 1.3 keeps every topic's and channel's overflow in one of these queues; a data directory
written by Go nsqd can be read by this module and the other way round
(reference: ``go-nsq-behaviour.md`` §6.1).

On disk, for a queue called ``name`` in ``data_path``::

    <name>.diskqueue.000000.dat   records: BE32(len) + len bytes, back to back (mode 0600)
    <name>.diskqueue.000001.dat   ...a file is finished once the next record would not fit
    <name>.diskqueue.meta.dat     "<depth>\\n<readFileNum>,<readPos>\\n<writeFileNum>,<writePos>\\n"

Using it from an asyncio program (every method must be called from the event-loop thread)::

    queue = DiskQueue(name, data_path, max_bytes_per_file, min_msg_size, max_msg_size,
                      sync_every, sync_timeout, log)
    syncer = asyncio.create_task(queue.run_syncer())   # fsyncs in a worker thread when due
    queue.put(record)                  # or queue.put_many(records): one write(2) per batch
    record = queue.get()               # None when empty; consumes the record
    records = queue.get_many(limit)    # get() up to limit times; [] when empty
    ...
    syncer.cancel()
    queue.close()                      # final fsync + metadata; blocks, meant for shutdown

``put`` returns once the record is in the kernel (``os.write``), so a killed process loses
nothing; fsync, which protects against power loss, is left to ``sync``. An owner that wants
Go's ``--sync-every=1`` behaviour awaits ``queue.sync()`` right after each put or batch.
Instead of ``run_syncer`` an owner may poll ``sync_due()`` from its own periodic task.
Its timers (``sync_timeout``, the side file's interval, a failing sync's backoff) read the
``clock`` keyword argument, monotonic seconds (``time.monotonic`` unless given): an owner with
its own clock passes it, so a test moving that clock moves the queue's timers too.

Durability points, as in Go: a sync is due after ``sync_every`` reads+writes, after
``sync_timeout`` seconds with any activity, and at once when the writer rolls to a new file,
the reader moves to a new file, or corruption was handled. For those last three this module
starts the sync itself when an event loop is running.

Where this module deliberately differs from go-diskqueue (none of it changes the files):

* fsync never runs on the caller's thread except in ``close()``. A sync takes a snapshot of the
  positions on the loop thread and does the fsync, the metadata write and the rename in a worker
  thread; snapshots carry a sequence number so an older snapshot never overwrites a newer one.
* A file the reader has finished is deleted once metadata that no longer names it has been
  persisted (Go deletes it first and syncs after), so normally the metadata never points at a
  missing file. When the metadata cannot be written (a disk full to the last block cannot hold
  its temporary file) the finished files are deleted anyway, which frees the space the metadata
  needs; a crash before the metadata catches up leaves a read position in a deleted file, and
  start-up then continues at the next file that exists and recounts the depth. Only files the
  reader has finished are ever deleted this way, so that skip never passes an unread record.
* A failing sync is retried with a bounded exponential backoff (0.1 s doubling to 5 s), not at
  once, and its error is logged once, then summarised (``lg.RepeatSummary``); a failed write is
  cut back to the last good position so a torn record never sits in the file.
* Start-up salvage goes further than Go's: besides "write file longer than writePos" it also
  notices data files *after* writeFileNum (possible because a rotation's sync is asynchronous
  here), moves the writer past all of them, and adds the records found beyond the recorded
  writePos to the depth, so depth stays exact after a crash.
* The tail checks (depth reset, read position past write position) also run at start-up.
* A reader that has caught up with the writer when the writer rolls to a new file moves on
  instead of flagging the finished file as corrupt (Go's diskqueue renames it to .bad).

Held reads (nsqd turns them on for channels under ``--mem-queue-size=0
--sync-every=1``): after ``hold_reads()`` the metadata records a *committed* read position, the
start of the oldest record handed out by ``get_held``/``put_held`` and not yet ``release``d,
while an in-memory cursor runs ahead; files are deleted once that position leaves them. So a
SIGKILL loses no message in flight or deferred: it is read again, by us or by Go's diskqueue
(the files and the metadata keep Go's format; Go just sees an older read position). Chosen over
a journal of in-flight messages because it writes no second copy of a body and Go reads it.
A record keeps the attempts it was written with (a redelivery raises them back to what the
consumer saw); a requeue appends a newer record with its attempts before the old is released.
The bookkeeping, and the side file that spares finished records a redelivery, are in
holds.py; the reads and releases in held.py.

The package: ``DiskQueue`` (``queue``) is the facade with Go's API, composed of parts that
share one ``QueueState`` (``state``: the limits, positions, sync counter and held-reads fields)
and call each other's methods: ``QueueFiles`` (``files``: file names, the record and metadata
formats), ``Reader`` (``reading``), ``Writer`` (``writing``), ``Syncer`` (``syncing``: fsync,
metadata, deletion of finished files), ``Recovery`` (``recovery``: start-up salvage, tail
checks, .bad files) and ``HeldReads`` (``held``, with the bookkeeping in ``holds``).
"""

from __future__ import annotations

from .files import DiskQueueError, DiskQueuePositions, LogFunc, queue_names
from .queue import DiskQueue

__all__ = ["DiskQueue", "DiskQueueError", "DiskQueuePositions", "LogFunc", "queue_names"]
