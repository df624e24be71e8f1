"""MPUB message lists built straight from an Arrow binary column, without a Python object per row.

An MPUB body is ``BE32(count)`` followed by ``BE32(size) body`` for each message. Arrow already
holds the bodies back to back (a data buffer and an offsets buffer), so the sink prefixes every
body with its big-endian size in one Arrow kernel and cuts the result into MPUBs of ``count``
rows by slicing one buffer: no ``to_pylist``, no ``struct.pack`` per row (10,000 x 100 B:
0.10 µs of CPU per row, against 0.16 µs for ``to_pylist`` + ``commands.mpub_body``).
"""

from __future__ import annotations

import array
import sys
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["EncodedMessages", "encoded_batches"]


@dataclass(frozen=True)
class EncodedMessages:
    """``count`` messages already framed as ``BE32(size) body`` each: an MPUB without its
    command line, its outer size and its count."""

    count: int
    messages: memoryview


def _ints(values: pa.Array, typecode: str) -> array.array[int]:
    """A fixed-width integer Arrow array (no nulls) as a Python ``array``, one copy."""
    width = array.array(typecode).itemsize
    buffer = memoryview(values.buffers()[1])
    out = array.array(typecode)
    out.frombytes(buffer[values.offset * width : (values.offset + len(values)) * width])
    return out


def _size_prefixes(column: pa.Array) -> pa.Array:
    """Each body's size as 4 big-endian bytes, as a binary array beside ``column``."""
    sizes = _ints(pc.binary_length(column).cast(pa.int32()), "i")
    if sys.byteorder == "little":
        sizes.byteswap()
    fixed = pa.Array.from_buffers(pa.binary(4), len(column), [None, pa.py_buffer(sizes)])
    return fixed.cast(column.type)


def encoded_batches(column: pa.Array, batch_size: int) -> tuple[list[EncodedMessages], pa.Array]:
    """Cut a binary column (no nulls) into MPUBs of ``batch_size`` messages.

    Returns the full batches and the rows left over (fewer than ``batch_size``), which the
    caller batches with the next column's rows.
    """
    full = len(column) - len(column) % batch_size
    if full == 0:
        return [], column
    head = column.slice(0, full)
    no_separator = pa.scalar(b"", head.type)
    framed = pc.binary_join_element_wise(_size_prefixes(head), head, no_separator)
    large = pa.types.is_large_binary(framed.type)
    offsets = _ints(
        pa.Array.from_buffers(
            pa.int64() if large else pa.int32(),
            full + 1,
            [None, framed.buffers()[1]],
            offset=framed.offset,
        ),
        "q" if large else "i",
    )
    data = memoryview(framed.buffers()[2])
    batches = [
        EncodedMessages(batch_size, data[offsets[i] : offsets[i + batch_size]])
        for i in range(0, full, batch_size)
    ]
    return batches, column.slice(full)
