"""Syncing a disk queue: fsync in a worker thread, the metadata (and the held-reads side
file) written after it, finished files deleted once the metadata has moved past them."""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import Callable

from ...internal.lg import RepeatSummary
from .files import (
    OPEN_FLAGS_CLOEXEC,
    RETRY_FIRST,
    RETRY_MAX,
    QueueFiles,
    fsync_path,
    remove_quietly,
)
from .holds import (
    BOUNDARY_BYTES,
    SIDE_FILE_INTERVAL,
    encode_held,
)
from .state import QueueState


class SyncJob:
    """Everything a worker thread needs for one sync, so it shares nothing with the loop.

    Data files are fsynced through a descriptor of their own, opened by path: fsync flushes the
    file, not the descriptor, and the loop may close or roll its write descriptor meanwhile.
    """

    __slots__ = ("doomed_paths", "fsync_paths", "held_text", "meta_text", "seq")

    def __init__(
        self, seq: int, meta_text: bytes, fsync_paths: list[str], doomed_paths: list[str]
    ) -> None:
        self.seq = seq
        self.meta_text = meta_text
        self.fsync_paths = fsync_paths  # finished write files not yet fsynced + the current one
        self.doomed_paths = doomed_paths  # consumed files to delete once metadata moved on
        self.held_text: bytes | None = None  # hold_reads: the side file (holds.py)


class SyncResult:
    __slots__ = ("errors", "job", "ok")

    def __init__(self, job: SyncJob, ok: bool, errors: list[tuple[str, str]]) -> None:
        self.job = job
        self.ok = ok
        self.errors = errors  # (level, message) pairs, logged on the loop thread


