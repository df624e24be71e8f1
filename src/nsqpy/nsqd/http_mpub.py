"""HTTP ``/mpub`` bodies (Go: nsqd/http.go doMPUB), checked and published in slices.

A 5 MiB body holds up to 2.6 million one-byte lines (or a million binary messages), seconds
of Python work. Both steps share the event loop with every other client, so each works for
about 2 ms per loop turn (SLICE_SECONDS here, ``topic.SLICED_PUT_TURN`` for the puts) and
then yields:

* checking goes through the body once, before anything is published (a bad body publishes
  nothing, as in Go), and cuts it into chunks of at most CHUNK_MESSAGES messages: for text,
  regions of whole lines, split into lines only as they are put; for binary, the bodies;
* publishing makes each chunk's messages only when it is put, so at most a turn's worth of
  Message objects exists at a time, and each chunk is freed once put.

Chunks are bytes and tuples of bytes, which the cycle collector does not walk (a tuple of
bytes stops being tracked once it survives a collection): a list per chunk made the young
generation's one collection walk every waiting body, 18 ms at 2.6 million lines.

A failure while publishing (a refused disk write, the topic deleted or nsqd exiting between
turns) stops there and fails the request; the chunks put before it stay published, as Go's
``Topic.PutMessages`` keeps the messages before the one that failed.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from .nsqd import NSQD
    from .topic import Topic

#: Seconds of checking per event-loop turn before other clients are served.
SLICE_SECONDS = 0.002
#: The most messages in one chunk: the unit of one ``Topic.put_messages``, and the least a
#: publishing turn puts (about 1 ms with its disk writes).
CHUNK_MESSAGES = 256
#: The bytes of a text region before it is cut at the next newline: at most CHUNK_MESSAGES
#: non-empty lines (each takes two bytes with its newline), the last one running past.
TEXT_STEP = 2 * CHUNK_MESSAGES - 2

_BE32 = struct.Struct(">i")

Chunk = TypeVar("Chunk", bytes, tuple[bytes, ...])


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


# ---------------------------------------------------------------------- text mode


async def text_regions(body: bytes, max_msg_size: int) -> deque[bytes]:
    """Go's text mode, checked: MSG_TOO_BIG for a line over ``max_msg_size``. The regions
    of whole lines it returns give the messages through :func:`lines_of`."""
    regions: deque[bytes] = deque()
    turns = _Turns()
    length = len(body)
    pos = 0
    while pos < length:
        end = body.find(b"\n", pos + TEXT_STEP)
        if end < 0:
            end = length
        region = body[pos:end]
        # (no line of a region up to max_msg_size long can be longer)
        if len(region) > max_msg_size and max(map(len, region.split(b"\n"))) > max_msg_size:
            raise MpubBodyError("MSG_TOO_BIG")
        regions.append(region)
        pos = end + 1
        if turns.over():
            await turns.next()
    return regions


def lines_of(region: bytes) -> list[bytes]:
    """A text region's messages: its lines split on ``\\n`` (no ``\\r`` stripping), empty
    ones skipped, as Go's text mode."""
    return list(filter(None, region.split(b"\n")))


# ---------------------------------------------------------------------- binary mode


async def binary_bodies(
    body: bytes, max_msg_size: int, max_body_size: int
) -> deque[tuple[bytes, ...]]:
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
    chunks: deque[tuple[bytes, ...]] = deque()
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


async def publish(
    nsqd: NSQD,
    topic: Topic,
    chunks: deque[Chunk],
    bodies_of: Callable[[Chunk], list[bytes]],
) -> tuple[asyncio.Task[None], ...]:
    """Put every chunk's messages (``bodies_of(chunk)``) into ``topic`` a chunk at a time
    (``Topic.put_sliced``), each chunk freed once put; returns the fsyncs the answer must
    wait for.

    Raises as ``Topic.put_messages`` and ``batched_writes()`` do, at the first failure.
    With ``--max-queue-bytes`` caps the whole body is one put, so a publish that does not
    fit is refused as a whole (beyond/queue_limits.py)."""
    if nsqd.queue_limits.active:
        return topic.put_batch([body for chunk in chunks for body in bodies_of(chunk)])
    return await topic.put_sliced(bodies_of(chunks.popleft()) for _ in range(len(chunks)))
