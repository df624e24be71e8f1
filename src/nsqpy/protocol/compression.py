"""Stream compression negotiated by IDENTIFY, as sans-IO byte transformers.

Each direction of a connection is one continuous stream: a writer turns the plain bytes of one
flush into compressed bytes to put on the wire, a reader turns whatever arrived from the wire
into the plain bytes available so far. No sockets and no buffering decisions live here, so the
client and nsqd can both wrap their transports with the same classes.

* Snappy is the *framing format* (https://github.com/google/snappy/blob/main/framing_format.txt):
  a stream identifier chunk, then compressed (0x00) or uncompressed (0x01) chunks of at most
  64 KiB of data, each with a masked CRC-32C. cramjam does the block work and the checksums; this
  module finds chunk boundaries so a partial chunk waits for the rest of its bytes.
* Deflate is raw DEFLATE (RFC 1951, no zlib header, ``wbits=-15``) with a sync flush after every
  write, which is what Go's ``compress/flate`` speaks and what nsqd emits per buffer flush.
"""

from __future__ import annotations

import zlib

import cramjam

__all__ = [
    "SNAPPY_STREAM_IDENTIFIER",
    "CompressionError",
    "DeflateReader",
    "DeflateWriter",
    "SnappyFrameReader",
    "SnappyFrameWriter",
]

#: Chunk type 0xff, length 6, "sNaPpY": every snappy framed stream starts with it.
SNAPPY_STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"

_CHUNK_COMPRESSED = 0x00
_CHUNK_UNCOMPRESSED = 0x01
_CHUNK_PADDING = 0xFE
_CHUNK_STREAM_IDENTIFIER = 0xFF
_FIRST_SKIPPABLE = 0x80
_LAST_SKIPPABLE = 0xFD
_MAX_BLOCK = 65536
#: A compressed chunk holds a CRC and at most snappy's worst case for one 64 KiB block.
_MAX_DATA_CHUNK = 4 + 32 + _MAX_BLOCK + _MAX_BLOCK // 6


class CompressionError(ValueError):
    """The peer sent bytes that are not a valid compressed stream; the connection is unusable."""


class SnappyFrameWriter:
    """Compresses each write into snappy framing-format chunks.

    The first write carries the stream identifier; later writes are bare chunks, so the output
    of successive ``compress`` calls concatenates into one valid stream.
    """

    __slots__ = ("_started",)

    def __init__(self) -> None:
        self._started = False

    def compress(self, data: bytes) -> bytes:
        if not data:
            return b""
        # cramjam emits a complete stream (identifier + chunks of <= 64 KiB, uncompressed chunks
        # where compression does not pay); after the first write we drop the identifier.
        framed = bytes(cramjam.snappy.compress(data))
        if self._started:
            return framed[len(SNAPPY_STREAM_IDENTIFIER) :]
        self._started = True
        return framed


