"""The nsqlookupd V1 codec without sockets: client encoders, the server parser, IDENTIFY."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.protocol import ProtocolError, encode_sized
from nsqpy.protocol import lookup as L

IDENTITY = {
    "version": "1.3.0",
    "tcp_port": 4150,
    "http_port": 4151,
    "hostname": "host-a",
    "broadcast_address": "10.0.0.1",
}


def sized(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


# --------------------------------------------------------------------------- client encoders


def test_identify_keys_are_alphabetical_and_compact():
    body = (
        b'{"broadcast_address":"10.0.0.1","hostname":"host-a","http_port":4151,'
        b'"tcp_port":4150,"version":"1.3.0"}'
    )
    assert L.identify(IDENTITY) == b"IDENTIFY\n" + sized(body)


def test_identify_escapes_like_go():
    out = L.identify({"hostname": "a<b>&c"})
    assert out.endswith(b'{"hostname":"a\\u003cb\\u003e\\u0026c"}')


def test_register_unregister_ping_lines():
    assert L.register("t") == b"REGISTER t\n"
    assert L.register("t", "c") == b"REGISTER t c\n"
    assert L.register("t", "") == b"REGISTER t\n"
    assert L.unregister("t", None) == b"UNREGISTER t\n"
    assert L.unregister("t", "c#ephemeral") == b"UNREGISTER t c#ephemeral\n"
    assert L.ping() == b"PING\n"


def test_parse_identify_response():
    info = L.parse_identify_response(
        b'{"broadcast_address":"lk","hostname":"h","http_port":4161,"tcp_port":4160,'
        b'"version":"1.3.0"}'
    )
    assert (info.broadcast_address, info.tcp_port, info.http_port, info.version) == (
        "lk",
        4160,
        4161,
        "1.3.0",
    )
    with pytest.raises(ValueError):
        L.parse_identify_response(b"E_INVALID")
    with pytest.raises(ValueError):
        L.parse_identify_response(b'{"tcp_port":"4160"}')


def test_decode_sized_length():
    assert L.decode_sized_length(b"\x00\x00\x00\x02") == 2
    assert L.decode_sized_length(b"\xff\xff\xff\xff") == -1


# --------------------------------------------------------------------------- server parser


def feed_all(data: bytes, chunk: int | None = None) -> list[L.LookupRequest]:
    parser = L.LookupServerParser()
    if chunk is None:
        return parser.feed(data)
    out: list[L.LookupRequest] = []
    for i in range(0, len(data), chunk):
        out.extend(parser.feed(data[i : i + chunk]))
    return out


def summary(requests: list[L.LookupRequest]) -> list[tuple[str, list[str], bytes | None]]:
    return [(r.name, r.params, r.body) for r in requests]


def test_parser_commands_and_identify_body():
    body = json.dumps(IDENTITY).encode()
    stream = b"  V1PING\nIDENTIFY\n" + sized(body) + b"REGISTER t c\r\nUNREGISTER  t \n"
    expected = [
        ("PING", [], None),
        ("IDENTIFY", [], body),
        ("REGISTER", ["t", "c"], None),
        ("UNREGISTER", ["", "t"], None),
    ]
    assert summary(feed_all(stream)) == expected
    assert summary(feed_all(stream, chunk=1)) == expected
    assert summary(feed_all(stream, chunk=3)) == expected


def test_parser_trims_go_whitespace_only():
    # Go's TrimSpace removes \t \v \f \r and Unicode spaces, not \x1c-\x1f
    [request] = feed_all(b"  V1\t\x0bPING\xc2\xa0\r\n")
    assert request.name == "PING"
    [request] = feed_all(b"  V1\x1cPING\n")
    assert request.name == "\x1cPING"


def test_parser_keeps_invalid_utf8_for_echo():
    [request] = feed_all(b"  V1BAD\xff\n")
    error = ProtocolError("E_INVALID", f"invalid command {request.name}")
    assert L.error_bytes(error) == b"E_INVALID invalid command BAD\xff"


def test_parser_bad_magic():
    parser = L.LookupServerParser()
    assert parser.feed(b"  V") == []
    with pytest.raises(L.BadMagic) as info:
        parser.feed(b"2")
    assert info.value.magic == b"  V2"


def test_second_identify_has_no_body():
    body = json.dumps(IDENTITY).encode()
    requests = feed_all(b"  V1IDENTIFY\n" + sized(body) + b"IDENTIFY\n")
    assert [(r.name, r.body) for r in requests] == [("IDENTIFY", body), ("IDENTIFY", None)]


def test_eof_inside_identify():
    parser = L.LookupServerParser()
    assert parser.feed(b"  V1IDENTIFY\n\x00\x00") == []
    request = parser.eof()
    assert request is not None and request.error is not None
    assert L.error_bytes(request.error) == b"E_BAD_BODY IDENTIFY failed to read body size"

    parser = L.LookupServerParser()
    assert parser.feed(b"  V1IDENTIFY\n\x00\x00\x00\x10{}") == []
    request = parser.eof()
    assert request is not None and request.error is not None
    assert L.error_bytes(request.error) == b"E_BAD_BODY IDENTIFY failed to read body"
    assert L.LookupServerParser().eof() is None


def test_negative_identify_size_is_refused_not_fatal_to_the_server():
    [request] = feed_all(b"  V1IDENTIFY\n\xff\xff\xff\xffPING\n")
    assert request.error is not None
    assert request.error.desc == "IDENTIFY failed to read body"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=17))
def test_parser_never_raises_but_bad_magic_and_chunking_is_invisible(data, chunk):
    stream = b"  V1" + data
    whole = summary(feed_all(stream))
    assert summary(feed_all(stream, chunk)) == whole


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_any_magic_is_accepted_or_bad_magic(data):
    parser = L.LookupServerParser()
    try:
        parser.feed(data)
    except L.BadMagic as exc:
        assert exc.magic != b"  V1" and data[:4] == exc.magic


# --------------------------------------------------------------------------- IDENTIFY body


def test_identify_body_ok():
    identity = L.parse_identify_body(json.dumps(IDENTITY).encode())
    assert identity.broadcast_address == "10.0.0.1"
    assert identity.hostname == "host-a"
    assert (identity.tcp_port, identity.http_port, identity.version) == (4150, 4151, "1.3.0")


@pytest.mark.parametrize("missing", ["broadcast_address", "tcp_port", "http_port", "version"])
def test_identify_body_missing_fields(missing):
    body = {k: v for k, v in IDENTITY.items() if k != missing}
    with pytest.raises(ProtocolError) as info:
        L.parse_identify_body(json.dumps(body).encode())
    assert L.error_bytes(info.value) == b"E_BAD_BODY IDENTIFY missing fields"


def test_identify_body_hostname_is_optional_and_null_is_ignored():
    body = {**IDENTITY, "hostname": None}
    assert L.parse_identify_body(json.dumps(body).encode()).hostname == ""
    with pytest.raises(ProtocolError, match="missing fields"):
        L.parse_identify_body(b"null")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"[]",
        b'"x"',
        b"12",
        b'{"tcp_port":"4150"}',
        b'{"tcp_port":4150.0}',
        b'{"tcp_port":1e3}',
        b'{"tcp_port":true}',
        b'{"version":5}',
        b'{"tcp_port":99999999999999999999}',
        b'{"tcp_port":NaN}',
        b"[" * 100_000,
    ],
)
def test_identify_body_decode_errors(body):
    with pytest.raises(ProtocolError) as info:
        L.parse_identify_body(body)
    assert L.error_bytes(info.value) == b"E_BAD_BODY IDENTIFY failed to decode JSON body"


def test_identify_body_go_json_quirks():
    # keys match case-insensitively, unknown keys are ignored, the last duplicate wins
    body = (
        b'{"BROADCAST_ADDRESS":"b","Tcp_Port":1,"http_port":2,"http_port":3,'
        b'"version":"v","extra":[1,{"a":2}],"remote_address":"spoofed"}'
    )
    identity = L.parse_identify_body(body)
    assert (identity.broadcast_address, identity.tcp_port, identity.http_port) == ("b", 1, 3)
    # a lone surrogate escape becomes U+FFFD as in Go; invalid UTF-8 too
    identity = L.parse_identify_body(
        b'{"broadcast_address":"a\\ud800","tcp_port":1,"http_port":2,"version":"\xff"}'
    )
    assert identity.broadcast_address == "a\ufffd"
    assert identity.version == "\ufffd"


def test_responses_are_unframed():
    assert encode_sized(L.OK) == b"\x00\x00\x00\x02OK"
    assert encode_sized(L.BAD_PROTOCOL) == b"\x00\x00\x00\x0eE_BAD_PROTOCOL"
