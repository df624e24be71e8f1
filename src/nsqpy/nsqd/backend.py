"""Overflow queues behind a topic's or channel's memory queue.

The interface matches :class:`nsqpy.nsqd.diskqueue.DiskQueue` so a disk queue can stand in.
Ephemeral topics and channels use :class:`NullBackend`, which drops (as Go's does). What only
a queue with files can do (positions, peeks, held reads) is reached through ``disk_queue()``,
so callers ask the backend instead of testing its type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

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
