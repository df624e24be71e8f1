"""Durable staging of the messages a task took from nsqd, before it FINishes them.

One Arrow IPC file per read task, ``<location>/<key>.arrow``. It is written to a temporary
name, fsynced, then hard-linked to its final name, which fails if the name exists: of two
attempts of the same task, exactly one *wins* and every later attempt replays the winner's
rows. Only :meth:`Staging.remove_through` (called from the source's ``commit``) deletes staged
files: until then they hold FINished messages that the sink may not have written yet.

A marker file ``_nsqpy_staging`` records which subscription owns the directory. The driver
writes it; a task that cannot see it runs on a machine that does not share the directory
(a local path on a cluster), and fails with that explanation rather than lose messages.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path

import pyarrow as pa

from .plan import tick_of_key

__all__ = ["MARKER", "STAGED_SCHEMA", "Staging", "StagingError"]

MARKER = "_nsqpy_staging"
SUFFIX = ".arrow"
TMP_DIR = "_tmp"

#: what a staged file holds: every column the source can produce
STAGED_SCHEMA = pa.schema(
    [
        pa.field("body", pa.binary(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("attempts", pa.int32(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("nsqd", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("channel", pa.string(), nullable=False),
    ]
)


class StagingError(RuntimeError):
    """The staging directory is missing, shared wrongly, or holds an unreadable file."""


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories
    finally:
        os.close(fd)


class Staging:
    """The staging directory of one query (or of one batch read)."""

    def __init__(self, location: str | os.PathLike[str]) -> None:
        self.path = Path(location)

    # ------------------------------------------------------------------ ownership

    def claim(self, identity: str) -> None:
        """Driver side: create the directory and its marker, or check that we own it."""
        self.path.mkdir(parents=True, exist_ok=True)
        marker = self.path / MARKER
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            self.check_owner(identity)
            return
        with os.fdopen(fd, "w") as f:
            f.write(identity)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(self.path)

    def check_owner(self, identity: str) -> None:
        """Task side: the marker must be visible and name the same subscription."""
        marker = self.path / MARKER
        try:
            owner = marker.read_text()
        except FileNotFoundError:
            raise StagingError(
                f"stagingLocation {str(self.path)!r} is not visible from this executor "
                f"(no {MARKER} file written by the driver): use a directory on storage that "
                "the driver and every executor share"
            ) from None
        if owner != identity:
            raise StagingError(
                f"stagingLocation {str(self.path)!r} belongs to another query "
                f"({owner}); give each query its own staging directory"
            )

    # ------------------------------------------------------------------ files

    def file(self, key: str) -> Path:
        return self.path / (key + SUFFIX)

    def publish(self, key: str, table: pa.Table) -> bool:
        """Stage ``table`` as ``key`` unless it exists; True if this call created it."""
        final = self.file(key)
        tmp_dir = self.path / TMP_DIR
        tmp_dir.mkdir(exist_ok=True)
        tmp = tmp_dir / f"{key}.{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                with pa.ipc.new_file(f, STAGED_SCHEMA) as writer:
                    writer.write_table(table)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, final)
            except FileExistsError:
                return False
            _fsync_dir(self.path)
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def load(self, key: str) -> pa.Table | None:
        """The staged rows of ``key``, or None if nothing was staged under that key."""
        path = self.file(key)
        try:
            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_file(source).read_all()
        except FileNotFoundError:
            return None
        except (pa.ArrowInvalid, OSError) as exc:
            raise StagingError(f"staged file {str(path)!r} is unreadable: {exc}") from exc
        return table

    def row_count(self, key: str) -> int | None:
        """How many rows ``key`` staged, or None if absent or unreadable."""
        try:
            table = self.load(key)  # memory-mapped: the rows are not copied
        except StagingError:
            return None
        return None if table is None else table.num_rows

    def discard(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.file(key).unlink()

    def keys(self) -> list[str]:
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        return sorted(n[: -len(SUFFIX)] for n in names if n.endswith(SUFFIX))

    def remove_through(self, tick: int) -> int:
        """Delete the staged files (and leftover temporaries) of every tick <= ``tick``."""
        removed = 0
        for key in self.keys():
            key_tick = tick_of_key(key)
            if key_tick is not None and key_tick <= tick:
                self.discard(key)
                removed += 1
        tmp_dir = self.path / TMP_DIR
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(tmp_dir):
                key_tick = tick_of_key(name.split(".", 1)[0])
                if key_tick is not None and key_tick <= tick:
                    with contextlib.suppress(FileNotFoundError):
                        (tmp_dir / name).unlink()
        return removed

    def write_state(self, name: str, state: dict[str, object]) -> None:
        """A small JSON file beside the staged data (atomically replaced)."""
        tmp = self.path / f".{name}.{uuid.uuid4().hex}"
        tmp.write_text(json.dumps(state, sort_keys=True))
        os.replace(tmp, self.path / name)

    def read_state(self, name: str) -> dict[str, object] | None:
        try:
            value = json.loads((self.path / name).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return value if isinstance(value, dict) else None
