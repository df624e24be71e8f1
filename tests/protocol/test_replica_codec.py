"""The R1 replication codec: event batches and frames round trip, and malformed input of any
shape raises ReplicaProtocolError and nothing else."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.protocol import replica
from nsqpy.protocol.replica import (
    OPS,
    RECORD_FIXED,
    RECORD_HEAD,
    Ack,
    Attempts,
    ChannelOp,
    Defer,
    Event,
    Events,
    Fanout,
    Fin,
    Frame,
    FrameParser,
    Hello,
    Ping,
    Pong,
    Put,
    Puts,
    ReplicaProtocolError,
    Run,
    TopicOp,
    Welcome,
    decode_events,
    decode_run_at,
    encode_events,
    record_count,
    run_bodies,
)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
names = st.one_of(
    st.sampled_from(["t", "orders", "a.b_c-d#ephemeral", ""]),
    st.text(max_size=12),
    st.text(min_size=60, max_size=70),
)
ids = st.binary(min_size=16, max_size=16)
id_tuples = st.lists(ids, max_size=6).map(tuple)
channel_tuples = st.lists(names, max_size=5).map(tuple)


def framed(messages: list[tuple[bytes, int, int, bytes]]) -> bytes:
    """Disk-queue records: BE32 size, BE64 timestamp, BE16 attempts, id, body."""
    return b"".join(
        RECORD_HEAD.pack(RECORD_FIXED + len(body), timestamp, attempts, msg_id) + body
        for msg_id, timestamp, attempts, body in messages
    )


records = st.lists(
    st.tuples(ids, INT64, st.integers(min_value=0, max_value=0xFFFF), st.binary(max_size=60)),
    min_size=1,
    max_size=5,
).map(framed)


def sized(bodies: list[bytes]) -> bytes:
    """An MPUB's messages: BE32 size, body."""
    return b"".join(struct.pack(">I", len(body)) + body for body in bodies)


@st.composite
def runs(draw: st.DrawFn) -> Run:
    messages = draw(st.lists(st.tuples(ids, st.binary(min_size=1, max_size=40)), min_size=1))
    return Run(
        draw(names),
        draw(INT64),
        tuple(msg_id for msg_id, _ in messages),
        sized([body for _, body in messages]),
        draw(st.none() | channel_tuples),
    )


EVENT_STRATEGIES: dict[str, st.SearchStrategy[Event]] = {
    "run": runs(),
    "puts": st.builds(Puts, topic=names, records=records, channels=st.none() | channel_tuples),
    "put": st.builds(
        Put,
        topic=names,
        msg_id=ids,
        timestamp=INT64,
        attempts=st.integers(min_value=0, max_value=0xFFFF),
        body=st.binary(max_size=300),
        channels=st.none() | channel_tuples,
        defer_ms=st.integers(min_value=0, max_value=2**63 - 1),
    ),
    "fanout": st.builds(Fanout, topic=names, channels=channel_tuples, ids=id_tuples),
    "fin": st.builds(Fin, topic=names, channel=names, ids=id_tuples),
    "attempts": st.builds(
        Attempts,
        topic=names,
        channel=names,
        msg_id=ids,
        attempts=st.integers(min_value=0, max_value=0xFFFF),
    ),
    "defer": st.builds(Defer, topic=names, channel=names, msg_id=ids, remaining_ms=INT64),
    "channel": st.builds(ChannelOp, topic=names, channel=names, op=st.sampled_from(OPS)),
    "topic": st.builds(TopicOp, topic=names, op=st.sampled_from(OPS)),
}
any_event = st.one_of(*EVENT_STRATEGIES.values())
batches = st.lists(any_event, max_size=8)

ID = bytes(range(16))


def decodes_or_rejects(data: bytes) -> None:
    try:
        decode_events(data)
    except ReplicaProtocolError:
        pass


# --------------------------------------------------------------------------- event round trips


