"""parse_mpub_body's exact errors (Go's text, e.g. ``E_BAD_BODY MPUB invalid message count``),
parse_base10 (digits only: Go refuses signs), ProtocolError."""

from __future__ import annotations

import struct

import pytest

from nsqpy.protocol import NON_FATAL_CODES, ProtocolError, commands, parse_base10, parse_mpub_body

MAX_MSG = 100
MAX_BODY = 1000
BE32 = struct.Struct(">i")


def mpub_error(body: bytes) -> str:
    with pytest.raises(ProtocolError) as info:
        parse_mpub_body(body, MAX_MSG, MAX_BODY)
    return info.value.to_bytes().decode()


# --------------------------------------------------------------------------- parse_mpub_body


def test_mpub_roundtrip() -> None:
    bodies = [b"a", b"\n" * 7, b"x" * MAX_MSG]
    assert parse_mpub_body(commands.mpub_body(bodies), MAX_MSG, MAX_BODY) == bodies


def test_mpub_ignores_trailing_bytes() -> None:
    # Go reads exactly `count` messages and never checks the sum against the body size
    body = commands.mpub_body([b"ab"]) + b"garbage"
    assert parse_mpub_body(body, MAX_MSG, MAX_BODY) == [b"ab"]


@pytest.mark.parametrize("body", [b"", b"\x00", b"\x00\x00\x00"])
def test_mpub_missing_count(body: bytes) -> None:
    assert mpub_error(body) == "E_BAD_BODY MPUB failed to read message count"


@pytest.mark.parametrize("count", [0, -1, -(2**31), 200, 2**31 - 1])
def test_mpub_invalid_count(count: int) -> None:
    # max count = (max_body_size - 4) / 5 = 199 for a 1000-byte body limit
    assert mpub_error(BE32.pack(count)) == f"E_BAD_BODY MPUB invalid message count {count}"


def test_mpub_max_count_is_accepted() -> None:
    body = commands.mpub_body([b"x"] * 199)
    assert len(parse_mpub_body(body, MAX_MSG, MAX_BODY)) == 199


def test_mpub_count_checked_before_messages() -> None:
    assert mpub_error(BE32.pack(0) + b"junk") == "E_BAD_BODY MPUB invalid message count 0"


@pytest.mark.parametrize("tail", [b"", b"\x00", b"\x00\x00\x00"])
def test_mpub_missing_message_size(tail: bytes) -> None:
    body = BE32.pack(2) + BE32.pack(1) + b"a" + tail
    assert mpub_error(body) == "E_BAD_MESSAGE MPUB failed to read message(1) body size"


def test_mpub_missing_first_message_size() -> None:
    assert mpub_error(BE32.pack(1)) == "E_BAD_MESSAGE MPUB failed to read message(0) body size"


@pytest.mark.parametrize("size", [0, -1, -(2**31)])
def test_mpub_invalid_message_size(size: int) -> None:
    # Go's TestSizeLimits: 5 x 100 + one empty -> "invalid message(5) body size 0"
    body = BE32.pack(6) + (BE32.pack(100) + b"x" * 100) * 5 + BE32.pack(size)
    assert mpub_error(body) == f"E_BAD_MESSAGE MPUB invalid message(5) body size {size}"


def test_mpub_message_too_big() -> None:
    # Go's TestSizeLimits: 5 x 101 -> "MPUB message too big 101 > 100"
    body = commands.mpub_body([b"x" * 101] * 5)
    assert mpub_error(body) == "E_BAD_MESSAGE MPUB message too big 101 > 100"


def test_mpub_too_big_checked_before_reading_the_body() -> None:
    body = BE32.pack(1) + BE32.pack(2**31 - 1)
    assert mpub_error(body) == f"E_BAD_MESSAGE MPUB message too big {2**31 - 1} > 100"


@pytest.mark.parametrize("have", [0, 1, 9])
def test_mpub_truncated_message_body(have: int) -> None:
    body = BE32.pack(1) + BE32.pack(10) + b"x" * have
    assert mpub_error(body) == "E_BAD_MESSAGE MPUB failed to read message body"


def test_mpub_errors_are_fatal() -> None:
    with pytest.raises(ProtocolError) as info:
        parse_mpub_body(b"", MAX_MSG, MAX_BODY)
    assert info.value.fatal
    assert info.value.code == "E_BAD_BODY"
    assert info.value.desc == "MPUB failed to read message count"


def test_mpub_accepts_bytearray_and_returns_bytes() -> None:
    body = bytearray(commands.mpub_body([b"ab", b"c"]))
    out = parse_mpub_body(body, MAX_MSG, MAX_BODY)  # type: ignore[arg-type]
    assert out == [b"ab", b"c"]


# --------------------------------------------------------------------------- parse_base10


@pytest.mark.parametrize(
    "raw,value",
    [
        (b"", 0),  # Go: an empty string parses as 0
        (b"0", 0),
        (b"1", 1),
        (b"007", 7),
        (b"2500", 2500),
        (b"3600000", 3600000),
        (b"18446744073709551615", 2**64 - 1),
    ],
)
def test_base10_digits(raw: bytes, value: int) -> None:
    assert parse_base10(raw) == value


@pytest.mark.parametrize(
    "raw",
    [b"-1", b"+1", b" 1", b"1 ", b"1a", b"0x10", b"1.5", b"1_000", b"\xd9\xa1", b"\xef\xbc\x91"],
)
def test_base10_rejects_everything_but_ascii_digits(raw: bytes) -> None:
    assert parse_base10(raw) is None


def test_base10_wraps_like_go_uint64() -> None:
    # Go's ByteToBase10 accumulates in a uint64 and silently overflows
    assert parse_base10(b"18446744073709551616") == 0
    assert parse_base10(b"18446744073709551617") == 1
    assert parse_base10(b"99999999999999999999") == 99999999999999999999 % 2**64


# --------------------------------------------------------------------------- ProtocolError


def test_non_fatal_codes() -> None:
    assert frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"}) == NON_FATAL_CODES


@pytest.mark.parametrize(
    "code,fatal",
    [
        ("E_FIN_FAILED", False),
        ("E_REQ_FAILED", False),
        ("E_TOUCH_FAILED", False),
        ("E_INVALID", True),
        ("E_BAD_BODY", True),
        ("E_BAD_TOPIC", True),
        ("E_PUB_FAILED", True),
    ],
)
def test_protocol_error_fatality(code: str, fatal: bool) -> None:
    assert ProtocolError(code, "x").fatal is fatal


def test_protocol_error_text() -> None:
    err = ProtocolError("E_INVALID", "invalid command ")
    assert err.to_bytes() == b"E_INVALID invalid command "
    assert str(err) == "E_INVALID invalid command "
