"""The command parser's fast paths against its plain ones, over arbitrary splits of a stream:

- ``feed(data, limit)`` (at most ``limit`` commands or FIN IDs per call, the rest on later
  ``feed(b"", limit)`` calls while ``more``) against ``feed(data)`` (all at once);
- an MPUB body split into messages as it arrives (``Command.messages``) against
  :func:`parse_mpub_body` of the whole body, errors included;
- ``fin_runs`` with a budget against the plain line parse.

A stream stops mattering at its first command a handler fails fatally on for what the parser
saw (a body size out of bounds, an MPUB stopped at a bad count or size): the connection
closes there, so the comparisons end with that command.
"""

from __future__ import annotations

import struct
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.protocol import Command, CommandParser, ProtocolError, commands, parse_mpub_body
from nsqpy.protocol.commands import FIN_RUN

MAX_MSG = 64
MAX_BODY = 1024
#: Small, so that MPUBs of a few messages are split over several calls.
SCAN_SLICE = 3

Parsed = tuple[bytes, tuple[bytes, ...], bytes | None, int | None, tuple[bytes, ...] | None]

msg_ids = st.binary(min_size=8, max_size=8).map(lambda b: b.hex().encode())
bodies = st.binary(min_size=1, max_size=MAX_MSG)
topics = st.sampled_from(["t", "orders", "a.b_c-d"])
cuts = st.lists(st.integers(min_value=0, max_value=10**6), max_size=25)
be32 = struct.Struct(">i").pack


def mpub_bodies(valid_only: bool = False) -> st.SearchStrategy[bytes]:
    """MPUB bodies (after the outer size): well formed, or with a bad count or a bad
    message size somewhere, the outer size always the body's length."""
    good = st.lists(bodies, min_size=1, max_size=8).map(commands.mpub_body)
    if valid_only:
        return good
    bad_count = st.sampled_from([0, -1, (MAX_BODY - 4) // 5 + 1]).map(be32)

    @st.composite
    def bad_size(draw: st.DrawFn) -> bytes:
        items = draw(st.lists(bodies, min_size=0, max_size=4))
        size = draw(st.sampled_from([0, -7, MAX_MSG + 1]))
        count = draw(st.integers(min_value=len(items) + 1, max_value=len(items) + 3))
        body = b"".join(be32(len(item)) + item for item in items)
        return be32(count) + body + be32(size) + draw(st.binary(max_size=MAX_MSG))

    return st.one_of(good, good, bad_count, bad_size())


def mpub_wire(topic: str, body: bytes) -> bytes:
    return b"MPUB %s\n" % topic.encode() + be32(len(body)) + body


good_fins = st.builds(commands.fin, msg_ids)
fin_lines = st.one_of(
    good_fins,
    good_fins,
    good_fins,
    good_fins,
    st.builds(lambda i: b"FIN " + i + b"\r\n", msg_ids),
    # 21 bytes, as a FIN line, but the ID is 15 bytes and a \r the plain parse drops
    st.builds(lambda i: b"FIN " + i[:15] + b"\r\n", msg_ids),
    st.builds(lambda i: b"FIN " + i[:15] + b"\n", msg_ids),
    st.builds(lambda i: b"FIN " + i + b" x\n", msg_ids),
    st.builds(
        lambda raw: b"FIN " + raw + b"\n",
        st.lists(st.sampled_from([b"0", b"a", b" ", b"\r"]), min_size=16, max_size=16).map(
            b"".join
        ),
    ),
)

stream_pieces = st.one_of(
    fin_lines,
    fin_lines,
    st.builds(commands.pub, topics, bodies),
    st.builds(lambda t, d, b: commands.dpub(t, d, b), topics, st.integers(0, 10**6), bodies),
    st.builds(mpub_wire, topics, mpub_bodies()),
    st.builds(commands.rdy, st.integers(0, 2500)),
    st.builds(commands.req, msg_ids, st.integers(0, 10**6)),
    st.builds(commands.touch, msg_ids),
    st.sampled_from([commands.nop(), commands.cls(), b"\n", b"\r\n", b"BOGUS x  y\r\n"]),
    st.builds(commands.identify, st.fixed_dictionaries({"client_id": st.text(max_size=8)})),
    st.builds(commands.auth, st.binary(min_size=1, max_size=20)),
    # a PUB whose size is out of bounds ends the stream for the handler
    st.builds(lambda s: b"PUB t\n" + be32(s), st.sampled_from([0, -1, MAX_MSG + 1])),
)


def chunked(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(data) + 1) for p in points})
    out, prev = [], 0
    for mark in [*marks, len(data)]:
        out.append(data[prev:mark])
        prev = mark
    return out


def shape(command: Command) -> Parsed:
    messages = None if command.messages is None else tuple(command.messages)
    return (
        command.name,
        tuple(command.params),
        command.body,
        command.bad_body_size,
        messages,
    )


def ends_the_stream(command: Command) -> bool:
    return command.bad_body_size is not None or (
        command.name == commands.MPUB and command.messages is None
    )


def until_fatal(parsed: list[Command]) -> list[Parsed]:
    out: list[Parsed] = []
    for command in parsed:
        out.append(shape(command))
        if ends_the_stream(command):
            break
    return out


def expand_runs(parsed: list[Parsed]) -> list[Parsed]:
    out: list[Parsed] = []
    for name, params, body, bad, messages in parsed:
        if name == FIN_RUN:
            assert params, "a run holds at least one ID"
            out.extend((b"FIN", (msg_id,), None, None, None) for msg_id in params)
        else:
            out.append((name, params, body, bad, messages))
    return out