@pytest.mark.parametrize("kind", sorted(EVENT_STRATEGIES))
@settings(max_examples=150, deadline=None, derandomize=True)
@given(data=st.data())
def test_each_event_type_round_trips(kind: str, data: st.DataObject) -> None:
    event = data.draw(EVENT_STRATEGIES[kind])
    assert decode_events(encode_events([event])) == [event]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(batches)
def test_batches_round_trip(events: list[Event]) -> None:
    assert decode_events(encode_events(events)) == events


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=0, max_value=3),
    st.sampled_from([0, 1, 2, 255, 256, 257, 511, 512, 513, 1000]),
    st.binary(min_size=0, max_size=3),
)
def test_split_ids_gives_each_16_bytes_in_order(pos: int, count: int, tail: bytes) -> None:
    """IDs are split a chunk of 256 at a time: every count around the chunk's edges gives
    what slicing gives, from bytes and from a memoryview."""
    data = bytes(range(pos)) + bytes((i * 7 + 3) % 256 for i in range(count * 16)) + tail
    expected = tuple(data[pos + i * 16 : pos + (i + 1) * 16] for i in range(count))
    assert replica.split_ids(data, pos, count) == expected
    assert replica.split_ids(memoryview(data), pos, count) == expected


def test_empty_batch() -> None:
    assert encode_events([]) == b"\x00\x00\x00\x00"
    assert decode_events(b"\x00\x00\x00\x00") == []


def test_layout_is_pinned() -> None:
    # the bytes a peer's store keeps on disk: a change here is a format change
    put = Put("t", ID, 7, 2, b"hi", None, defer_ms=5)
    assert encode_events([put]) == (
        b"\x00\x00\x00\x01"
        + b"\x01\x00\x01t"
        + ID
        + struct.pack(">qHq", 7, 2, 5)
        + b"\xff\xff"
        + b"\x00\x00\x00\x02hi"
    )
    fin = Fin("t", "c", (ID,))
    assert encode_events([fin]) == b"\x00\x00\x00\x01\x03\x00\x01t\x00\x01c\x00\x00\x00\x01" + ID
    assert encode_events([TopicOp("t", "delete")]) == b"\x00\x00\x00\x01\x07\x00\x01t\x04"
    fanout = Fanout("t", ("a", "bc"), ())
    assert encode_events([fanout]) == (
        b"\x00\x00\x00\x01\x02\x00\x01t\x00\x02\x00\x01a\x00\x02bc\x00\x00\x00\x00"
    )


def test_run_layout_is_pinned_and_reads_back() -> None:
    run = Run("t", 7, (ID,), sized([b"hi"]), ("a",))
    data = encode_events([run])
    assert data == (
        b"\x00\x00\x00\x01"
        + b"\x09\x00\x01t\x00\x01\x00\x01a"
        + struct.pack(">q", 7)
        + b"\x00\x00\x00\x01"
        + ID
        + b"\x00\x00\x00\x06\x00\x00\x00\x02hi"
    )
    (decoded,) = decode_events(data)
    assert isinstance(decoded, Run) and decoded == run
    assert decode_run_at(data[decoded.at : decoded.at + decoded.size]) == ((ID,), [b"hi"])


@pytest.mark.parametrize(
    ("bodies", "count"),
    [
        (sized([b"a", b"b"]), 3),  # fewer messages than IDs
        (sized([b"a", b"b"]), 1),  # bytes left after the IDs' messages
        (sized([b"a"]) + b"\x00", 1),
        (sized([b"abc"])[:-1], 1),  # a body cut short
        (b"\x00\x00\x00\x00", 1),  # an empty body
        (b"\x00\x00", 1),  # a size cut short
    ],
)
def test_run_bodies_that_do_not_match_their_ids_are_rejected(bodies: bytes, count: int) -> None:
    with pytest.raises(ReplicaProtocolError):
        run_bodies(bodies, count)