class SnappyFrameReader:
    """Decodes a snappy framed stream fed in arbitrary pieces.

    ``decompress(data, max_length)`` returns the plain bytes of whole chunks, at most
    ``max_length`` of them (but always at least one chunk's worth when one is complete); the
    remaining complete chunks stay buffered and ``pending`` is true until ``decompress(b"")``
    calls have drained them. A peer's small input then never turns into one huge buffer.
    """

    __slots__ = ("_buf", "_started")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._started = False

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        """Feed bytes from the wire; return the plain bytes of the chunks now complete."""
        buf = self._buf
        buf += data
        end = self._complete_prefix(max_length)
        if end == 0:
            return b""
        chunks = bytes(buf[:end])
        del buf[:end]
        try:
            # the identifier in front lets cramjam treat any run of chunks as a stream
            return bytes(cramjam.snappy.decompress(SNAPPY_STREAM_IDENTIFIER + chunks))
        except cramjam.DecompressionError as exc:
            raise CompressionError(f"snappy: {exc}") from exc

    def _complete_prefix(self, max_length: int = 0) -> int:
        """Validate chunk headers and return the length of the run of complete chunks.

        With ``max_length`` the run stops before the chunk that would take its plain size past
        ``max_length`` (a run holds at least one data chunk).
        """
        buf = self._buf
        size = len(buf)
        pos = 0
        plain = 0
        while size - pos >= 4:
            chunk_type = buf[pos]
            length = buf[pos + 1] | buf[pos + 2] << 8 | buf[pos + 3] << 16
            if not self._started:
                if chunk_type != _CHUNK_STREAM_IDENTIFIER:
                    raise CompressionError("snappy: stream does not start with an identifier")
                self._started = True
            if chunk_type in (_CHUNK_COMPRESSED, _CHUNK_UNCOMPRESSED):
                if length < 4 or length > _MAX_DATA_CHUNK:
                    raise CompressionError(f"snappy: invalid chunk length {length}")
            elif chunk_type == _CHUNK_STREAM_IDENTIFIER:
                if length != 6:
                    raise CompressionError("snappy: invalid stream identifier")
            elif chunk_type < _FIRST_SKIPPABLE:
                raise CompressionError(f"snappy: reserved unskippable chunk type {chunk_type:#x}")
            # padding and 0x80-0xfd chunks are skippable; cramjam skips them too
            if size - pos - 4 < length:
                break
            if max_length and chunk_type in (_CHUNK_COMPRESSED, _CHUNK_UNCOMPRESSED):
                chunk_plain = self._plain_length(pos, length)
                if plain and plain + chunk_plain > max_length:
                    break
                plain += chunk_plain
            pos += 4 + length
        return pos

    def _plain_length(self, pos: int, length: int) -> int:
        """The decoded size of the data chunk at ``pos`` (its header's length is ``length``)."""
        if self._buf[pos] == _CHUNK_UNCOMPRESSED:
            return length - 4
        # a compressed block starts with its decoded length as a little-endian varint
        value = shift = 0
        for i in range(pos + 8, min(pos + 4 + length, pos + 13)):
            byte = self._buf[i]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return min(value, _MAX_BLOCK)
            shift += 7
        return _MAX_BLOCK  # malformed: cramjam will say so when it decodes the chunk

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet form a complete chunk."""
        return len(self._buf)

    @property
    def pending(self) -> bool:
        """Whether complete chunks are still buffered (``decompress(b"")`` returns them)."""
        return self._complete_prefix(1) > 0 if self._buf else False


class DeflateWriter:
    """Raw DEFLATE at ``level``; each write ends with a sync flush so the peer can decode it."""

    __slots__ = ("_compressor",)

    def __init__(self, level: int = 6) -> None:
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)

    def compress(self, data: bytes) -> bytes:
        if not data:
            return b""
        compressor = self._compressor
        return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)


class DeflateReader:
    """Inflates a raw DEFLATE stream fed in arbitrary pieces.

    A few KiB of DEFLATE can inflate to hundreds of MiB, so a reader of untrusted input passes
    ``max_length``: at most that many plain bytes come out of one call, the rest of the input
    is kept, and ``pending`` stays true until ``decompress(b"", max_length)`` calls drained it.
    """

    __slots__ = ("_decompressor", "_more")

    def __init__(self) -> None:
        self._decompressor = zlib.decompressobj(-zlib.MAX_WBITS)
        self._more = False

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        decompressor = self._decompressor
        tail = decompressor.unconsumed_tail
        if tail:
            data = tail + data
        try:
            plain = decompressor.decompress(data, max_length)
        except zlib.error as exc:
            raise CompressionError(f"deflate: {exc}") from exc
        # a full output buffer may leave output inside zlib even when all input was consumed
        self._more = bool(max_length) and len(plain) >= max_length
        return plain

    @property
    def pending(self) -> bool:
        """Whether plain bytes may still come out without more input."""
        return self._more or bool(self._decompressor.unconsumed_tail)
