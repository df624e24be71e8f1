"""Overflow queues behind a topic's or channel's memory queue.

The interface matches :class:`nsqpy.nsqd.diskqueue.DiskQueue` so a disk queue can stand in.
Ephemeral topics and channels use :class:`NullBackend`, which drops (as Go's does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Backend(Protocol):
    @property
    def name(self) -> str: ...

    def put(self, data: bytes) -> None: ...
    def put_many(self, records: Sequence[bytes]) -> None: ...
    def get(self) -> bytes | None: ...
    def get_many(self, limit: int) -> list[bytes]: ...
    def depth(self) -> int: ...
    def empty(self) -> None: ...
    def delete(self) -> None: ...
    def close(self) -> None: ...


class NullBackend:
    """Go's ``newDummyBackendQueue``: accepts and discards; never has anything to read."""

    name = ""

    def put(self, data: bytes) -> None:
        pass

    def put_many(self, records: Sequence[bytes]) -> None:
        pass

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
