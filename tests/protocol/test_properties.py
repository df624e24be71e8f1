"""Hypothesis round trips: client encoders -> server parser, chunking, frame decoding."""

from __future__ import annotations

import string
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.protocol import (
    CommandParser,
    Frame,
    FrameDecoder,
    commands,
    decode_message,
    encode_frame,
    encode_message,
    go_quote,
    is_valid_name,
    parse_base10,
    parse_mpub_body,
)

MAX_MSG = 4096
MAX_BODY = 16384

NAME_CHARS = string.ascii_letters + string.digits + "._-"
names = st.builds(
    lambda base, eph: base + ("#ephemeral" if eph else ""),
    st.text(NAME_CHARS, min_size=1, max_size=54),
    st.booleans(),
)
msg_ids = st.binary(min_size=16, max_size=16).map(lambda b: b.hex()[:16].encode())
bodies = st.binary(min_size=1, max_size=300)
small_ints = st.integers(min_value=0, max_value=2**31 - 1)


@dataclass(frozen=True)
class Expected:
    """What the server parser must produce for one encoded command."""

    wire: bytes
    name: bytes
    params: tuple[bytes, ...]
    body: bytes | None


def _expect(wire: bytes, name: bytes, params: list[bytes], body: bytes | None) -> Expected:
    return Expected(wire, name, tuple(params), body)


client_commands = st.one_of(
    st.builds(
        lambda t, c: _expect(commands.sub(t, c), b"SUB", [t.encode(), c.encode()], None),
        names,
        names,
    ),
    st.builds(lambda t, b: _expect(commands.pub(t, b), b"PUB", [t.encode()], b), names, bodies),
    st.builds(
        lambda t, d, b: _expect(commands.dpub(t, d, b), b"DPUB", [t.encode(), b"%d" % d], b),
        names,
        small_ints,
        bodies,
    ),
    st.builds(
        lambda t, bs: _expect(commands.mpub(t, bs), b"MPUB", [t.encode()], commands.mpub_body(bs)),
        names,
        st.lists(bodies, min_size=1, max_size=8),
    ),
    st.builds(lambda n: _expect(commands.rdy(n), b"RDY", [b"%d" % n], None), small_ints),
    st.builds(lambda i: _expect(commands.fin(i), b"FIN", [i], None), msg_ids),
    st.builds(
        lambda i, t: _expect(commands.req(i, t), b"REQ", [i, b"%d" % t], None), msg_ids, small_ints
    ),
    st.builds(lambda i: _expect(commands.touch(i), b"TOUCH", [i], None), msg_ids),
    st.just(_expect(commands.cls(), b"CLS", [], None)),
    st.just(_expect(commands.nop(), b"NOP", [], None)),
    st.builds(
        lambda s: _expect(commands.auth(s), b"AUTH", [], s),
        st.binary(min_size=1, max_size=64),
    ),
    st.builds(
        lambda d: _expect(
            commands.identify(d), b"IDENTIFY", [], commands.identify(d)[len(b"IDENTIFY\n") + 4 :]
        ),
        st.dictionaries(
            st.sampled_from(["client_id", "hostname", "user_agent", "heartbeat_interval"]),
            st.one_of(st.text(max_size=20), st.integers(-1, 60000), st.booleans()),
        ),
    ),
)


def _parsed(
    parser: CommandParser, chunks: list[bytes]
) -> list[tuple[bytes, tuple[bytes, ...], bytes | None]]:
    out = []
    for chunk in chunks:
        for cmd in parser.feed(chunk):
            assert cmd.bad_body_size is None
            out.append((cmd.name, tuple(cmd.params), cmd.body))
    return out


def _chunk(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = []
    prev = 0
    for p in [*points, len(data)]:
        chunks.append(data[prev:p])
        prev = p
    return chunks


@settings(max_examples=300, deadline=None)
@given(st.lists(client_commands, min_size=1, max_size=12))
def test_encoders_round_trip_through_the_parser(cmds: list[Expected]) -> None:
    parser = CommandParser(MAX_MSG, MAX_BODY)
    got = _parsed(parser, [c.wire for c in cmds])
    assert got == [(c.name, c.params, c.body) for c in cmds]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(client_commands, min_size=1, max_size=12),
    st.lists(st.integers(min_value=0, max_value=10**6), max_size=30),
)
def test_random_chunking_gives_the_same_commands(cmds: list[Expected], cuts: list[int]) -> None:
    stream = b"".join(c.wire for c in cmds)
    whole = _parsed(CommandParser(MAX_MSG, MAX_BODY), [stream])
    chunked = _parsed(CommandParser(MAX_MSG, MAX_BODY), _chunk(stream, cuts))
    assert chunked == whole == [(c.name, c.params, c.body) for c in cmds]


@settings(max_examples=50, deadline=None)
@given(st.lists(client_commands, min_size=1, max_size=6))
def test_byte_by_byte_feeding(cmds: list[Expected]) -> None:
    stream = b"".join(c.wire for c in cmds)
    parser = CommandParser(MAX_MSG, MAX_BODY)
    got = _parsed(parser, [stream[i : i + 1] for i in range(len(stream))])
    assert got == [(c.name, c.params, c.body) for c in cmds]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(alphabet=string.printable.replace("\n", ""), max_size=40), max_size=10),
    st.lists(st.integers(min_value=0, max_value=10**6), max_size=20),
)
def test_arbitrary_lines_split_like_go(lines: list[str], cuts: list[int]) -> None:
    """Any line without a body-command name splits on single spaces, minus one trailing \\r."""
    raw = [line.encode() for line in lines]
    raw = [line for line in raw if line.split(b" ")[0].rstrip(b"\r") not in _BODY_NAMES]
    stream = b"".join(line + b"\n" for line in raw)
    got = _parsed(CommandParser(MAX_MSG, MAX_BODY), _chunk(stream, cuts))
    expected = []
    for line in raw:
        stripped = line[:-1] if line.endswith(b"\r") else line
        parts = stripped.split(b" ")
        expected.append((parts[0], tuple(parts[1:]), None))
    assert got == expected