def test_put_with_no_channels_differs_from_none() -> None:
    waiting = Put("t", ID, 1, 1, b"", None)
    copied_nowhere = Put("t", ID, 1, 1, b"", ())
    assert decode_events(encode_events([waiting, copied_nowhere])) == [waiting, copied_nowhere]


# --------------------------------------------------------------------------- encoder checks


@pytest.mark.parametrize(
    "event",
    [
        Put("t", b"short", 1, 1, b"", None),
        Put("t", ID, 1, 0x10000, b"", None),
        Put("t", ID, 1, -1, b"", None),
        Put("t", ID, 2**63, 1, b"", None),
        Put("t", ID, 1, 1, b"", None, defer_ms=-1),
        Put("x" * 0x10000, ID, 1, 1, b"", None),
        Put("\ud800", ID, 1, 1, b"", None),
        Fanout("t", ("c",) * 0xFFFF, ()),
        Fin("t", "c", (ID, ID + b"x")),
        Run("t", 1, (), sized([b"a"])),
        Run("t", 1, (ID[:15],), sized([b"a"])),
        Run("t", 1, (ID, ID[:15]), sized([b"a", b"b"])),
        Run("t", 2**63, (ID,), sized([b"a"])),
        Attempts("t", "c", ID, 0x10000),
        Defer("t", "c", ID, 2**63),
        ChannelOp("t", "c", "rename"),
        TopicOp("t", "CREATE"),
    ],
    ids=repr,
)
def test_encoder_rejects_what_the_format_cannot_carry(event: Event) -> None:
    with pytest.raises(ReplicaProtocolError):
        encode_events([event])


def test_encoder_rejects_non_events() -> None:
    with pytest.raises(TypeError):
        encode_events(["PUT t"])  # type: ignore[list-item]


# --------------------------------------------------------------------------- decoder checks


def one(event_bytes: bytes, count: int = 1) -> bytes:
    return struct.pack(">I", count) + event_bytes


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\x00\x00",
        b"\x00\x00\x00\x00\x00",  # trailing byte after an empty batch
        b"\xff\xff\xff\xff",  # a huge count, nothing after it
        one(b"\x07\x00\x01t\x00", count=2),  # one event where two are announced
        one(b"\x00\x00\x01t\x00"),  # type 0
        one(b"\x08\x00\x01t\x00"),  # PUTS cut short
        one(b"\x0a\x00\x01t\x00"),  # type beyond RUN
        one(b"\x07\x00\x01t\x05"),  # op beyond OPS
        one(b"\x07\x00\x01t\xff"),
        one(b"\x07\xff\xfft\x00"),  # a name longer than the batch
        one(b"\x07\x00\x01\xff\x00"),  # a name that is not UTF-8
        one(b"\x07\x00\x02\xed\xa0\x00"),  # a UTF-8-encoded surrogate
        one(b"\x03\x00\x01t\x00\x01c\xff\xff\xff\xff" + ID),  # 4G IDs announced, one present
        one(b"\x03\x00\x01t\x00\x01c\x00\x00\x00\x01" + ID[:15]),
        one(b"\x02\x00\x01t\xff\xff\x00\x00\x00\x00"),  # FANOUT with the None marker
        one(b"\x02\x00\x01t\xff\xfe\x00\x00\x00\x00"),  # 65534 channels announced
        one(b"\x01\x00\x01t" + ID + struct.pack(">qHq", 1, 1, -1) + b"\xff\xff\x00\x00\x00\x00"),
        one(b"\x01\x00\x01t" + ID + struct.pack(">qHq", 1, 1, 0) + b"\xff\xff\xff\xff\xff\xffab"),
        one(b"\x05\x00\x01t\x00\x01c" + ID + b"\x00" * 7),
        # RUN: no messages; bodies too few bytes for their IDs
        one(b"\x09\x00\x01t\xff\xff" + b"\x00" * 8 + b"\x00" * 4 + b"\x00\x00\x00\x05" + b"a" * 5),
        one(
            b"\x09\x00\x01t\xff\xff"
            + b"\x00" * 8
            + b"\x00\x00\x00\x01"
            + ID
            + b"\x00\x00\x00\x04abcd"
        ),
    ],
)
def test_decoder_rejects_malformed_batches(data: bytes) -> None:
    with pytest.raises(ReplicaProtocolError):
        decode_events(data)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(any_event, min_size=1, max_size=4))
