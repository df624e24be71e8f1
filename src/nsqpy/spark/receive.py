"""A read task's deliveries kept as the raw frames nsqd sent, made into Arrow columns at once.

A read task stages every message it receives, so it needs no :class:`Message` object per
delivery: :class:`FrameConnection` appends the bytes of each message frame to one buffer and
remembers where the frame starts (one ``struct`` call and one append per message, where the
client's path copies the frame, slices id and body, builds a ``Message`` and calls the
delegate). Arrow kernels then cut the columns out of that buffer (:func:`frames_table`) and
write every FIN (or REQ) line of a connection in one piece (:func:`answer_lines`).

A message frame on the wire::

    BE32(size) BE32(frame type = 2) BE64(timestamp ns) BE16(attempts) id[16] body
    0          4                    8                   16              18     34

Other frames (responses, heartbeats, errors) leave the buffer and take the client's normal
path, one by one; so does a message that arrives after the task stopped taking messages
(:meth:`FrameConnection.freeze`): it is requeued at once.
"""

from __future__ import annotations

import array
import sys
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from ..client.connection import Connection, ConnectionDelegate, ConnectionOptions
from ..protocol import commands
from ..protocol.frames import FRAME_HEADER, FRAME_TYPE_MESSAGE, FrameTooLarge
from ..protocol.message import MESSAGE_HEADER_LENGTH
from .staging import STAGED_SCHEMA

__all__ = ["FrameConnection", "FrameLog", "ReceiveDelegate", "answer_lines", "frames_table"]

_TIMESTAMP_AT = 8  # after the frame's size and type
_ATTEMPTS_AT = 16
_ID_AT = 18
_BODY_AT = 34
#: the smallest message frame's size field: type + timestamp + attempts + id
_MIN_MESSAGE_SIZE = 4 + MESSAGE_HEADER_LENGTH


class ReceiveDelegate(ConnectionDelegate, Protocol):
    """A :class:`FrameConnection`'s delegate: the client's calls, and these two."""

    def on_frames(self, conn: FrameConnection, count: int) -> None:
        """``count`` more messages were received (kept in the connection's buffer)."""

    def on_late_message(self, conn: FrameConnection) -> None:
        """A message arrived after :meth:`FrameConnection.freeze` and was requeued."""


class FrameLog:
    """One connection's message frames, back to back, and where each starts."""

    __slots__ = ("data", "starts")

    def __init__(self, data: bytearray, starts: array.array[int]) -> None:
        self.data = data
        self.starts = starts

    def __len__(self) -> int:
        return len(self.starts)

    def frames(self) -> pa.Array:
        """One ``large_binary`` value per frame (the whole frame, header included)."""
        offsets = array.array("q", self.starts)
        offsets.append(len(self.data))
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(self.data)]
        return pa.Array.from_buffers(pa.large_binary(), len(self.starts), buffers)


