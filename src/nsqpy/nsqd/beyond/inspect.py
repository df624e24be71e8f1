"""Inspection without consuming (nsqpy addition, ``--enable-inspect``; docs/beyond-go.md).

Reads what a topic or channel holds without touching it: the memory queue is copied, the disk
queue is read with ``DiskQueue.peek`` (its files opened on their own from the read cursor; the
queue's positions, buffers and depth are never moved), and in-flight and deferred messages are
listed from the channel's dicts. Nothing here changes delivery order, attempts or depth.

With ``--auth-http-address`` a request must carry a secret in ``X-NSQ-Auth-Secret`` that the
auth server grants what a SUB would need (:func:`require_grant`): bodies are never shown to a
caller who could not have subscribed to them.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ...internal.http_api import ApiError
from ..auth import AuthError, HttpCaller
from ..message import Message, message_from_bytes

if TYPE_CHECKING:
    from ..backend import Backend
    from ..channel import Channel
    from ..nsqd import NSQD
    from ..topic import Topic

_LENGTH = struct.Struct(">i")

#: The request header an inspecting caller puts its auth secret in (the secret of AUTH).
AUTH_SECRET_HEADER = "X-NSQ-Auth-Secret"


async def require_grant(nsqd: NSQD, request: web.Request, topic: str, channel: str | None) -> None:
    """With auth on, refuse unless the caller's secret may SUB to ``topic`` on ``channel``
    (on some channel for a topic's own queue): 401 ``AUTH_REQUIRED`` without a secret,
    403 ``AUTH_FAILED`` when the auth server refuses it, 403 ``UNAUTHORIZED`` otherwise."""
    if not nsqd.auth.enabled:
        return
    secret = request.headers.get(AUTH_SECRET_HEADER, "")
    if not secret:
        raise ApiError(401, "AUTH_REQUIRED")
    caller = HttpCaller(request.remote or "", request.secure, _common_name(request), secret)
    try:
        state = await nsqd.auth.http_state(caller)
    except AuthError:
        raise ApiError(403, "AUTH_FAILED") from None
    allowed = state.may_subscribe_to(topic) if channel is None else state.allows(topic, channel)
    if not allowed:
        raise ApiError(403, "UNAUTHORIZED")


def _common_name(request: web.Request) -> str:
    """The client certificate's common name over HTTPS, as AUTH sends for a TLS client."""
    transport = request.transport
    peer = transport.get_extra_info("peercert") if transport is not None else None
    for rdn in (peer or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


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
    queue = backend.disk_queue()
    if queue is None:
        return out
    # read a few extra records: restored deferred messages still have disk copies to skip
    for data in queue.peek(limit - len(out) + len(skip)):
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
    # a deferred message's record waiting in the queue (channel_held.py) is not queued
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