def test_every_truncation_and_any_trailing_bytes_are_rejected(events: list[Event]) -> None:
    data = encode_events(events)
    for cut in range(len(data)):
        with pytest.raises(ReplicaProtocolError):
            decode_events(data[:cut])
    with pytest.raises(ReplicaProtocolError):
        decode_events(data + b"\x00")


def test_huge_counts_fail_without_allocating() -> None:
    # counts near the top of their range in a few bytes: rejected before any list is built
    for data in (
        b"\x7f\xff\xff\xff" + b"\x07" * 64,
        one(b"\x03\x00\x00\x00\x00\x7f\xff\xff\xff"),
        one(b"\x01\x00\x00" + ID + bytes(18) + b"\x00\x00\x7f\xff\xff\xff"),
    ):
        with pytest.raises(ReplicaProtocolError):
            decode_events(data)


def test_decoder_accepts_buffers() -> None:
    data = encode_events([Fin("t", "c", (ID,)), Put("t", ID, 1, 1, b"b", ("c",))])
    expected = decode_events(data)
    for buffer, start in ((data, 0), (bytearray(data), 0), (memoryview(b"xy" + data), 2)):
        decoded = replica._decode_events_at(buffer, start)
        assert decoded == expected
        assert all(type(i) is bytes for i in decoded[0].ids)  # type: ignore[union-attr]


# --------------------------------------------------------------------------- event fuzz


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_protocol_error(data: bytes) -> None:
    decodes_or_rejects(data)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.binary(max_size=120))
def test_arbitrary_events_after_a_plausible_count(tail: bytes) -> None:
    # most random bytes fail at the count; this reaches the event parsers
    for count in (1, 2):
        decodes_or_rejects(struct.pack(">I", count) + tail)


@st.composite
def mutated(draw: st.DrawFn, source: st.SearchStrategy[bytes]) -> bytes:
    """A valid encoding with a few bytes overwritten, inserted or deleted."""
    data = bytearray(draw(source))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        where = draw(st.integers(min_value=0, max_value=len(data)))
        action = draw(st.sampled_from(["set", "insert", "delete"]))
        byte = draw(st.integers(min_value=0, max_value=255))
        if action == "set" and where < len(data):
            data[where] = byte
        elif action == "insert":
            data.insert(where, byte)
        elif where < len(data):
            del data[where]
    return bytes(data)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(mutated(batches.map(encode_events)))
def test_mutated_batches_decode_or_raise_protocol_error(data: bytes) -> None:
    decodes_or_rejects(data)


# --------------------------------------------------------------------------- frames

SEQ = st.integers(min_value=0, max_value=2**64 - 1)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
infos = st.dictionaries(st.text(max_size=12), json_values, max_size=5)

FRAME_STRATEGIES: dict[str, st.SearchStrategy[Frame]] = {
    "hello": st.builds(Hello, infos),
    "welcome": st.builds(Welcome, infos),
    "events": st.builds(Events, SEQ, st.lists(any_event, max_size=4)),
    "ack": st.builds(Ack, SEQ),
    "ping": st.just(Ping()),
    "pong": st.just(Pong()),
}
any_frame = st.one_of(*FRAME_STRATEGIES.values())