class FrameConnection(Connection):
    """A :class:`Connection` that keeps message frames as raw bytes (see the module's doc)."""

    def __init__(self, address: str, options: ConnectionOptions, delegate: ReceiveDelegate) -> None:
        super().__init__(address, options, delegate)
        self.receiver = delegate
        self._buf = bytearray()
        #: end of the last whole frame in ``_buf`` (a frame's tail may follow)
        self._parsed = 0
        self._starts: array.array[int] = array.array("q")
        self._frozen = False

    def freeze(self) -> FrameLog:
        """Stop keeping messages (later ones are requeued as they arrive); the kept frames."""
        buf, parsed = self._buf, self._parsed
        self._buf = bytearray(buf[parsed:])
        del buf[parsed:]
        log = FrameLog(buf, self._starts)
        self._starts = array.array("q")
        self._parsed = 0
        self._frozen = True
        return log

    def _process(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, end = self._parsed, len(buf)
        starts, frozen = self._starts, self._frozen
        before = len(starts)
        unpack, max_size = FRAME_HEADER.unpack_from, self.options.max_frame_size
        while end - pos >= 8:
            size, frame_type = unpack(buf, pos)
            if size < 4 or size > max_size:
                self._fail(FrameTooLarge(f"invalid frame size {size}"))
                return
            stop = pos + 4 + size
            if stop > end:
                break
            if frame_type == FRAME_TYPE_MESSAGE and size >= _MIN_MESSAGE_SIZE and not frozen:
                starts.append(pos)
                pos = stop
                continue
            # anything else leaves the buffer (only a partial frame can follow it)
            frame = bytes(buf[pos:stop])
            del buf[pos:stop]
            end -= stop - pos
            self._other_frame(frame, frame_type, size)
            if self._lost:
                return
        self._parsed = pos
        if len(starts) > before:
            self.receiver.on_frames(self, len(starts) - before)

    def _other_frame(self, frame: bytes, frame_type: int, size: int) -> None:
        if frame_type == FRAME_TYPE_MESSAGE and size >= _MIN_MESSAGE_SIZE:
            # after freeze(): not staged, so back to the channel now (left unanswered it
            # would stay in flight until msg_timeout, unseen by the planner)
            self.write(commands.req(frame[_ID_AT:_BODY_AT], 0))
            self.receiver.on_late_message(self)
        else:
            # responses, errors, heartbeats (and a short message frame, which fails the
            # connection there): the client's path; its decoder holds nothing else
            super()._process(frame)


def _big_endian_ints(frames: pa.Array, start: int, width: int, typecode: str) -> array.array[int]:
    """The ``width``-byte big-endian integer at ``start`` of every frame, as an array."""
    part = pc.binary_slice(frames, start, start + width)
    first = memoryview(part.buffers()[1]).cast("q")[part.offset]
    values = array.array(typecode)
    values.frombytes(memoryview(part.buffers()[2])[first : first + width * len(part)])
    if sys.byteorder == "little":
        values.byteswap()
    return values


def frames_table(log: FrameLog, topic: str, channel: str, nsqd: str) -> pa.Table:
    """The staged rows of one connection's message frames (``STAGED_SCHEMA``)."""
    count = len(log)
    if count == 0:
        return STAGED_SCHEMA.empty_table()
    frames = log.frames()
    attempts = _big_endian_ints(frames, _ATTEMPTS_AT, 2, "H")
    timestamps = _big_endian_ints(frames, _TIMESTAMP_AT, 8, "q")
    nanoseconds = pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(timestamps)])
    columns = [
        # no frame is longer than the buffer: its length is a "to the end" that cannot
        # overflow the kernel's size arithmetic (as 1 << 62 did)
        pc.binary_slice(frames, _BODY_AT, len(log.data)).cast(pa.binary()),
        pc.binary_slice(frames, _ID_AT, _BODY_AT).cast(pa.large_string()).cast(pa.string()),
        pa.Array.from_buffers(pa.uint16(), count, [None, pa.py_buffer(attempts)]).cast(pa.int32()),
        pc.divide(nanoseconds, 1000).cast(pa.timestamp("us", tz="UTC")),
        pa.repeat(pa.scalar(nsqd, pa.string()), count),
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.repeat(pa.scalar(channel, pa.string()), count),
    ]
    return pa.Table.from_arrays(columns, schema=STAGED_SCHEMA)


def answer_lines(ids: pa.ChunkedArray | pa.Array, verb: bytes) -> bytes:
    """``FIN id\\n`` (``verb`` b"FIN") or ``REQ id 0\\n`` (b"REQ") for every id, in one piece."""
    if len(ids) == 0:
        return b""
    if isinstance(ids, pa.ChunkedArray):
        ids = pa.concat_arrays(ids.chunks) if ids.num_chunks != 1 else ids.chunk(0)
    head = pa.scalar(verb + b" ", pa.binary())
    tail = pa.scalar(b"\n" if verb == b"FIN" else b" 0\n", pa.binary())
    lines = pc.binary_join_element_wise(head, ids.cast(pa.binary()), tail, b"")
    offsets = memoryview(lines.buffers()[1]).cast("i")
    first, last = offsets[lines.offset], offsets[lines.offset + len(lines)]
    return bytes(memoryview(lines.buffers()[2])[first:last])
