"""Go encoding/json output (compact, struct fields in order, map keys sorted, ``1`` not ``1.0``,
``<``, ``>`` and ``&`` escaped as ``\u003c`` ...) and V1 boolean params."""

from __future__ import annotations

import pytest

from nsqpy.internal.http_api import go_json, parse_bool_param


def test_compact_and_ordered() -> None:
    assert go_json({"b": 1, "a": [1, 2], "c": None}) == b'{"b":1,"a":[1,2],"c":null}'


def test_integral_floats_have_no_fraction() -> None:
    value = {"quantile": 1.0, "value": 0.0, "p": 0.99, "big": 1e20}
    assert go_json(value) == b'{"quantile":1,"value":0,"p":0.99,"big":100000000000000000000}'


def test_nested_floats() -> None:
    assert go_json([{"x": [2.0, 2.5]}]) == b'[{"x":[2,2.5]}]'


def test_html_characters_are_escaped() -> None:
    assert go_json("<a&b>") == b'"\\u003ca\\u0026b\\u003e"'


def test_line_separators_are_escaped() -> None:
    assert go_json("\u2028\u2029") == b'"\\u2028\\u2029"'


def test_non_ascii_is_utf8() -> None:
    assert go_json("é") == '"é"'.encode()


def test_bools_and_empty() -> None:
    assert (
        go_json({"t": True, "f": False, "l": [], "d": {}}) == b'{"t":true,"f":false,"l":[],"d":{}}'
    )


@pytest.mark.parametrize(
    "raw,default,value",
    [
        (None, True, True),
        (None, False, False),
        ("true", False, True),
        ("1", False, True),
        ("false", True, False),
        ("0", True, False),
        ("yes", True, None),
        ("True", True, None),
        ("", True, None),
    ],
)
def test_parse_bool_param(raw: str | None, default: bool, value: bool | None) -> None:
    assert parse_bool_param(raw, default) is value
