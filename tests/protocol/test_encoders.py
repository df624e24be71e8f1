"""Client command encoders: the exact bytes go-nsq's command.go writes (a ``\n``-terminated
line, then ``BE32(size) body`` for commands with a body)."""

from __future__ import annotations

import json

from nsqpy.protocol import commands

MSG_ID = b"0123456789abcdef"


def test_identify_matches_the_reference_default() -> None:
    # the default IDENTIFY of Go's protocol tests is 47 bytes, length 00 00 00 2f
    data = commands.identify({"client_id": "test", "feature_negotiation": True})
    body = b'{"client_id":"test","feature_negotiation":true}'
    assert len(body) == 47
    assert data == b"IDENTIFY\n\x00\x00\x00\x2f" + body


def test_identify_body_is_compact_json() -> None:
    settings = {"heartbeat_interval": -1, "user_agent": "a b", "sample_rate": 42, "snappy": False}
    data = commands.identify(settings)
    assert data.startswith(b"IDENTIFY\n")
    size = int.from_bytes(data[9:13], "big")
    body = data[13:]
    assert size == len(body)
    assert b", " not in body and b": " not in body
    assert json.loads(body) == settings


def test_auth_bytes_and_str() -> None:
    assert commands.auth(b"testsecret") == b"AUTH\n\x00\x00\x00\x0atestsecret"
    assert commands.auth("testsecret") == commands.auth(b"testsecret")


def test_sub() -> None:
    assert commands.sub("T", "ch") == b"SUB T ch\n"
    assert commands.sub("t#ephemeral", "c#ephemeral") == b"SUB t#ephemeral c#ephemeral\n"


def test_pub() -> None:
    assert commands.pub("T", b"test body") == b"PUB T\n\x00\x00\x00\x09test body"


def test_pub_binary_body_with_newlines() -> None:
    body = b"\n\x00\r\n" * 3
    assert commands.pub("t", body) == b"PUB t\n\x00\x00\x00\x0c" + body


def test_dpub() -> None:
    assert commands.dpub("T", 1000, b"x") == b"DPUB T 1000\n\x00\x00\x00\x01x"
    assert commands.dpub("T", 0, b"x") == b"DPUB T 0\n\x00\x00\x00\x01x"


def test_mpub_body() -> None:
    assert commands.mpub_body([b"ab", b"c"]) == (
        b"\x00\x00\x00\x02" + b"\x00\x00\x00\x02ab" + b"\x00\x00\x00\x01c"
    )
    assert commands.mpub_body([]) == b"\x00\x00\x00\x00"


def test_mpub_accepts_any_iterable() -> None:
    inner = b"\x00\x00\x00\x02" + b"\x00\x00\x00\x02ab" + b"\x00\x00\x00\x01c"
    expected = b"MPUB T\n" + len(inner).to_bytes(4, "big") + inner
    assert commands.mpub("T", [b"ab", b"c"]) == expected
    assert commands.mpub("T", (b for b in [b"ab", b"c"])) == expected


def test_mpub_reference_size_limits_example() -> None:
    # Go's TestSizeLimits: 5 x 100-byte messages make a 524-byte body
    data = commands.mpub("T", [b"x" * 100] * 5)
    assert data[7:11] == (524).to_bytes(4, "big")
    # #17: 11 x 100 -> 1148
    assert commands.mpub("T", [b"x" * 100] * 11)[7:11] == (1148).to_bytes(4, "big")


def test_rdy() -> None:
    assert commands.rdy(1) == b"RDY 1\n"
    assert commands.rdy(0) == b"RDY 0\n"
    assert commands.rdy(2500) == b"RDY 2500\n"


def test_fin_req_touch() -> None:
    assert commands.fin(MSG_ID) == b"FIN 0123456789abcdef\n"
    assert commands.req(MSG_ID, 0) == b"REQ 0123456789abcdef 0\n"
    assert commands.req(MSG_ID, 120000) == b"REQ 0123456789abcdef 120000\n"
    assert commands.touch(MSG_ID) == b"TOUCH 0123456789abcdef\n"


def test_cls_nop() -> None:
    assert commands.cls() == b"CLS\n"
    assert commands.nop() == b"NOP\n"
