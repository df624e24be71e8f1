"""Message encoding shared by the wire and the disk queue: ``BE64(timestamp_ns) BE16(attempts)
16-byte ASCII ID body``, the same bytes in a message frame and in a disk-queue record."""

from __future__ import annotations

import pytest

from nsqpy.protocol import (
    MESSAGE_HEADER_LENGTH,
    MSG_ID_LENGTH,
    DecodedMessage,
    MessageDecodeError,
    decode_message,
    encode_message,
)

MSG_ID = b"18a3ddcae0800000"


def test_header_lengths() -> None:
    assert MSG_ID_LENGTH == 16
    assert MESSAGE_HEADER_LENGTH == 26  # go-diskqueue minMsgSize for nsqd


def test_encode_exact_bytes() -> None:
    data = encode_message(0x0102030405060708, 1, MSG_ID, b"test body")
    assert data == bytes.fromhex("0102030405060708 0001") + MSG_ID + b"test body"


def test_encode_attempts_is_big_endian_16_bit() -> None:
    data = encode_message(0, 0x1234, MSG_ID, b"")
    assert data[8:10] == b"\x12\x34"
    assert len(data) == 26


def test_decode_roundtrip() -> None:
    data = encode_message(1_700_000_000_123_456_789, 3, MSG_ID, b"\x00\nbody\xff")
    decoded = decode_message(data)
    assert decoded == DecodedMessage(1_700_000_000_123_456_789, 3, MSG_ID, b"\x00\nbody\xff")
    assert decoded.id == MSG_ID
    assert decoded.body == b"\x00\nbody\xff"


def test_decode_header_only_is_an_empty_body() -> None:
    assert decode_message(encode_message(5, 1, MSG_ID, b"")).body == b""


def test_decode_accepts_memoryview_and_bytearray() -> None:
    data = encode_message(5, 2, MSG_ID, b"abc")
    assert decode_message(bytearray(data)) == decode_message(data)  # type: ignore[arg-type]
    assert decode_message(memoryview(data)).body == b"abc"  # type: ignore[arg-type]


@pytest.mark.parametrize("length", [0, 1, 10, 25])
def test_decode_too_short(length: int) -> None:
    with pytest.raises(MessageDecodeError) as info:
        decode_message(b"\x00" * length)
    # Go: "not enough data to decode valid message"
    assert "not enough data to decode valid message" in str(info.value)
