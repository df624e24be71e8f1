"""Overflow queues behind a topic's or channel's memory queue.

The interface matches :class:`nsqpy.nsqd.diskqueue.DiskQueue` so a disk queue can stand in.
Ephemeral topics and channels use :class:`NullBackend`, which drops (as Go's does).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol


class Backend(Protocol):
    def put(self, data: bytes) -> None: ...
    def put_many(self, records: Sequence[bytes]) -> None: ...
    def get(self) -> bytes | None: ...
    def depth(self) -> int: ...
    def empty(self) -> None: ...
    def delete(self) -> None: ...
    def close(self) -> None: ...


class NullBackend:
    """Go's ``newDummyBackendQueue``: accepts and discards; never has anything to read."""

    def put(self, data: bytes) -> None:
        pass

    def put_many(self, records: Sequence[bytes]) -> None:
        pass

    def get(self) -> bytes | None:
        return None

    def depth(self) -> int:
        return 0

    def empty(self) -> None:
        pass

    def delete(self) -> None:
        pass

    def close(self) -> None:
        pass


class MemoryBackend:
    """An unbounded in-process overflow queue (used when no data path persistence is wanted)."""

    def __init__(self) -> None:
        self._items: deque[bytes] = deque()

    def put(self, data: bytes) -> None:
        self._items.append(data)

    def put_many(self, records: Sequence[bytes]) -> None:
        self._items.extend(records)

    def get(self) -> bytes | None:
        return self._items.popleft() if self._items else None

    def depth(self) -> int:
        return len(self._items)

    def empty(self) -> None:
        self._items.clear()

    def delete(self) -> None:
        self._items.clear()

    def close(self) -> None:
        pass
