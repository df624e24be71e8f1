"""HTTP ``/mpub`` bodies (Go: nsqd/http.go doMPUB), parsed and published in slices.

A 5 MiB body holds up to 2.6 million one-byte lines (or a million binary messages), seconds
of Python work. Both steps share the event loop with every other client, so each works for
at most SLICE_SECONDS per loop turn and then yields:

* parsing walks the body once, splitting it into chunks of at most CHUNK_MESSAGES bodies;
  every error is found before anything is published, as in Go (a bad body publishes nothing);
* publishing turns each chunk into messages only when it is put, so at most a turn's worth
  of Message objects exists at a time, and the chunk's bodies are freed as it goes.

A failure while publishing (a refused disk write, the topic deleted or nsqd exiting between
turns) stops there and fails the request; the chunks put before it stay published, as Go's
``Topic.PutMessages`` keeps the messages before the one that failed.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .nsqd import NSQD
    from .topic import Topic

#: Seconds of parsing or publishing per event-loop turn before other clients are served.
SLICE_SECONDS = 0.002
#: The most bodies in one chunk: the unit of parsing and of one ``Topic.put_messages``.
CHUNK_MESSAGES = 1024
#: Bytes of a text body split at a time: at most CHUNK_MESSAGES non-empty lines (each takes
#: two bytes with its newline), plus the line running past the end.
TEXT_STEP = 2 * CHUNK_MESSAGES - 2

_BE32 = struct.Struct(">i")

#: Tuples, not lists: the cycle collector stops tracking a tuple of bytes, so a full
#: collection does not walk millions of bodies waiting to be published (15 ms a walk).
Chunks = deque[tuple[bytes, ...]]


class MpubBodyError(Exception):
    """A body Go refuses: HTTP 413 with ``code`` (``MSG_TOO_BIG``, ``BAD_BODY``, ...)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class _Turns:
    """Yields to the event loop once SLICE_SECONDS of work have passed in this turn."""

    __slots__ = ("_started",)

    def __init__(self) -> None:
        self._started = time.perf_counter()

    def over(self) -> bool:
        return time.perf_counter() - self._started >= SLICE_SECONDS

    async def next(self) -> None:
        await asyncio.sleep(0)
        self._started = time.perf_counter()


# ---------------------------------------------------------------------- parsing


async def text_bodies(body: bytes, max_msg_size: int) -> Chunks:
    """Go's text mode: lines split on ``\\n`` (no ``\\r`` stripping), empty ones skipped,
    MSG_TOO_BIG for a line over ``max_msg_size``."""
    chunks: Chunks = deque()
    turns = _Turns()
    length = len(body)
    pos = 0
    while pos < length:
        end = body.find(b"\n", pos + TEXT_STEP)
        if end < 0:
            end = length
        lines = body[pos:end].split(b"\n")
        if end - pos > max_msg_size and max(map(len, lines)) > max_msg_size:
            raise MpubBodyError("MSG_TOO_BIG")
        chunk = tuple(filter(None, lines))
        if chunk:
            chunks.append(chunk)
        pos = end + 1
        if turns.over():
            await turns.next()
    return chunks


async def binary_bodies(body: bytes, max_msg_size: int, max_body_size: int) -> Chunks:
    """Go's binary mode: ``BE32 count`` then ``count`` times ``BE32 size`` and the bytes (the
    TCP MPUB body), with the TCP command's checks; the error is the TCP code without ``E_``
    (BAD_BODY for the count, BAD_MESSAGE for a message). Bytes after the last message are
    ignored, as Go never reads them."""
    length = len(body)
    if length < 4:
        raise MpubBodyError("BAD_BODY")
    (count,) = _BE32.unpack_from(body, 0)
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise MpubBodyError("BAD_BODY")
    chunks: Chunks = deque()
    turns = _Turns()
    pos = 4
    left = count
    while left:
        take = min(left, CHUNK_MESSAGES)
        chunk, pos = _binary_chunk(body, pos, take, max_msg_size)
        chunks.append(chunk)
        left -= take
        if turns.over():
            await turns.next()
    return chunks


def _binary_chunk(
    body: bytes, pos: int, count: int, max_msg_size: int
) -> tuple[tuple[bytes, ...], int]:
    """``count`` message bodies from ``pos``, and the position after them."""
    length = len(body)
    unpack = _BE32.unpack_from
    chunk: list[bytes] = []
    append = chunk.append
    for _ in range(count):
        if length - pos < 4:
            raise MpubBodyError("BAD_MESSAGE")
        (size,) = unpack(body, pos)
        pos += 4
        if size <= 0 or size > max_msg_size or length - pos < size:
            raise MpubBodyError("BAD_MESSAGE")
        append(body[pos : pos + size])
        pos += size
    return tuple(chunk), pos


# ---------------------------------------------------------------------- publishing


async def publish(nsqd: NSQD, topic: Topic, chunks: Chunks) -> tuple[asyncio.Task[None], ...]:
    """Put every chunk into ``topic``, about SLICE_SECONDS of work per turn; returns the fsyncs
    the answer must wait for (as a single put would: the syncs under way before each turn,
    which include any a previous turn's writes started).

    Raises as ``Topic.put_messages`` and ``batched_writes()`` do, at the first failure.
    With ``--max-queue-bytes`` caps the whole body is one put, so a publish that does not
    fit is refused as a whole (queue_limits.py)."""
    if nsqd.queue_limits.active:
        chunks = deque([tuple(body for chunk in chunks for body in chunk)])
    writes = nsqd.writes
    syncs: dict[asyncio.Task[None], None] = {}
    # A turn's disk writes happen when batched_writes() ends, after its puts: the puts get
    # the share of SLICE_SECONDS they took in the previous turn (to begin with, a quarter:
    # writing a message to a disk queue costs about three times its put).
    put_share = 0.25
    while chunks:
        syncs.update(dict.fromkeys(writes.running_syncs(topic)))
        started = time.perf_counter()
        budget = SLICE_SECONDS * put_share
        with writes.batched_writes():
            topic.put_messages(topic.new_messages(list(chunks.popleft())))
            while chunks and time.perf_counter() - started < budget:
                topic.put_messages(topic.new_messages(list(chunks.popleft())))
            puts = time.perf_counter() - started
        put_share = puts / max(time.perf_counter() - started, 1e-9)
        if chunks:
            await asyncio.sleep(0)
    return tuple(syncs)
