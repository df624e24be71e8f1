"""Overflow queues behind a topic's or channel's memory queue.

The interface matches :class:`nsqpy.nsqd.diskqueue.DiskQueue` so a disk queue can stand in.
Ephemeral topics and channels use :class:`NullBackend`, which drops (as Go's does). What only
a queue with files can do (positions, peeks, held reads) is reached through ``disk_queue()``,
so callers ask the backend instead of testing its type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from .message import Message, decode_records

if TYPE_CHECKING:
    from .diskqueue import DiskQueue


class Backend(Protocol):
    @property
    def name(self) -> str: ...

    def put(self, data: bytes) -> None: ...
    def put_many(self, records: Sequence[bytes]) -> None: ...
    def put_framed(self, framed: bytes, count: int, largest: int) -> bool: ...
    def get(self) -> bytes | None: ...
    def get_many(self, limit: int) -> list[bytes]: ...
    def depth(self) -> int: ...
    def empty(self) -> None: ...
    def delete(self) -> None: ...
    def close(self) -> None: ...
    def sync_due(self) -> bool: ...
    async def sync(self) -> None: ...
    def disk_queue(self) -> DiskQueue | None:
        """This backend as a queue with files (positions, peeks, held reads), or None."""
        ...


def read_messages(
    backend: Backend,
    out: list[Message],
    count: int,
    skip_ids: set[bytes],
    log_error: Callable[[str], None],
) -> None:
    """Append messages decoded from ``backend``'s oldest records to ``out`` until it holds
    ``count`` or the backend is empty, a read buffer's records at a time. A record too short
    to be a message is logged and dropped, as Go's pumps log and go on; the disk copy of a
    restored deferred message (its id in ``skip_ids``) is dropped, once."""
    while len(out) < count:
        records = backend.get_many(count - len(out))
        if not records:
            return
        had = len(out)
        for error in decode_records(records, out):
            log_error(f"failed to decode message - {error}")
        if skip_ids:
            out[had:] = without_skipped(out[had:], skip_ids)


def without_skipped(msgs: list[Message], skip_ids: set[bytes]) -> list[Message]:
    """``msgs`` less those whose id is in ``skip_ids`` (each id skipped once)."""
    kept = []
    for msg in msgs:
        if msg.id in skip_ids:
            skip_ids.discard(msg.id)
        else:
            kept.append(msg)
    return kept


class NullBackend:
    """Go's ``newDummyBackendQueue``: accepts and discards; never has anything to read."""

    name = ""

    def put(self, data: bytes) -> None:
        pass

    def put_many(self, records: Sequence[bytes]) -> None:
        pass

    def put_framed(self, framed: bytes, count: int, largest: int) -> bool:
        return True  # taken, and dropped

    def get(self) -> bytes | None:
        return None

    def get_many(self, limit: int) -> list[bytes]:
        return []

    def depth(self) -> int:
        return 0

    def empty(self) -> None:
        pass

    def delete(self) -> None:
        pass

    def close(self) -> None:
        pass

    def sync_due(self) -> bool:
        return False

    async def sync(self) -> None:
        pass

    def disk_queue(self) -> DiskQueue | None:
        return None
