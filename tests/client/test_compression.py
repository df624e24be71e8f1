"""Snappy framing and raw deflate stream codecs (sans-IO, no sockets)."""

from __future__ import annotations

import os
import zlib

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.protocol.compression import (
    SNAPPY_STREAM_IDENTIFIER,
    CompressionError,
    DeflateReader,
    DeflateWriter,
    SnappyFrameReader,
    SnappyFrameWriter,
)

chunks_strategy = st.lists(st.binary(max_size=3000), max_size=8)
splits_strategy = st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=20)


def feed_in_pieces(
    reader: SnappyFrameReader | DeflateReader, data: bytes, sizes: list[int]
) -> bytes:
    out = []
    pos = 0
    i = 0
    while pos < len(data):
        size = sizes[i % len(sizes)]
        out.append(reader.decompress(data[pos : pos + size]))
        pos += size
        i += 1
    return b"".join(out)


@settings(max_examples=60, deadline=None)
@given(writes=chunks_strategy, sizes=splits_strategy)
def test_snappy_roundtrip_in_arbitrary_pieces(writes: list[bytes], sizes: list[int]) -> None:
    writer = SnappyFrameWriter()
    wire = b"".join(writer.compress(w) for w in writes)
    assert feed_in_pieces(SnappyFrameReader(), wire, sizes) == b"".join(writes)


@settings(max_examples=60, deadline=None)
@given(writes=chunks_strategy, sizes=splits_strategy)
def test_deflate_roundtrip_in_arbitrary_pieces(writes: list[bytes], sizes: list[int]) -> None:
    writer = DeflateWriter(6)
    wire = b"".join(writer.compress(w) for w in writes)
    assert feed_in_pieces(DeflateReader(), wire, sizes) == b"".join(writes)


def test_snappy_writer_emits_one_valid_stream() -> None:
    writer = SnappyFrameWriter()
    first = writer.compress(b"hello " * 100)
    second = writer.compress(b"world")
    assert first.startswith(SNAPPY_STREAM_IDENTIFIER)
    assert not second.startswith(SNAPPY_STREAM_IDENTIFIER)
    # an independent decoder (cramjam's whole-stream one) reads the concatenation
    assert bytes(cramjam.snappy.decompress(first + second)) == b"hello " * 100 + b"world"
    assert writer.compress(b"") == b""


def test_snappy_large_write_is_split_into_64k_blocks() -> None:
    data = os.urandom(200_000)
    wire = SnappyFrameWriter().compress(data)
    pos, blocks = len(SNAPPY_STREAM_IDENTIFIER), 0
    while pos < len(wire):
        length = int.from_bytes(wire[pos + 1 : pos + 4], "little")
        assert wire[pos] in (0x00, 0x01)
        assert length - 4 <= 65536 + 65536 // 6 + 32
        pos += 4 + length
        blocks += 1
    assert blocks == 4
    assert SnappyFrameReader().decompress(wire) == data


def test_snappy_reader_holds_partial_chunks() -> None:
    wire = SnappyFrameWriter().compress(b"x" * 5000)
    reader = SnappyFrameReader()
    assert reader.decompress(wire[:-1]) == b""
    assert reader.buffered == len(wire) - len(SNAPPY_STREAM_IDENTIFIER) - 1
    assert reader.decompress(wire[-1:]) == b"x" * 5000
    assert reader.buffered == 0


def test_snappy_reader_skips_padding_and_skippable_chunks() -> None:
    wire = SnappyFrameWriter().compress(b"payload")
    ident, rest = wire[:10], wire[10:]
    skippable = bytes([0x80, 3, 0, 0]) + b"abc"
    padding = bytes([0xFE, 2, 0, 0]) + b"\0\0"
    assert SnappyFrameReader().decompress(ident + skippable + padding + rest + ident) == b"payload"


def test_snappy_reader_rejects_bad_streams() -> None:
    wire = SnappyFrameWriter().compress(b"payload" * 10)
    with pytest.raises(CompressionError, match="identifier"):
        SnappyFrameReader().decompress(wire[10:])
    with pytest.raises(CompressionError, match="reserved"):
        SnappyFrameReader().decompress(wire[:10] + bytes([0x05, 1, 0, 0, 0]))
    corrupt = bytearray(wire)
    corrupt[14] ^= 0xFF  # inside the first chunk's CRC
    with pytest.raises(CompressionError):
        SnappyFrameReader().decompress(bytes(corrupt))


def test_deflate_is_raw_with_sync_flush() -> None:
    wire = DeflateWriter(6).compress(b"OK")
    assert wire.endswith(b"\x00\x00\xff\xff")  # the empty stored block of a sync flush
    # raw deflate: no zlib header, so a raw inflater reads it and a zlib one would not
    assert zlib.decompressobj(-15).decompress(wire) == b"OK"
    with pytest.raises(CompressionError):
        DeflateReader().decompress(b"\xff\xff\xff\xff")
