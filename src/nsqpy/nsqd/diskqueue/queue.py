"""DiskQueue: Go's diskqueue API over the parts that do the work (see the package docstring)."""

from __future__ import annotations

import time
from collections.abc import Callable

from .files import (
    DiskQueueError,
    DiskQueuePositions,
    LogFunc,
    QueueFiles,
    describe,
)
from .held import HeldReads
from .reading import Reader
from .recovery import Recovery
from .state import QueueState
from .syncing import Syncer, SyncJob, SyncResult
from .writing import Writer


class DiskQueue:
    """A filesystem-backed FIFO queue of byte records (see the package docstring).

    The methods a message passes through (puts, gets, releases, the sync check) are the parts'
    own bound methods, so calling one through the queue costs no extra call.
    """

    __slots__ = (
        "_files",
        "_held",
        "_reader",
        "_recovery",
        "_state",
        "_syncer",
        "_writer",
        "get_held",
        "get_many",
        "get_many_held",
        "held",
        "hold_reads",
        "peek",
        "put",
        "put_framed",
        "put_held",
        "put_many",
        "release",
        "release_all",
        "release_many",
        "run_syncer",
        "sync",
        "sync_due",
    )

    def __init__(
        self,
        name: str,
        data_path: str,
        max_bytes_per_file: int,
        min_msg_size: int,
        max_msg_size: int,
        sync_every: int,
        sync_timeout: float,
        log: LogFunc,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        state = QueueState(
            name,
            max_bytes_per_file,
            min_msg_size,
            max_msg_size,
            sync_every,
            sync_timeout,
            log,
            clock,
        )
        files = QueueFiles(name, data_path)
        syncer = Syncer(state, files)
        reader = Reader(state, files, syncer)
        writer = Writer(state, files, syncer, reader)
        recovery = Recovery(state, files, syncer, reader, writer)
        held = HeldReads(state, files, syncer, reader, writer)
        reader.recovery = recovery
        syncer.write_file_open = writer.file_open
        self._state = state
        self._files = files
        self._syncer = syncer
        self._reader = reader
        self._writer = writer
        self._recovery = recovery
        self._held = held

        self.put = writer.put
        self.put_many = writer.put_many
        self.put_framed = writer.put_framed
        self.get_many = reader.get_many
        self.peek = reader.peek
        self.sync = syncer.sync
        self.sync_due = syncer.sync_due
        self.run_syncer = syncer.run_syncer
        self.hold_reads = held.hold_reads
        self.get_held = held.get_held
        self.get_many_held = held.get_many_held
        self.put_held = held.put_held
        self.release = held.release
        self.release_many = held.release_many
        self.held = held.held
        self.release_all = held.release_all

        recovery.start()

    @property
    def name(self) -> str:
        return self._state.name

    def disk_queue(self) -> DiskQueue:
        """The Backend protocol's question: this backend has files."""
        return self

    def depth(self) -> int:
        return self._state.depth

    def file_name(self, file_num: int) -> str:
        return self._files.segment(file_num)

    def meta_file_name(self) -> str:
        return self._files.meta_path

    def held_file_name(self) -> str:
        return self._files.held_path

    def positions(self) -> DiskQueuePositions:
        """Where the reader and the writer are, and the records between (for stats, tests and
        the queue-bytes bookkeeping). Without ``hold_reads`` the metadata file records this."""
        st = self._state
        return DiskQueuePositions(
            st.depth, st.read_file_num, st.read_pos, st.write_file_num, st.write_pos
        )

    def committed_positions(self) -> DiskQueuePositions:
        """What the metadata file records: with ``hold_reads`` the committed read position,
        and a depth that counts the held records."""
        st = self._state
        depth, read_file_num, read_pos = st.committed()
        return DiskQueuePositions(depth, read_file_num, read_pos, st.write_file_num, st.write_pos)

    def get(self) -> bytes | None:
        """Remove and return the oldest record, or None when the queue is empty. With
        ``hold_reads`` the record is taken for good (not held): e.g. dropped by a policy."""
        record = self._reader.get_record()
        if record is not None and self._state.holds is not None:
            self._held.release(self._state.last_held)
        return record

    def empty(self) -> None:
        """Delete every data file and the metadata; continue at writeFileNum + 1 (Go's Empty)."""
        st = self._state
        if st.closed:
            raise DiskQueueError("exiting")
        st.log("INFO", f"DISKQUEUE({st.name}): emptying")
        failure = self._recovery.skip_to_next_rw_file()
        self._syncer.forget_files()
        meta_failure = self._syncer.remove_metadata()
        if meta_failure is not None:
            st.log(
                "ERROR",
                f"DISKQUEUE({st.name}) failed to remove metadata file - {describe(meta_failure)}",
            )
            failure = meta_failure
        if failure is not None:
            raise DiskQueueError(describe(failure)) from failure

    def delete(self) -> None:
        """Empty the queue and close it without a sync (topic/channel deletion)."""
        st = self._state
        if st.closed:
            return
        try:
            self.empty()
        finally:
            st.log("INFO", f"DISKQUEUE({st.name}): deleting")
            st.closed = True
            self._close_files()

    def close(self) -> None:
        """Close the files after an fsync and a metadata write; blocks (meant for shutdown)."""
        st = self._state
        if st.closed:
            return
        st.log("INFO", f"DISKQUEUE({st.name}): closing")
        job = self._syncer.take_sync_job(final=True)
        st.closed = True
        self._close_files()
        result = self._syncer.run_sync_job(job)
        self._syncer.absorb_sync_result(result)
        if not result.ok:
            raise DiskQueueError("; ".join(message for _, message in result.errors))

    def _close_files(self) -> None:
        self._reader.close_file()
        self._writer.close_file()

    # the sync in two steps, for tests of snapshot ordering

    def _take_sync_job(self) -> SyncJob:
        return self._syncer.take_sync_job()

    def _run_sync_job(self, job: SyncJob) -> SyncResult:
        return self._syncer.run_sync_job(job)

    @property
    def _write_fd(self) -> int | None:
        return self._writer.write_fd
