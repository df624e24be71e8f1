"""Server frames: ``BE32(size) BE32(frame_type) data`` (size counts the type word + data)."""

from __future__ import annotations

import struct
from typing import NamedTuple

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2

MAGIC_V2 = b"  V2"
MAGIC_V1 = b"  V1"

#: A frame's head: ``BE32(size) BE32(frame_type)``.
FRAME_HEADER = struct.Struct(">ii")
_BE32 = struct.Struct(">i")


def encode_frame(frame_type: int, data: bytes) -> bytes:
    return FRAME_HEADER.pack(len(data) + 4, frame_type) + data


def encode_response(data: bytes) -> bytes:
    return encode_frame(FRAME_TYPE_RESPONSE, data)


def encode_error(data: bytes) -> bytes:
    return encode_frame(FRAME_TYPE_ERROR, data)


OK = b"OK"
HEARTBEAT = b"_heartbeat_"
CLOSE_WAIT = b"CLOSE_WAIT"
FRAME_OK = encode_response(OK)
FRAME_HEARTBEAT = encode_response(HEARTBEAT)
FRAME_CLOSE_WAIT = encode_response(CLOSE_WAIT)


class Frame(NamedTuple):
    frame_type: int
    data: bytes


class FrameTooLarge(Exception):
    pass


class FrameDecoder:
    """Incremental decoder for the frames an nsqd sends (client side)."""

    __slots__ = ("_buf", "_max_size")

    def __init__(self, max_size: int = 64 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._max_size = max_size

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        pos = 0
        end = len(buf)
        unpack = FRAME_HEADER.unpack_from
        while end - pos >= 8:
            size, frame_type = unpack(buf, pos)
            if size < 4 or size > self._max_size:
                raise FrameTooLarge(f"invalid frame size {size}")
            stop = pos + 4 + size
            if stop > end:
                break
            frames.append(Frame(frame_type, bytes(buf[pos + 8 : stop])))
            pos = stop
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)


def encode_sized(data: bytes) -> bytes:
    """``BE32(len) data``: command bodies, and nsqlookupd's unframed responses."""
    return _BE32.pack(len(data)) + data