def encode(frame: Frame) -> bytes:
    if isinstance(frame, Hello):
        return replica.hello(frame.info)
    if isinstance(frame, Welcome):
        return replica.welcome(frame.info)
    if isinstance(frame, Events):
        return replica.events(frame.first_seq, frame.events)
    if isinstance(frame, Ack):
        return replica.ack(frame.seq)
    if isinstance(frame, Ping):
        return replica.ping()
    return replica.pong()


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def parse_or_reject(chunks: list[bytes], max_frame_size: int = 4096) -> None:
    parser = FrameParser(max_frame_size)
    try:
        for chunk in chunks:
            parser.feed(chunk)
    except ReplicaProtocolError:
        pass


@pytest.mark.parametrize("kind", sorted(FRAME_STRATEGIES))
@settings(max_examples=100, deadline=None, derandomize=True)
@given(data=st.data())
def test_each_frame_type_round_trips(kind: str, data: st.DataObject) -> None:
    frame = data.draw(FRAME_STRATEGIES[kind])
    parser = FrameParser(1 << 20)
    assert parser.feed(encode(frame)) == [frame]
    assert parser.buffered == 0


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.lists(any_frame, max_size=10),
    st.lists(st.integers(min_value=0, max_value=10**6), max_size=30),
)
def test_a_stream_split_anywhere_parses_as_a_whole(frames: list[Frame], cuts: list[int]) -> None:
    stream = b"".join(map(encode, frames))
    assert FrameParser(1 << 20).feed(stream) == frames
    parser = FrameParser(1 << 20)
    parsed = [frame for chunk in split_at(stream, cuts) for frame in parser.feed(chunk)]
    assert parsed == frames
    assert parser.buffered == 0


def test_a_stream_fed_byte_by_byte() -> None:
    frames: list[Frame] = [
        Hello({"address": "127.0.0.1:4150", "incarnation": "a1"}),
        Welcome({"incarnation": "b2", "stored": 0}),
        Events(1, [Put("t", ID, 1, 1, b"x", ("c",)), Fin("t", "c", (ID,))]),
        Ack(2),
        Ping(),
        Pong(),
    ]
    parser = FrameParser()
    parsed: list[Frame] = []
    for byte in b"".join(map(encode, frames)):
        parsed += parser.feed(bytes([byte]))
    assert parsed == frames


def test_frame_layout_is_pinned() -> None:
    assert replica.ping() == b"\x00\x00\x00\x01\x05"
    assert replica.pong() == b"\x00\x00\x00\x01\x06"
    assert replica.ack(258) == b"\x00\x00\x00\x09\x04" + struct.pack(">Q", 258)
    assert replica.hello({"a": 1}) == b"\x00\x00\x00\x08\x01" + b'{"a":1}'
    assert replica.welcome({}) == b"\x00\x00\x00\x03\x02{}"
    batch = encode_events([TopicOp("t", "create")])
    assert replica.events(7, [TopicOp("t", "create")]) == (
        struct.pack(">IB", 9 + len(batch), 3) + struct.pack(">Q", 7) + batch
    )


def test_frames_at_the_size_bound() -> None:
    frame = replica.events(1, [Put("t", ID, 1, 1, b"x" * 100, None)])
    size = len(frame) - 4
    assert FrameParser(size).feed(frame) == [Events(1, [Put("t", ID, 1, 1, b"x" * 100, None)])]
    parser = FrameParser(size - 1)
    with pytest.raises(ReplicaProtocolError):
        parser.feed(frame[:4])  # the size alone is enough to refuse it


