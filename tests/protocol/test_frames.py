"""Server frames (``BE32(size) BE32(type) data``, the size counting the type's 4 bytes; type 0
response, 1 error, 2 message) and the client-side FrameDecoder."""

from __future__ import annotations

import struct

import pytest

from nsqpy.protocol import (
    CLOSE_WAIT,
    FRAME_CLOSE_WAIT,
    FRAME_HEARTBEAT,
    FRAME_OK,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    MAGIC_V1,
    MAGIC_V2,
    OK,
    Frame,
    FrameDecoder,
    encode_error,
    encode_frame,
    encode_response,
    encode_sized,
)
from nsqpy.protocol.frames import FrameTooLarge


def test_magic_bytes() -> None:
    assert MAGIC_V2 == b"  V2"
    assert MAGIC_V1 == b"  V1"


def test_frame_type_numbers() -> None:
    assert (FRAME_TYPE_RESPONSE, FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE) == (0, 1, 2)


def test_ok_frame_bytes() -> None:
    assert OK == b"OK"
    assert bytes.fromhex("00000006 00000000 4f4b") == FRAME_OK
    assert encode_response(b"OK") == FRAME_OK


def test_heartbeat_frame_bytes() -> None:
    # the bytes Go's nsqd sends for a heartbeat
    expected = bytes.fromhex("0000000f 00000000 5f 68 65 61 72 74 62 65 61 74 5f")
    assert HEARTBEAT == b"_heartbeat_"
    assert expected == FRAME_HEARTBEAT


def test_close_wait_frame_bytes() -> None:
    assert CLOSE_WAIT == b"CLOSE_WAIT"
    assert bytes.fromhex("0000000e 00000000") + b"CLOSE_WAIT" == FRAME_CLOSE_WAIT


def test_error_frame_bytes() -> None:
    # Go's answer to a wrong magic: FRAME(1, "E_BAD_PROTOCOL") = 00 00 00 12 00 00 00 01 + text
    assert encode_error(b"E_BAD_PROTOCOL") == bytes.fromhex("00000012 00000001") + b"E_BAD_PROTOCOL"
    # Go's protocol test: E_INVALID invalid command ASDF is announced as 0x22 bytes
    frame = encode_error(b"E_INVALID invalid command ASDF")
    assert frame[:8] == bytes.fromhex("00000022 00000001")


def test_encode_frame_message_type_and_empty_data() -> None:
    assert encode_frame(FRAME_TYPE_MESSAGE, b"xyz") == b"\x00\x00\x00\x07\x00\x00\x00\x02xyz"
    assert encode_frame(FRAME_TYPE_RESPONSE, b"") == b"\x00\x00\x00\x04\x00\x00\x00\x00"


def test_encode_sized() -> None:
    assert encode_sized(b"") == b"\x00\x00\x00\x00"
    assert encode_sized(b"OK") == b"\x00\x00\x00\x02OK"
    assert encode_sized(b"x" * 256) == b"\x00\x00\x01\x00" + b"x" * 256


def test_decoder_whole_frames_in_one_chunk() -> None:
    decoder = FrameDecoder()
    stream = FRAME_OK + FRAME_HEARTBEAT + encode_error(b"E_INVALID x")
    frames = decoder.feed(stream)
    assert frames == [
        Frame(FRAME_TYPE_RESPONSE, b"OK"),
        Frame(FRAME_TYPE_RESPONSE, b"_heartbeat_"),
        Frame(FRAME_TYPE_ERROR, b"E_INVALID x"),
    ]
    assert decoder.buffered == 0


def test_decoder_byte_by_byte() -> None:
    decoder = FrameDecoder()
    stream = FRAME_OK + encode_frame(FRAME_TYPE_MESSAGE, b"m" * 40)
    frames: list[Frame] = []
    for i in range(len(stream)):
        frames += decoder.feed(stream[i : i + 1])
        if i < len(FRAME_OK) - 1:
            assert frames == []
    assert frames == [Frame(0, b"OK"), Frame(2, b"m" * 40)]


def test_decoder_keeps_partial_frame_buffered() -> None:
    decoder = FrameDecoder()
    stream = FRAME_OK + FRAME_HEARTBEAT
    assert decoder.feed(stream[:-3]) == [Frame(0, b"OK")]
    assert decoder.buffered == len(FRAME_HEARTBEAT) - 3
    assert decoder.feed(stream[-3:]) == [Frame(0, b"_heartbeat_")]
    assert decoder.buffered == 0


def test_decoder_header_only_waits() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"\x00\x00\x00\x06\x00\x00\x00") == []
    assert decoder.feed(b"\x00") == []
    assert decoder.feed(b"OK") == [Frame(0, b"OK")]


def test_decoder_empty_data_frame() -> None:
    assert FrameDecoder().feed(encode_frame(0, b"")) == [Frame(0, b"")]


def test_decoder_unknown_frame_type_is_passed_through() -> None:
    assert FrameDecoder().feed(encode_frame(7, b"?")) == [Frame(7, b"?")]


@pytest.mark.parametrize("size", [0, 3, -1, -(2**31)])
def test_decoder_rejects_sizes_below_the_type_word(size: int) -> None:
    with pytest.raises(FrameTooLarge):
        FrameDecoder().feed(struct.pack(">ii", size, 0))


def test_decoder_rejects_frames_over_its_limit() -> None:
    decoder = FrameDecoder(max_size=100)
    assert decoder.feed(encode_frame(0, b"x" * 96)) == [Frame(0, b"x" * 96)]
    with pytest.raises(FrameTooLarge):
        decoder.feed(struct.pack(">ii", 101, 0))


def test_frame_is_a_tuple() -> None:
    frame = Frame(FRAME_TYPE_ERROR, b"E_X y")
    frame_type, data = frame
    assert (frame_type, data) == (1, b"E_X y")
    assert frame.frame_type == 1
    assert frame.data == b"E_X y"
