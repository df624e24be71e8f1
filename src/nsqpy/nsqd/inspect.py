"""Inspection without consuming (nsqpy addition, ``--enable-inspect``; docs/beyond-go.md).

Reads what a topic or channel holds without touching it: the memory queue is copied, the disk
queue is read with ``DiskQueue.peek`` (its files opened on their own from the read cursor; the
queue's positions, buffers and depth are never moved), and in-flight and deferred messages are
listed from the channel's dicts. Nothing here changes delivery order, attempts or depth.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .diskqueue import DiskQueue
from .message import Message, message_from_bytes

if TYPE_CHECKING:
    from .backend import Backend
    from .channel import Channel
    from .nsqd import NSQD
    from .topic import Topic

_LENGTH = struct.Struct(">i")


def queued(
    memory: Iterable[Message], backend: Backend, skip_ids: set[bytes], limit: int
) -> list[Message]:
    """The next ``limit`` messages in delivery order: memory first, then disk."""
    out: list[Message] = []
    for msg in memory:
        if len(out) >= limit:
            return out
        out.append(msg)
    skip = set(skip_ids)
    if not isinstance(backend, DiskQueue):
        return out
    # read a few extra records: restored deferred messages still have disk copies to skip
    for data in backend.peek(limit - len(out) + len(skip)):
        if len(out) >= limit:
            break
        try:
            msg = message_from_bytes(data)
        except ValueError:
            continue
        if msg.id in skip:
            skip.discard(msg.id)
            continue
        out.append(msg)
    return out


def peek_channel(channel: Channel, limit: int) -> list[Message]:
    # a deferred message's record waiting in the queue (channel_held.py, issue 22) is not queued
    skip = channel.skip_ids | channel.early_ids()
    return queued(channel.memory_queue, channel.backend, skip, limit)


def peek_topic(topic: Topic, limit: int) -> list[Message]:
    return queued(topic.memory_queue, topic.backend, topic.skip_ids, limit)


def describe(msg: Message) -> dict[str, Any]:
    return {
        "id": msg.id.decode("ascii", "replace"),
        "timestamp": msg.timestamp,
        "attempts": msg.attempts,
        "body": base64.b64encode(msg.body).decode("ascii"),
    }


def raw(msgs: list[Message]) -> bytes:
    """``format=raw``: each message as in a disk queue, ``BE32 size`` then
    ``BE64 timestamp, BE16 attempts, 16-byte id, body``."""
    parts = []
    for msg in msgs:
        encoded = msg.encode()
        parts.append(_LENGTH.pack(len(encoded)))
        parts.append(encoded)
    return b"".join(parts)


def in_flight(nsqd: NSQD, channel: Channel) -> list[dict[str, Any]]:
    """In-flight messages with their owner and deadline (wall-clock ns)."""
    now, wall = nsqd.now(), nsqd.wall_ns()
    out = []
    for msg in list(channel.in_flight.values()):
        entry = describe(msg)
        entry["client_id"] = msg.client.client_id if msg.client is not None else ""
        entry["deadline"] = wall + round((msg.pri - now) * 1e9)
        out.append(entry)
    return out


def deferred(nsqd: NSQD, channel: Channel) -> list[dict[str, Any]]:
    """Deferred messages with when they become due (wall-clock ns), soonest first."""
    now, wall = nsqd.now(), nsqd.wall_ns()
    out = []
    for msg in sorted(channel.deferred.values(), key=lambda m: m.pri):
        entry = describe(msg)
        entry["due"] = wall + round((msg.pri - now) * 1e9)
        out.append(entry)
    return out
