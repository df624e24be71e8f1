"""The message encoding shared by the wire and the disk queue.

``BE64(timestamp_ns) BE16(attempts) 16-byte ASCII hex ID body``

On the wire a message is a frame of type 2 around that encoding, so a message frame begins
with ``BE32(size) BE32(2) BE64(timestamp_ns) BE16(attempts)``: :data:`MESSAGE_FRAME_HEADER`
packs those in one call for nsqd's delivery loop, whose size word is
:data:`MESSAGE_FRAME_OVERHEAD` plus the body's length.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

MSG_ID_LENGTH = 16
ID_START = 8 + 2  # the ID follows the timestamp and the attempts
MESSAGE_HEADER_LENGTH = ID_START + MSG_ID_LENGTH  # 26, go-diskqueue's minMsgSize for nsqd

#: ``BE64(timestamp_ns) BE16(attempts)``: the message header before the ID.
MESSAGE_HEADER = struct.Struct(">QH")
#: ``BE32(size) BE32(frame_type) BE64(timestamp_ns) BE16(attempts)``: a message frame's head.
MESSAGE_FRAME_HEADER = struct.Struct(">iiQH")
#: :data:`MESSAGE_FRAME_HEADER` and the 16-byte ID: everything of a message frame before its
#: body, packed in one call (one object) by nsqd's delivery loop.
MESSAGE_FRAME_HEAD = struct.Struct(">iiQH16s")
#: A message frame's size word less the body: the frame type word and the message header.
MESSAGE_FRAME_OVERHEAD = 4 + MESSAGE_HEADER_LENGTH


class DecodedMessage(NamedTuple):
    timestamp: int
    attempts: int
    id: bytes
    body: bytes


class MessageDecodeError(ValueError):
    pass


def encode_message(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    return MESSAGE_HEADER.pack(timestamp, attempts) + msg_id + body


def decode_message(data: bytes) -> DecodedMessage:
    if len(data) < MESSAGE_HEADER_LENGTH:
        raise MessageDecodeError(f"not enough data to decode valid message ({len(data)} bytes)")
    timestamp, attempts = MESSAGE_HEADER.unpack_from(data, 0)
    return DecodedMessage(
        timestamp,
        attempts,
        bytes(data[ID_START:MESSAGE_HEADER_LENGTH]),
        bytes(data[MESSAGE_HEADER_LENGTH:]),
    )
