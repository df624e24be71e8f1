"""Topic/channel name validation (Go internal/protocol/names.go) and Go's %q quoting."""

from __future__ import annotations

import pytest

from nsqpy.protocol import (
    go_quote,
    is_ephemeral,
    is_valid_channel_name,
    is_valid_name,
    is_valid_topic_name,
)


@pytest.mark.parametrize(
    "name",
    [
        "a",
        "T",
        "test",
        "sub_bench",
        "a.b-c_d",
        "0123456789",
        "...",
        "-",
        "x" * 64,
        "x#ephemeral",
        "x" * 54 + "#ephemeral",  # 64 characters including the suffix
        "ch1#ephemeral",
    ],
)
def test_valid_names(name: str) -> None:
    assert is_valid_name(name)
    assert is_valid_topic_name(name)
    assert is_valid_channel_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "x" * 65,
        "x" * 55 + "#ephemeral",  # 65 characters
        "#ephemeral",
        "a#ephemeral#ephemeral",
        "a#b",
        "a#Ephemeral",
        "bad:topic",
        "bad!",
        "name$",
        "a b",
        "a/b",
        "é",
        "a\x00",
        "a\n",  # Go's `$` does not match before a trailing newline
        "a\nb",
        "\nabc",
        "abc#ephemeral\n",
        " ",
    ],
)
def test_invalid_names(name: str) -> None:
    assert not is_valid_name(name)
    assert not is_valid_topic_name(name)
    assert not is_valid_channel_name(name)


def test_is_ephemeral() -> None:
    assert is_ephemeral("t#ephemeral")
    assert not is_ephemeral("t")
    assert not is_ephemeral("t#ephemeralx")


# --------------------------------------------------------------------------- go_quote


@pytest.mark.parametrize(
    "value,quoted",
    [
        ("bad:topic", '"bad:topic"'),
        ("", '""'),
        ("bad!", '"bad!"'),
        ('a"b', '"a\\"b"'),
        ("a\\b", '"a\\\\b"'),
        ("a\nb", '"a\\nb"'),
        ("a\rb", '"a\\rb"'),
        ("a\tb", '"a\\tb"'),
        # strconv.Quote's single-letter escapes
        ("\a", '"\\a"'),
        ("\b", '"\\b"'),
        ("\f", '"\\f"'),
        ("\v", '"\\v"'),
        # other control characters and DEL as \x..
        ("\x00", '"\\x00"'),
        ("\x1b", '"\\x1b"'),
        ("\x7f", '"\\x7f"'),
        # printable non-ASCII stays as is
        ("é", '"é"'),
        ("日本", '"日本"'),
        # non-printable non-ASCII is \u or \U escaped
        ("\u0085", '"\\u0085"'),
        ("\u00a0", '"\\u00a0"'),
        ("\u200b", '"\\u200b"'),
        ("\u2028", '"\\u2028"'),
        ("\ufeff", '"\\ufeff"'),
        ("\U000e0001", '"\\U000e0001"'),
        (" ", '" "'),
    ],
)
def test_go_quote_str(value: str, quoted: str) -> None:
    assert go_quote(value) == quoted


@pytest.mark.parametrize(
    "raw,quoted",
    [
        (b"bad:topic", '"bad:topic"'),
        (b"\xff", '"\\xff"'),  # invalid UTF-8 bytes are \x escaped one by one
        (b"a\xc3", '"a\\xc3"'),  # truncated sequence
        (b"\xc3\xa9", '"é"'),  # valid UTF-8 is decoded
        (b"\xed\xa0\x80", '"\\xed\\xa0\\x80"'),  # an encoded surrogate is invalid UTF-8
        (b"\x00\xfe", '"\\x00\\xfe"'),
    ],
)
def test_go_quote_bytes(raw: bytes, quoted: str) -> None:
    assert go_quote(raw) == quoted
