"""The sliced ``/mpub`` body checks (nsqd/http_mpub.py) against the one-piece definitions
they replace: Go's text mode (split on ``\\n``, empty lines skipped, MSG_TOO_BIG) and the TCP
MPUB body parser for binary mode, on random bodies that cross every chunk boundary."""

from __future__ import annotations

import asyncio
import random
import struct

import pytest

from nsqpy.nsqd.http_mpub import (
    CHUNK_MESSAGES,
    TEXT_STEP,
    MpubBodyError,
    binary_bodies,
    lines_of,
    text_regions,
)
from nsqpy.protocol import ProtocolError, parse_mpub_body

SEEDS = range(40)


def flat(chunks: list[list[bytes]]) -> list[bytes]:
    assert all(len(chunk) <= CHUNK_MESSAGES for chunk in chunks)
    return [body for chunk in chunks for body in chunk]


def text_reference(body: bytes, max_msg_size: int) -> list[bytes] | str:
    lines = [line for line in body.split(b"\n") if line]
    if any(len(line) > max_msg_size for line in lines):
        return "MSG_TOO_BIG"
    return lines


def text_parsed(body: bytes, max_msg_size: int) -> list[bytes] | str:
    try:
        regions = asyncio.run(text_regions(body, max_msg_size))
    except MpubBodyError as err:
        return err.code
    return flat([lines_of(region) for region in regions])


def random_text(rng: random.Random, max_msg_size: int) -> bytes:
    """Mostly tiny lines (many to a chunk), some long ones; a line over ``max_msg_size`` in
    about a third of the bodies."""
    too_big = rng.random() < 0.3
    lines = []
    size = 0
    target = rng.choice([0, 10, 3 * TEXT_STEP, 40 * TEXT_STEP])
    while size < target:
        if rng.random() < 0.99:
            length = rng.choice([0, 1, 1, 2, 3])
        else:
            length = rng.choice([max_msg_size, rng.randrange(0, 2 * TEXT_STEP)])
        if length > max_msg_size and not (too_big and rng.random() < 0.01):
            length = max_msg_size
        lines.append(bytes(rng.choices(b"ab\r ", k=length)))
        size += length + 1
    return b"\n".join(lines) + rng.choice([b"", b"\n", b"\n\n"])


@pytest.mark.parametrize("seed", SEEDS)
def test_text_bodies_match_go_text_mode(seed: int) -> None:
    rng = random.Random(seed)
    max_msg_size = rng.choice([1, 5, TEXT_STEP - 1, TEXT_STEP, 3 * TEXT_STEP, 1 << 20])
    body = random_text(rng, max_msg_size)
    assert text_parsed(body, max_msg_size) == text_reference(body, max_msg_size)


def test_text_bodies_edges() -> None:
    assert text_parsed(b"", 10) == []
    assert text_parsed(b"\n\n\n", 10) == []
    assert text_parsed(b"m\nm\nm\nm", 10) == [b"m"] * 4
    assert text_parsed(b"a\r\n", 10) == [b"a\r"]
    line = b"y" * (TEXT_STEP + 5)
    assert text_parsed(b"x\n" + line + b"\nz", len(line)) == [b"x", line, b"z"]
    assert text_parsed(b"x\n" + line + b"\nz", len(line) - 1) == "MSG_TOO_BIG"
    assert text_parsed(b"x\n" * 3 * CHUNK_MESSAGES, 1) == [b"x"] * 3 * CHUNK_MESSAGES


def binary_reference(body: bytes, max_msg_size: int, max_body_size: int) -> list[bytes] | str:
    try:
        return parse_mpub_body(body, max_msg_size, max_body_size)
    except ProtocolError as err:
        return err.code[2:]


def binary_parsed(body: bytes, max_msg_size: int, max_body_size: int) -> list[bytes] | str:
    try:
        chunks = asyncio.run(binary_bodies(body, max_msg_size, max_body_size))
    except MpubBodyError as err:
        return err.code
    assert all(chunks)
    return flat([list(chunk) for chunk in chunks])


def random_binary(rng: random.Random, max_msg_size: int) -> bytes:
    count = rng.choice([0, 1, 7, CHUNK_MESSAGES, CHUNK_MESSAGES + 1, 3 * CHUNK_MESSAGES + 5])
    parts = [struct.pack(">i", count + rng.choice([0] * 8 + [1, -1]))]
    bad = rng.randrange(count * 2) if count and rng.random() < 0.3 else -1
    for i in range(count):
        size = rng.randrange(1, max_msg_size + 1)
        if i == bad:
            size = rng.choice([0, -3, max_msg_size + 1])
        parts.append(struct.pack(">i", size) + bytes(rng.choices(b"abc", k=max(size, 0))))
    body = b"".join(parts) + rng.choice([b"", b"trailing"])
    if rng.random() < 0.1:
        body = body[: rng.randrange(len(body) + 1)]
    return body


@pytest.mark.parametrize("seed", SEEDS)
def test_binary_bodies_match_the_mpub_parser(seed: int) -> None:
    rng = random.Random(seed)
    max_msg_size = rng.choice([1, 3, 20])
    max_body_size = rng.choice([5 << 20, 5 << 20, 4 + 5 * (CHUNK_MESSAGES + 1)])
    body = random_binary(rng, max_msg_size)
    expected = binary_reference(body, max_msg_size, max_body_size)
    assert binary_parsed(body, max_msg_size, max_body_size) == expected


def test_binary_bodies_edges() -> None:
    one = struct.pack(">i", 1) + b"x"
    assert binary_parsed(b"", 10, 100) == "BAD_BODY"
    assert binary_parsed(b"\x00\x00\x00", 10, 100) == "BAD_BODY"
    assert binary_parsed(struct.pack(">i", 0), 10, 100) == "BAD_BODY"
    assert binary_parsed(struct.pack(">i", 20) + one * 20, 10, 100) == "BAD_BODY"  # > 96 / 5
    assert binary_parsed(struct.pack(">i", 19) + one * 19, 10, 100) == [b"x"] * 19
    assert binary_parsed(struct.pack(">i", 2) + one, 10, 100) == "BAD_MESSAGE"
    assert binary_parsed(struct.pack(">i", 1) + one + b"junk", 10, 100) == [b"x"]
