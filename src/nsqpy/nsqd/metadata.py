"""``nsqd.dat``: which topics and channels exist and whether they are paused (nsqd/nsqd.go).

Written atomically as Go does (temporary file, fsync, rename), in Go's compact JSON:
``{"topics":[{"name":"t","paused":false,"channels":[{"name":"c","paused":false}]}],
"version":"1.3.0"}``. Ephemeral topics and channels are never written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import NSQ_VERSION

if TYPE_CHECKING:
    from ..internal.lg import Logger
    from .topic import Topic

METADATA_FILE = "nsqd.dat"


@dataclass
class ChannelMeta:
    name: str
    paused: bool = False


@dataclass
class TopicMeta:
    name: str
    paused: bool = False
    channels: list[ChannelMeta] = field(default_factory=list)


def snapshot(topics: list[Topic]) -> bytes:
    """The metadata JSON for the current non-ephemeral topics and channels."""
    entries: list[dict[str, Any]] = []
    for topic in topics:
        if topic.ephemeral:
            continue
        channels = [
            {"name": c.name, "paused": c.paused} for c in topic.channels.values() if not c.ephemeral
        ]
        entries.append({"name": topic.name, "paused": topic.paused, "channels": channels or None})
    body = {"topics": entries or None, "version": NSQ_VERSION}
    return json.dumps(body, separators=(",", ":")).encode()


def read_journal(path: str, logger: Logger) -> tuple[list[Any], int]:
    """The entries of an nsqpy JSON-lines side file and its line count, skipping a line a crash
    cut short; nothing when the file is missing, and nothing (logged) when it is unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.readlines()
    except FileNotFoundError:
        return [], 0
    except OSError as exc:
        logger.error(f"ignoring {os.path.basename(path)}: {exc}")
        return [], 0
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries, len(lines)


def write_atomically(path: str, data: bytes) -> None:
    """Go's PersistMetadata: write ``<path>.<random>.tmp`` (0600), fsync, rename over ``path``."""
    tmp = f"{path}.{random.getrandbits(63)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        # a full disk fails the write after the create: leave no empty .tmp behind
        # (Go leaves one per attempt)
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


#: temporary files of an atomic write (``nsqd.dat.<n>.tmp``, ``<queue>.diskqueue.meta.dat.<n>.tmp``)
_STALE_TEMP = re.compile(r"(?:nsqd\.dat|.+\.diskqueue\.meta\.dat)\.\d+\.tmp")


def remove_stale_temp_files(data_path: str) -> list[str]:
    """Delete temporary files a crash (or Go nsqd on a full disk) left in ``data_path``.

    Only nsqd's own atomic-write temporaries match; the rename that would have used them never
    happened, so nothing refers to them. Returns the names removed.
    """
    removed: list[str] = []
    try:
        names = os.listdir(data_path)
    except OSError:
        return removed
    for name in names:
        if _STALE_TEMP.fullmatch(name):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(data_path, name))
                removed.append(name)
    return removed


def load(path: str) -> list[TopicMeta]:
    """Parse ``nsqd.dat``; a missing file is a fresh start. ValueError on bad content."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    try:
        body = json.loads(data)
        topics = []
        for entry in body.get("topics") or []:
            channels = [
                ChannelMeta(str(c["name"]), bool(c.get("paused", False)))
                for c in entry.get("channels") or []
            ]
            topics.append(TopicMeta(str(entry["name"]), bool(entry.get("paused", False)), channels))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"failed to parse metadata in {path} - {exc}") from None
    return topics


class DirLock:
    """An exclusive ``flock`` on the data directory, so two nsqd never share one."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._fd: int | None = None

    def lock(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise OSError(
                f"cannot flock directory {self.directory} - {(exc.strerror or str(exc)).lower()} "
                "(possibly in use by another instance of nsqd)"
            ) from None
        self._fd = fd

    def unlock(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