def frame(frame_type: int, payload: bytes) -> bytes:
    return struct.pack(">IB", len(payload) + 1, frame_type) + payload


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\x00\x00\x00",  # size 0: no type byte
        b"\x00\x01\x00\x01",  # beyond the parser's 4096
        b"\xff\xff\xff\xff",
        frame(0, b""),
        frame(7, b""),
        frame(255, b"x"),
        frame(1, b""),  # HELLO without JSON
        frame(1, b"[1, 2]"),
        frame(1, b'"address"'),
        frame(1, b"null"),
        frame(2, b"{"),
        frame(2, b'{"a": NaN}'),
        frame(2, b'{"a": 1}x'),
        frame(2, b'{"\xff": 1}'),
        frame(2, '{"a": "é"}'.encode("utf-16")),
        frame(1, b"[" * 3000 + b"]" * 3000),
        frame(1, b'{"a": ' + b"9" * 5000 + b"}"),
        frame(3, b""),
        frame(3, b"\x00" * 7),
        frame(3, b"\x00" * 8),  # a sequence number, no batch
        frame(3, b"\x00" * 8 + b"\x00\x00\x00\x01"),
        frame(3, b"\x00" * 8 + b"\x00\x00\x00\x00\x00"),
        frame(4, b""),
        frame(4, b"\x00" * 7),
        frame(4, b"\x00" * 9),
        frame(5, b"\x00"),
        frame(6, b"pong"),
    ],
)
def test_parser_rejects_bad_frames(data: bytes) -> None:
    with pytest.raises(ReplicaProtocolError):
        FrameParser(4096).feed(data)


def test_an_error_ends_the_parser() -> None:
    parser = FrameParser()
    assert parser.feed(replica.ping() + frame(9, b"")[:3]) == [Ping()]
    with pytest.raises(ReplicaProtocolError):
        parser.feed(frame(9, b"")[3:] + replica.pong())
    with pytest.raises(ReplicaProtocolError):
        parser.feed(replica.pong())
    assert parser.buffered == 0


def test_encoders_check_sequence_numbers() -> None:
    for seq in (-1, 2**64):
        with pytest.raises(ReplicaProtocolError):
            replica.ack(seq)
        with pytest.raises(ReplicaProtocolError):
            replica.events(seq, [])


# --------------------------------------------------------------------------- frame fuzz


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.lists(st.binary(max_size=64), max_size=6))
def test_arbitrary_bytes_parse_or_raise_protocol_error(chunks: list[bytes]) -> None:
    parse_or_reject(chunks)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.integers(min_value=1, max_value=6), st.binary(max_size=60)), max_size=5)
)
def test_arbitrary_payloads_of_known_types(items: list[tuple[int, bytes]]) -> None:
    # random frames rarely have a sane size and type; these reach every payload decoder
    parse_or_reject([b"".join(frame(kind, payload) for kind, payload in items)])


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    mutated(st.lists(any_frame, min_size=1, max_size=4).map(lambda fs: b"".join(map(encode, fs)))),
    st.lists(st.integers(min_value=0, max_value=10**6), max_size=5),
)
def test_mutated_streams_parse_or_raise_protocol_error(stream: bytes, cuts: list[int]) -> None:
    parse_or_reject(split_at(stream, cuts), max_frame_size=1 << 16)


# --------------------------------------------------------------------------- PUTS records


def test_puts_records_are_counted_and_their_framing_checked() -> None:
    good = framed([(ID, 1, 1, b"one"), (ID, 2, 1, b""), (ID, 3, 2, b"three")])
    assert record_count(good) == 3
    event = Puts("t", good, ("a",))
    encoded = encode_events([event])
    assert decode_events(encoded) == [event]
    for bad in (good[:-1], good + b"\x00", good[:3], (RECORD_FIXED - 1).to_bytes(4, "big")):
        with pytest.raises(ReplicaProtocolError):
            record_count(bad)
        forged = encoded[: len(encoded) - len(good) - 4] + len(bad).to_bytes(4, "big") + bad
        with pytest.raises(ReplicaProtocolError):
            decode_events(forged)


def test_puts_without_records_is_refused_both_ways() -> None:
    with pytest.raises(ReplicaProtocolError):
        encode_events([Puts("t", b"")])
    # one event: PUTS, topic "t", no channels, 0 bytes of records
    empty = b"\x00\x00\x00\x01" + b"\x08" + b"\x00\x01t" + b"\xff\xff" + b"\x00\x00\x00\x00"
    with pytest.raises(ReplicaProtocolError, match="PUTS without records"):
        decode_events(empty)