class Syncer:
    """Makes a queue durable: fsync in a worker thread, then the metadata (and the side file
    of held reads) written, then the files the reader finished deleted."""

    __slots__ = (
        "_doomed_paths",
        "_failures",
        "_files",
        "_kicked_sync",
        "_meta_lock",
        "_need_sync",
        "_persisted_seq",
        "_retired_paths",
        "_retry_at",
        "_retry_delay",
        "_state",
        "_sync_lock",
        "_sync_loop",
        "_sync_seq",
        "write_file_open",
    )

    def __init__(self, state: QueueState, files: QueueFiles) -> None:
        self._state = state
        self._files = files
        self._need_sync = False
        self._retired_paths: list[str] = []  # finished write files not fsynced yet
        self._doomed_paths: list[str] = []  # finished read files, deleted after the metadata
        self._failures = RepeatSummary(state.log)
        self._retry_at = 0.0  # no sync before this time (by clock): backing off after failures
        self._retry_delay = 0.0
        self._kicked_sync: asyncio.Task[None] | None = None
        self._sync_lock: asyncio.Lock | None = None
        self._sync_loop: asyncio.AbstractEventLoop | None = None
        # Snapshot ordering between worker threads: a metadata rename happens only for a
        # snapshot newer than the last one persisted (or than the last Empty).
        self._meta_lock = threading.Lock()
        self._sync_seq = 0
        self._persisted_seq = 0
        # whether the writer has a file open (its file is then fsynced); set by DiskQueue
        self.write_file_open: Callable[[], bool] = lambda: False

    def sync_due(self) -> bool:
        """True when ``sync_every`` reads+writes happened since the last sync, or the oldest
        unsynced one is ``sync_timeout`` old, or a roll/file change/repair asks for one."""
        st = self._state
        if st.closed:
            return False
        if self._retry_at and st.clock() < self._retry_at:
            return False
        if self._need_sync:
            return True
        if st.side_stale and st.clock() - st.side_written_at >= SIDE_FILE_INTERVAL:
            return True
        if st.count == 0:
            return False
        if st.count >= st.sync_every:
            return True
        return st.clock() - st.dirty_since >= st.sync_timeout

    async def sync(self) -> None:
        """fsync the data and persist the metadata, the blocking part in a worker thread.

        Puts, gets and rotations may carry on meanwhile; the sync covers the state at the moment
        it starts. Concurrent calls run one after the other. Errors are logged and the sync is
        retried at the next ``sync_due()``.
        """
        st = self._state
        loop = asyncio.get_running_loop()
        if self._sync_lock is None or self._sync_loop is not loop:
            self._sync_lock = asyncio.Lock()  # an asyncio.Lock belongs to one loop
            self._sync_loop = loop
        async with self._sync_lock:
            if st.closed or not self._has_unsynced_changes():
                return
            job = self.take_sync_job()
            worker = loop.run_in_executor(None, self.run_sync_job, job)
            # absorbed even if this coroutine is cancelled: a failed job hands back the files
            # it still has to fsync or delete
            worker.add_done_callback(self._sync_job_done)
            await asyncio.shield(worker)

    async def run_syncer(self, interval: float | None = None) -> None:
        """Sync whenever one is due, checking every ``interval`` seconds (default
        ``min(sync_timeout, 0.1)``), until the queue is closed or the task is cancelled."""
        st = self._state
        period = interval if interval is not None else max(0.001, min(st.sync_timeout, 0.1))
        while not st.closed:
            await asyncio.sleep(period)
            if self.sync_due():
                try:
                    await self.sync()
                except Exception as exc:  # the syncer must outlive any one failure
                    self.sync_failed(f"DISKQUEUE({st.name}) failed to sync - {exc}")

    def _has_unsynced_changes(self) -> bool:
        st = self._state
        return self._need_sync or st.count > 0 or st.side_stale

    def request_sync(self) -> None:
        """Mark a sync as needed now; start one if an event loop is running here."""
        st = self._state
        self._need_sync = True
        if st.closed or self._backing_off():
            return  # sync_due() says when the backoff is over; the owner's poll starts it
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: the owner's next sync() or close() covers it
        pending = self._kicked_sync
        if pending is not None and not pending.done() and pending.get_loop() is loop:
            return  # that sync has not taken its snapshot yet, or will be followed by ours
        task = loop.create_task(self.sync())
        self._kicked_sync = task
        task.add_done_callback(self._kicked_sync_done)

    def _kicked_sync_done(self, task: asyncio.Task[None]) -> None:
        st = self._state
        self._kicked_sync = None
        if not task.cancelled() and task.exception() is not None:
            self.sync_failed(f"DISKQUEUE({st.name}) failed to sync - {task.exception()}")
        elif self._need_sync and not st.closed:
            # asked for after that sync had taken its snapshot (a request made while it ran
            # was folded into it): nothing else would start the sync that covers it
            self.request_sync()

    def drop_finished_files(self) -> None:
        """Files wholly before the committed position are deleted by the next sync."""
        st = self._state
        _, file_num, _ = st.committed()
        if file_num > st.committed_file:
            for finished in range(st.committed_file, file_num):
                self._doomed_paths.append(self._files.segment(finished))
            st.committed_file = file_num
            self.request_sync()

    def take_sync_job(self, final: bool = False) -> SyncJob:
        """Snapshot the state to persist; runs on the loop thread."""
        st = self._state
        self._sync_seq += 1
        depth, read_file_num, read_pos = st.committed()
        meta_text = (
            f"{depth}\n{read_file_num},{read_pos}\n{st.write_file_num},{st.write_pos}\n"
        ).encode()
        fsync_paths = self._retired_paths
        if self.write_file_open():
            fsync_paths.append(self._files.segment(st.write_file_num))
        job = SyncJob(self._sync_seq, meta_text, fsync_paths, self._doomed_paths)
        if st.holds is not None:
            job.held_text = self._side_file_due(final)
        self._retired_paths = []
        self._doomed_paths = []
        st.count = 0
        self._need_sync = False
        return job

    def _side_file_due(self, final: bool) -> bytes | None:
        """The side file's contents if one is due (holds.py): at most one per interval,
        since it lists every unfinished record; ``sync_due`` asks for the one put off."""
        st = self._state
        record = st.last_record
        holds = st.holds
        if record is None or holds is None:
            return None
        now = st.clock()
        if not final and now - st.side_written_at < SIDE_FILE_INTERVAL:
            st.side_stale = True
            return None
        st.side_stale = False
        st.side_written_at = now
        cursor = (st.read_file_num, st.read_pos)
        return encode_held(cursor, holds.unfinished(), st.last_start, record[:BOUNDARY_BYTES])

    def run_sync_job(self, job: SyncJob) -> SyncResult:
        """fsync, write the metadata, delete consumed files; may run in a worker thread."""
        st = self._state
        errors: list[tuple[str, str]] = []
        ok = True
        for path in job.fsync_paths:
            try:
                fsync_path(path)
            except FileNotFoundError:
                pass  # already consumed, or renamed to .bad
            except OSError as exc:
                errors.append(("ERROR", f"DISKQUEUE({st.name}) failed to sync - {exc}"))
                ok = False
        persist_error: OSError | None = None
        if ok:
            try:
                self._persist_metadata(job.seq, job.meta_text, job.held_text)
            except OSError as exc:
                persist_error = exc
        if (not ok or persist_error is not None) and job.doomed_paths:
            # The metadata still names a finished file, but the reader is past all of it:
            # deleting it now loses nothing (start-up skips a missing read file) and gives back
            # the space a full disk needs to write the metadata at all.
            self._remove_doomed(job, errors)
            if persist_error is not None:
                try:
                    self._persist_metadata(job.seq, job.meta_text, job.held_text)
                    persist_error = None
                except OSError as exc:
                    persist_error = exc
        if persist_error is not None:
            errors.append(("ERROR", f"DISKQUEUE({st.name}) failed to sync - {persist_error}"))
            ok = False
        if ok:
            self._remove_doomed(job, errors)
            job.fsync_paths = []
        return SyncResult(job, ok, errors)

    def _remove_doomed(self, job: SyncJob, errors: list[tuple[str, str]]) -> None:
        st = self._state
        kept = []
        for path in job.doomed_paths:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                message = f"DISKQUEUE({st.name}) failed to Remove({path}) - {exc}"
                errors.append(("ERROR", message))
                kept.append(path)  # e.g. a read-only data path: try again at the next sync
        job.doomed_paths = kept

    def _write_held_file(self, text: bytes) -> None:
        """The side file, right after the metadata it names (holds.py). Not fsynced:
        after a power cut an old or empty one no longer matches the metadata and is ignored."""
        tmp_path = (
            f"{self._files.meta_path}.{random.getrandbits(63)}.tmp"  # cleaned like the meta's
        )
        try:
            fd = os.open(
                tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | OPEN_FLAGS_CLOEXEC, 0o600
            )
            try:
                os.write(fd, text)
            finally:
                os.close(fd)
            os.rename(tmp_path, self._files.held_path)
        except OSError:
            remove_quietly(tmp_path)  # only an optimisation: everything is read again

    def _persist_metadata(self, seq: int, text: bytes, held_text: bytes | None = None) -> None:
        """Write the metadata to a temporary file, fsync it and rename it over the real one;
        then the side file that goes with it, if any."""
        tmp_path = f"{self._files.meta_path}.{random.getrandbits(63)}.tmp"
        fd = os.open(tmp_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | OPEN_FLAGS_CLOEXEC, 0o600)
        try:
            try:
                os.write(fd, text)
                os.fsync(fd)
            finally:
                os.close(fd)
            with self._meta_lock:
                if seq > self._persisted_seq:
                    os.rename(tmp_path, self._files.meta_path)
                    self._persisted_seq = seq
                    if held_text is not None:
                        self._write_held_file(held_text)
                    return
        except BaseException:
            remove_quietly(tmp_path)
            raise
        remove_quietly(tmp_path)  # a newer snapshot (or an Empty) got there first

    def _sync_job_done(self, worker: asyncio.Future[SyncResult]) -> None:
        st = self._state
        if worker.cancelled():
            return
        failure = worker.exception()
        if failure is not None:
            self.sync_failed(f"DISKQUEUE({st.name}) failed to sync - {failure}")
            self._need_sync = not st.closed
            return
        self.absorb_sync_result(worker.result())

    def absorb_sync_result(self, result: SyncResult) -> None:
        st = self._state
        if result.ok:
            self._sync_succeeded()
        for _, message in result.errors:
            self.sync_failed(message)
        # try again at the next sync_due(); keep what still has to be synced or deleted
        # (a removal can fail even when the metadata was written: a read-only data path)
        self._doomed_paths[:0] = result.job.doomed_paths
        if not result.ok:
            current = self._files.segment(st.write_file_num)
            self._retired_paths[:0] = [p for p in result.job.fsync_paths if p != current]
        if (result.job.doomed_paths or not result.ok) and not st.closed:
            self._need_sync = True

    def retire(self, path: str) -> None:
        """The writer finished this file: the next sync fsyncs it."""
        self._retired_paths.append(path)

    def doom(self, path: str) -> None:
        """The reader finished this file: deleted by the sync that moves the metadata past it."""
        self._doomed_paths.append(path)

    def forget_files(self) -> None:
        """Every data file is gone (Empty): nothing left to fsync or delete, nothing counted."""
        st = self._state
        for path in self._doomed_paths:
            remove_quietly(path)
        self._doomed_paths = []
        self._retired_paths = []
        st.count = 0

    def remove_metadata(self) -> OSError | None:
        """Delete the metadata file (Empty), first invalidating every snapshot taken so far: a
        worker still holding one must not bring the metadata file back."""
        with self._meta_lock:
            self._sync_seq += 1
            self._persisted_seq = self._sync_seq
            try:
                os.remove(self._files.meta_path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                return exc
        return None

    def _backing_off(self) -> bool:
        return bool(self._retry_at) and self._state.clock() < self._retry_at

    def sync_failed(self, message: str) -> None:
        """Log once, then summarise; wait longer before each retry (bounded)."""
        self._failures.failed("sync", message)
        self._retry_delay = min(RETRY_MAX, max(RETRY_FIRST, self._retry_delay * 2))
        self._retry_at = self._state.clock() + self._retry_delay

    def _sync_succeeded(self) -> None:
        st = self._state
        self._retry_delay = 0.0
        self._retry_at = 0.0
        self._failures.recovered("sync", f"DISKQUEUE({st.name}) sync succeeded again")