def units(command: Command) -> int:
    return len(command.params) if command.name == FIN_RUN else 1


def feed_whole(stream: bytes, fin_runs: bool) -> list[Command]:
    """The stream in one call without a budget (and the calls that finish splitting an MPUB
    of more than ``MPUB_SCAN_SLICE`` messages, as even an unbounded call stops there)."""
    parser = CommandParser(MAX_MSG, MAX_BODY, fin_runs=fin_runs)
    out = parser.feed(stream)
    while parser.more:
        out += parser.feed(b"")
    return out


def feed_with_budget(chunks: list[bytes], limit: int, fin_runs: bool) -> list[Command]:
    """Each chunk fed with ``limit``, then the parser drained as a connection's later turns
    drain it; every call stops once its budget is spent."""
    parser = CommandParser(MAX_MSG, MAX_BODY, fin_runs=fin_runs)
    out: list[Command] = []
    for chunk in chunks:
        data = chunk
        while True:
            got = parser.feed(data, limit)
            data = b""
            spent = [units(command) for command in got]
            if spent:  # the call went on only while budget was left
                assert sum(spent[:-1]) < limit
            out += got
            if not parser.more:
                break
            assert got or parser.pending is not None, "more without progress"
    return out


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(stream_pieces, min_size=1, max_size=25),
    cuts,
    st.integers(min_value=1, max_value=6),
    st.booleans(),
)
def test_a_budget_per_call_gives_the_commands_of_one_unbounded_call(
    pieces: list[bytes], points: list[int], limit: int, fin_runs: bool
) -> None:
    stream = b"".join(pieces)
    with mock.patch.object(commands, "MPUB_SCAN_SLICE", SCAN_SLICE):
        whole = until_fatal(feed_whole(stream, fin_runs=False))
        budgeted = until_fatal(feed_with_budget(chunked(stream, points), limit, fin_runs))
    assert expand_runs(budgeted) == whole


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(fin_lines, min_size=1, max_size=40), cuts, st.integers(1, 8))
def test_fin_runs_under_a_budget_expand_to_the_plain_fins(
    lines: list[bytes], points: list[int], limit: int
) -> None:
    stream = b"".join(lines)
    plain = until_fatal(feed_whole(stream, fin_runs=False))
    runs = until_fatal(feed_with_budget(chunked(stream, points), limit, fin_runs=True))
    assert expand_runs(runs) == plain


def test_a_long_burst_of_fins_comes_out_in_runs_of_at_most_fin_run_max() -> None:
    ids = [b"%016d" % n for n in range(commands.FIN_RUN_MAX * 2 + 7)]
    stream = b"".join(commands.fin(msg_id) for msg_id in ids)
    parsed = feed_with_budget([stream], 512, fin_runs=True)
    assert all(len(command.params) <= commands.FIN_RUN_MAX for command in parsed)
    assert [msg_id for command in parsed for msg_id in command.params] == ids


def mpub_error(body: bytes) -> tuple[str, str] | None:
    try:
        parse_mpub_body(body, MAX_MSG, MAX_BODY)
    except ProtocolError as err:
        return err.code, err.desc
    return None


@settings(max_examples=300, deadline=None, derandomize=True)
@given(mpub_bodies(), cuts, st.integers(min_value=0, max_value=4))
def test_an_mpub_split_as_it_arrives_gives_parse_mpub_body_of_the_whole(
    body: bytes, points: list[int], limit: int
) -> None:
    """The messages, or, for a body stopped at a bad count or size, the same error from the
    part the parser kept as from the whole body."""
    stream = mpub_wire("t", body) + commands.nop()
    parser = CommandParser(MAX_MSG, MAX_BODY)
    got: list[Command] = []
    with mock.patch.object(commands, "MPUB_SCAN_SLICE", SCAN_SLICE):
        for chunk in chunked(stream, points):
            got += parser.feed(chunk, limit)
            while parser.more:
                got += parser.feed(b"", limit)
    mpub = got[0]
    assert mpub.name == commands.MPUB and mpub.params == [b"t"]
    expected_error = mpub_error(body)
    if expected_error is None:
        assert mpub.messages == parse_mpub_body(body, MAX_MSG, MAX_BODY)
        assert mpub.body == body
        assert [c.name for c in got] == [commands.MPUB, b"NOP"]
    else:
        assert mpub.messages is None
        assert mpub.body is not None and body.startswith(mpub.body)
        assert mpub_error(mpub.body) == expected_error


@settings(max_examples=200, deadline=None, derandomize=True)
@given(mpub_bodies(valid_only=True), st.data())
def test_an_mpub_cut_short_keeps_every_byte_it_received(body: bytes, data: st.DataObject) -> None:
    """At end of stream inside an MPUB body the parser hands back the body so far, whole,
    however far its split had got: its error is that of the bytes received."""
    wire = mpub_wire("t", body)
    head = len(wire) - len(body)
    sent = data.draw(st.integers(min_value=head, max_value=len(wire) - 1))
    parser = CommandParser(MAX_MSG, MAX_BODY)
    with mock.patch.object(commands, "MPUB_SCAN_SLICE", SCAN_SLICE):
        for chunk in chunked(wire[:sent], data.draw(cuts)):
            assert parser.feed(chunk, 2) == []
            while parser.more:
                assert parser.feed(b"", 2) == []
    truncated = parser.truncated()
    assert truncated is not None
    name, params, partial = truncated
    assert partial is not None
    assert (name, params, partial) == (commands.MPUB, [b"t"], body[: sent - head])
    assert mpub_error(partial) is not None