_BODY_NAMES = {b"PUB", b"MPUB", b"DPUB", b"IDENTIFY", b"AUTH"}


# --------------------------------------------------------------------------- frames

frames = st.builds(
    Frame,
    st.sampled_from([0, 1, 2]),
    st.binary(max_size=200),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(frames, max_size=15),
    st.lists(st.integers(min_value=0, max_value=10**6), max_size=30),
)
def test_frame_decoder_over_random_chunking(seq: list[Frame], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(f.frame_type, f.data) for f in seq)
    decoder = FrameDecoder()
    got: list[Frame] = []
    for chunk in _chunk(stream, cuts):
        got += decoder.feed(chunk)
    assert got == seq
    assert decoder.buffered == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(frames, min_size=1, max_size=10), st.data())
def test_frame_decoder_holds_an_incomplete_tail(seq: list[Frame], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(f.frame_type, f.data) for f in seq)
    last = encode_frame(seq[-1].frame_type, seq[-1].data)
    cut = data.draw(st.integers(min_value=1, max_value=len(last)))
    decoder = FrameDecoder()
    assert decoder.feed(stream[:-cut]) == seq[:-1]
    assert decoder.buffered == len(last) - cut
    assert decoder.feed(stream[-cut:]) == seq[-1:]


# --------------------------------------------------------------------------- values


@given(
    st.integers(min_value=0, max_value=2**63 - 1),
    st.integers(min_value=0, max_value=2**16 - 1),
    msg_ids,
    st.binary(max_size=500),
)
def test_message_round_trip(ts: int, attempts: int, msg_id: bytes, body: bytes) -> None:
    decoded = decode_message(encode_message(ts, attempts, msg_id, body))
    assert (decoded.timestamp, decoded.attempts, decoded.id, decoded.body) == (
        ts,
        attempts,
        msg_id,
        body,
    )


@given(st.lists(st.binary(min_size=1, max_size=MAX_MSG), min_size=1, max_size=20))
def test_mpub_body_round_trip(items: list[bytes]) -> None:
    body = commands.mpub_body(items)
    assert parse_mpub_body(body, MAX_MSG, 1 << 20) == items


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_base10_round_trip(n: int) -> None:
    assert parse_base10(str(n).encode()) == n


@given(st.binary(min_size=1, max_size=12))
def test_base10_only_digits(raw: bytes) -> None:
    all_digits = all(48 <= b <= 57 for b in raw)
    assert (parse_base10(raw) is not None) == all_digits


@given(st.text(alphabet=NAME_CHARS, min_size=1, max_size=80))
def test_name_length_rule(name: str) -> None:
    assert is_valid_name(name) == (len(name) <= 64)


@given(st.text(max_size=30))
def test_name_charset_rule(name: str) -> None:
    base = name.removesuffix("#ephemeral")
    ok = 0 < len(name) <= 64 and len(base) > 0 and all(ch in NAME_CHARS for ch in base)
    assert is_valid_name(name) == ok


@given(st.text(alphabet=string.ascii_letters + string.digits + " !#$%&'()*+,-./:;<=>?@[]^_`{|}~"))
def test_go_quote_plain_ascii_is_wrapped_unchanged(text: str) -> None:
    assert go_quote(text) == f'"{text}"'


@given(st.binary(max_size=40))
def test_go_quote_is_ascii_safe_for_control_bytes(raw: bytes) -> None:
    quoted = go_quote(raw)
    assert quoted.startswith('"') and quoted.endswith('"')
    assert not any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in quoted)


def _expand_fin_runs(
    parsed: list[tuple[bytes, tuple[bytes, ...], bytes | None]],
) -> list[tuple[bytes, tuple[bytes, ...], bytes | None]]:
    out: list[tuple[bytes, tuple[bytes, ...], bytes | None]] = []
    for name, params, body in parsed:
        if name == commands.FIN_RUN:
            assert params  # a run holds at least one ID
            out.extend((b"FIN", (msg_id,), None) for msg_id in params)
        else:
            out.append((name, params, body))
    return out


fin_lines = st.one_of(
    st.builds(commands.fin, msg_ids),
    st.builds(
        lambda raw: b"FIN " + raw + b"\n", st.binary(max_size=20).filter(lambda b: b"\n" not in b)
    ),
    st.builds(lambda i: b"FIN " + i + b"\r\n", msg_ids),
    st.builds(lambda i: b"FIN " + i[:15] + b"\r\n", msg_ids),
    # 21-byte lines whose 16 "ID" bytes may hold a space or a \r: nsqd's whole-line fast path
    st.builds(
        lambda raw: b"FIN " + raw + b"\n",
        st.lists(st.sampled_from([b"0", b"a", b" ", b"\r"]), min_size=16, max_size=16).map(
            b"".join
        ),
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(client_commands.map(lambda c: c.wire), fin_lines), min_size=1, max_size=20),
    st.lists(st.integers(min_value=0, max_value=10**6), max_size=30),
)
def test_fin_runs_expand_to_the_plain_parse(wires: list[bytes], cuts: list[int]) -> None:
    """``fin_runs`` only groups FIN lines: expanded, the commands are exactly the plain ones."""
    stream = b"".join(wires)
    plain = _parsed(CommandParser(MAX_MSG, MAX_BODY), [stream])
    runs = _parsed(CommandParser(MAX_MSG, MAX_BODY, fin_runs=True), _chunk(stream, cuts))
    assert _expand_fin_runs(runs) == plain
