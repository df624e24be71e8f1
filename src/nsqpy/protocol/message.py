"""The message encoding shared by the wire and the disk queue.

``BE64(timestamp_ns) BE16(attempts) 16-byte ASCII hex ID body``
"""

from __future__ import annotations

import struct
from typing import NamedTuple

MSG_ID_LENGTH = 16
MESSAGE_HEADER_LENGTH = 8 + 2 + MSG_ID_LENGTH  # 26, go-diskqueue's minMsgSize for nsqd

_HEADER = struct.Struct(">QH")


class DecodedMessage(NamedTuple):
    timestamp: int
    attempts: int
    id: bytes
    body: bytes


class MessageDecodeError(ValueError):
    pass


def encode_message(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    return _HEADER.pack(timestamp, attempts) + msg_id + body


def decode_message(data: bytes) -> DecodedMessage:
    if len(data) < MESSAGE_HEADER_LENGTH:
        raise MessageDecodeError(f"not enough data to decode valid message ({len(data)} bytes)")
    timestamp, attempts = _HEADER.unpack_from(data, 0)
    return DecodedMessage(timestamp, attempts, bytes(data[10:26]), bytes(data[26:]))
