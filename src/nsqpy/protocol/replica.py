"""The replication protocol between nsqd peers (``  R1``), as data: frames and events.

docs/replication.md has the design. A node's *stream* is the ordered events of what it owns;
each event batch carries the sequence number of its first event, so a peer's ACK of a
sequence number covers every event up to it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

#: The magic a replication link sends first, on nsqd's client TCP port (beside ``  V2``).
MAGIC_R1 = b"  R1"

#: CHANNEL and TOPIC operations, applied on every node of the group.
OP_CREATE = "create"
OP_PAUSE = "pause"
OP_UNPAUSE = "unpause"
OP_EMPTY = "empty"
OP_DELETE = "delete"
OPS = (OP_CREATE, OP_PAUSE, OP_UNPAUSE, OP_EMPTY, OP_DELETE)


@dataclass(frozen=True, slots=True)
class Put:
    """A message the owner accepted. ``channels`` are the channels it was copied to when the
    owner sent the event; None while it waits in the topic for a channel (a topic with no
    channel yet, or a copy the topic's pump has not made yet): a :class:`Fanout` assigns it
    later. ``defer_ms`` is a DPUB's deferral."""

    topic: str
    msg_id: bytes
    timestamp: int
    attempts: int
    body: bytes
    channels: tuple[str, ...] | None
    defer_ms: int = 0
    #: where the body starts in the event batch it was decoded from (-1: not decoded), so a
    #: store that logs the batch as it came can find the body in its log
    at: int = field(default=-1, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Puts:
    """Messages the owner accepted into a topic, in one event: as a :class:`Put` of each
    with these ``channels`` and no deferral. ``records`` holds each message as a disk queue
    stores it, ``BE32 size`` then ``BE64 timestamp, BE16 attempts, 16-byte id, body``: the
    owner frames a publish's messages once, and the peer logs the bytes as they came."""

    topic: str
    records: bytes
    channels: tuple[str, ...] | None = None
    #: where ``records`` starts in the event batch it was decoded from (-1: not decoded)
    at: int = field(default=-1, compare=False, repr=False)
    #: how many records ``records`` holds, counted as it was decoded (0: not decoded)
    count: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Run:
    """An MPUB's messages as the owner accepted them, in one event: a :class:`Put` of each
    with these ``channels``, the one ``timestamp``, attempts 0 and no deferral. ``bodies``
    holds the messages as the publisher sent them (each ``BE32 size`` then the body, in the
    order of ``ids``): neither side frames a message on its own, the owner sends what it read
    and the peer logs it as it came. The bodies are split only when they are read back (a
    takeover, a compaction): :func:`run_bodies` checks they match the IDs then."""

    topic: str
    timestamp: int
    ids: tuple[bytes, ...]
    bodies: bytes | memoryview
    channels: tuple[str, ...] | None = None
    #: where the IDs' count starts in the event batch it was decoded from (-1: not decoded);
    #: ``size`` bytes from there hold the IDs and the bodies (:func:`decode_run_at`)
    at: int = field(default=-1, compare=False, repr=False)
    size: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Fanout:
    """The owner's topic copied messages that were waiting in it to these channels."""

    topic: str
    channels: tuple[str, ...]
    ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Fin:
    """Messages done with on a channel: finished, dead-lettered or sampled out."""

    topic: str
    channel: str
    ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Attempts:
    """A message's attempts on a channel as the owner last counted them (sent when it is
    requeued or times out), so a takeover never lowers them."""

    topic: str
    channel: str
    msg_id: bytes
    attempts: int


@dataclass(frozen=True, slots=True)
class Defer:
    """A message deferred on a channel (REQ with a delay): due ``remaining_ms`` after the
    event was stored, so a takeover keeps the rest of its deferral."""

    topic: str
    channel: str
    msg_id: bytes
    remaining_ms: int


@dataclass(frozen=True, slots=True)
class ChannelOp:
    topic: str
    channel: str
    op: str  # one of OPS


@dataclass(frozen=True, slots=True)
class TopicOp:
    topic: str
    op: str  # one of OPS


Event = Put | Puts | Run | Fanout | Fin | Attempts | Defer | ChannelOp | TopicOp


class ReplicaProtocolError(ValueError):
    """Bytes that are not a well-formed R1 frame or event batch (or a value that cannot be
    encoded as one): the link that sent them is closed."""


# --------------------------------------------------------------------------- events
#
# A batch is ``BE32(count)`` then the events, each one type byte and its fields:
#
#   str       BE16(len) UTF-8
#   id        16 bytes
#   channels  BE16(count) str*, count 0xFFFF meaning None
#   ids       BE32(count) id*
#   op        one byte, the index in OPS
#
#   PUT       topic, id, BE64 timestamp, BE16 attempts, BE64 defer_ms, channels, BE32(len) body
#   FANOUT    topic, channels, ids
#   FIN       topic, channel, ids
#   ATTEMPTS  topic, channel, id, BE16 attempts
#   DEFER     topic, channel, id, BE64 remaining_ms (signed: an overdue deferral is negative)
#   CHANNEL   topic, channel, op
#   TOPIC     topic, op
#   PUTS      topic, channels, BE32(len) records (each BE32 size, BE64 timestamp,
#             BE16 attempts, id, body)
#   RUN       topic, channels, BE64 timestamp, ids, BE32(len) bodies (each BE32 size, body)

EVENT_PUT = 1
EVENT_FANOUT = 2
EVENT_FIN = 3
EVENT_ATTEMPTS = 4
EVENT_DEFER = 5
EVENT_CHANNEL = 6
EVENT_TOPIC = 7
EVENT_PUTS = 8
EVENT_RUN = 9

ID_SIZE = 16
_NO_CHANNELS = 0xFFFF
#: The most channels one event can name (the count's largest value is the None marker).
MAX_CHANNELS = _NO_CHANNELS - 1
#: The smallest encoded event (TOPIC with an empty name): bounds a batch's announced count.
_MIN_EVENT_SIZE = 1 + 2 + 1

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_PUT_FIXED = struct.Struct(">16sqHq")  # id, timestamp, attempts, defer_ms
_ID_U16 = struct.Struct(">16sH")  # id, attempts
_ID_I64 = struct.Struct(">16sq")  # id, remaining_ms

_OP_CODES = {op: code for code, op in enumerate(OPS)}
#: IDs split per C call (a larger run is split a chunk at a time)
_ID_CHUNK = 256

#: a record of :class:`Puts`: its size, then the message's fixed fields
RECORD_HEAD = struct.Struct(">IqH16s")  # size, timestamp, attempts, id
#: what a record's size counts beside the body: timestamp, attempts, id
RECORD_FIXED = RECORD_HEAD.size - 4


def record_count(records: bytes | memoryview) -> int:
    """How many records ``records`` holds; ReplicaProtocolError unless they fill it exactly,
    each at least a message's fixed fields."""
    unpack = _U32.unpack_from
    end = len(records)
    pos = count = 0
    try:
        while pos < end:
            size = unpack(records, pos)[0]
            if size < RECORD_FIXED:
                raise ReplicaProtocolError(f"record of {size} bytes at {pos}")
            pos += 4 + size
            count += 1
    except struct.error:
        raise ReplicaProtocolError(f"record cut short at {pos}") from None
    if pos != end:
        raise ReplicaProtocolError(f"record cut short at {pos - 4 - size}")
    return count


@lru_cache(maxsize=_ID_CHUNK + 1)
def _id_struct(count: int) -> struct.Struct:
    return struct.Struct("16s" * count)


def split_ids(data: bytes | bytearray | memoryview, pos: int, count: int) -> tuple[bytes, ...]:
    """The ``count`` IDs laid end to end in ``data`` from ``pos``, each a bytes object: one
    struct unpack per chunk, several times faster than slicing or a regex."""
    if count <= _ID_CHUNK:
        ids: tuple[bytes, ...] = _id_struct(count).unpack_from(data, pos)
        return ids
    chunk = _id_struct(_ID_CHUNK)
    step = _ID_CHUNK * ID_SIZE
    split: list[bytes] = []
    while count > _ID_CHUNK:
        split += chunk.unpack_from(data, pos)
        pos += step
        count -= _ID_CHUNK
    split += _id_struct(count).unpack_from(data, pos)
    return tuple(split)


@lru_cache(maxsize=4096)
def _str(value: str) -> bytes:
    # topic and channel names repeat in every event: encode each once
    raw = value.encode()
    if len(raw) > 0xFFFF:
        raise ReplicaProtocolError(f"name of {len(raw)} bytes is too long to encode")
    return _U16.pack(len(raw)) + raw


def _id(msg_id: bytes) -> bytes:
    if len(msg_id) != ID_SIZE:
        raise ReplicaProtocolError(f"message ID of {len(msg_id)} bytes, not {ID_SIZE}")
    return msg_id


def _ids(ids: Sequence[bytes]) -> bytes:
    """``ids`` as their count and their bytes, checked by length as a whole (they are nsqd's
    own message IDs): a wrong-sized ID among them makes the total a wrong multiple or the
    split at decoding differ."""
    joined = b"".join(ids)
    if len(joined) != ID_SIZE * len(ids):
        raise ReplicaProtocolError(f"message IDs of {len(joined)} bytes for {len(ids)} IDs")
    return _U32.pack(len(ids)) + joined


def _channels(channels: Sequence[str] | None) -> bytes:
    if channels is None:
        return _U16.pack(_NO_CHANNELS)
    if len(channels) > MAX_CHANNELS:
        raise ReplicaProtocolError(f"{len(channels)} channels, at most {MAX_CHANNELS}")
    return _U16.pack(len(channels)) + b"".join(map(_str, channels))


def _op(op: str) -> bytes:
    code = _OP_CODES.get(op)
    if code is None:
        raise ReplicaProtocolError(f"unknown operation {op!r}")
    return _U8.pack(code)


def _encode_put(event: Put) -> bytes:
    if event.defer_ms < 0:
        raise ReplicaProtocolError(f"negative deferral {event.defer_ms}")
    fixed = _PUT_FIXED.pack(_id(event.msg_id), event.timestamp, event.attempts, event.defer_ms)
    body = event.body
    return b"".join(
        (
            b"\x01",
            _str(event.topic),
            fixed,
            _channels(event.channels),
            _U32.pack(len(body)),
            body,
        )
    )


def _encode_parts(event: Event) -> tuple[bytes | memoryview, ...]:
    """An event's encoding in parts, joined once for the whole frame: a RUN's bodies and a
    PUTS's records (an MPUB's bytes, tens of KB) are not copied into an event of their own."""
    if isinstance(event, Run):
        if not event.ids:
            raise ReplicaProtocolError("RUN without messages")
        return (
            b"\x09",
            _str(event.topic),
            _channels(event.channels),
            _I64.pack(event.timestamp),
            _ids(event.ids),
            _U32.pack(len(event.bodies)),
            event.bodies,
        )
    if isinstance(event, Puts):
        records = event.records
        if not records:
            raise ReplicaProtocolError("PUTS without records")
        head = b"\x08" + _str(event.topic) + _channels(event.channels)
        return head, _U32.pack(len(records)), records
    return (_encode_one(event),)


def _encode_one(event: Event) -> bytes:
    """Any event but a RUN or a PUTS (see :func:`_encode_parts`)."""
    if isinstance(event, Put):
        return _encode_put(event)
    if isinstance(event, Fin):
        return b"\x03" + _str(event.topic) + _str(event.channel) + _ids(event.ids)
    if isinstance(event, Fanout):
        return b"\x02" + _str(event.topic) + _channels(event.channels) + _ids(event.ids)
    if isinstance(event, Attempts):
        fixed = _ID_U16.pack(_id(event.msg_id), event.attempts)
        return b"\x04" + _str(event.topic) + _str(event.channel) + fixed
    if isinstance(event, Defer):
        fixed = _ID_I64.pack(_id(event.msg_id), event.remaining_ms)
        return b"\x05" + _str(event.topic) + _str(event.channel) + fixed
    if isinstance(event, ChannelOp):
        return b"\x06" + _str(event.topic) + _str(event.channel) + _op(event.op)
    if isinstance(event, TopicOp):
        return b"\x07" + _str(event.topic) + _op(event.op)
    raise TypeError(f"not a replication event: {event!r}")


def encode_events(events: Sequence[Event]) -> bytes:
    """A batch of events as bytes that :func:`decode_events` reads back.

    Raises ReplicaProtocolError for a value the format cannot carry (an ID that is not 16
    bytes, attempts beyond BE16, a negative deferral, an unknown op, a name beyond 64 KiB)."""
    return b"".join(_batch_parts(events))


def _batch_parts(events: Sequence[Event]) -> list[bytes | memoryview]:
    """:func:`encode_events` in parts, for one join with whatever goes before them."""
    parts: list[bytes | memoryview] = [_U32.pack(len(events))]
    try:
        for event in events:
            parts += _encode_parts(event)
    except struct.error as exc:
        raise ReplicaProtocolError(f"event field out of range: {exc}") from None
    except UnicodeEncodeError as exc:
        raise ReplicaProtocolError(f"name is not encodable as UTF-8: {exc}") from None
    return parts


class _Reader:
    """A cursor over an event batch; every read checks the bytes are there first."""

    __slots__ = ("data", "end", "origin", "pos")

    def __init__(self, data: bytes | bytearray | memoryview, pos: int) -> None:
        self.data = data
        self.origin = pos  # where the batch starts: positions in events count from it
        self.pos = pos
        self.end = len(data)

    def need(self, size: int) -> int:
        """The current position, after checking ``size`` bytes follow it."""
        pos = self.pos
        if self.end - pos < size:
            raise ReplicaProtocolError(f"truncated event batch at byte {pos}")
        self.pos = pos + size
        return pos

    def u8(self) -> int:
        return self.data[self.need(1)]

    def u16(self) -> int:
        return int(_U16.unpack_from(self.data, self.need(2))[0])

    def u32(self) -> int:
        return int(_U32.unpack_from(self.data, self.need(4))[0])

    def name(self) -> str:
        size = self.u16()
        pos = self.need(size)
        try:
            return str(self.data[pos : pos + size], "utf-8")
        except UnicodeDecodeError:
            raise ReplicaProtocolError(f"name at byte {pos} is not UTF-8") from None

    def count(self, announced: int, item_size: int) -> int:
        """An announced count of items, each at least ``item_size`` bytes, checked against
        what is left: a huge count in a short batch is an error, never a huge allocation."""
        if announced * item_size > self.end - self.pos:
            raise ReplicaProtocolError(f"count {announced} beyond the batch's end")
        return announced

    def channels(self) -> tuple[str, ...] | None:
        announced = self.u16()
        if announced == _NO_CHANNELS:
            return None
        return tuple(self.name() for _ in range(self.count(announced, 2)))

    def ids(self) -> tuple[bytes, ...]:
        count = self.count(self.u32(), ID_SIZE)
        pos = self.need(count * ID_SIZE)
        return split_ids(self.data, pos, count)

    def op(self) -> str:
        code = self.u8()
        if code >= len(OPS):
            raise ReplicaProtocolError(f"unknown operation code {code}")
        return OPS[code]

    def put(self) -> Put:
        topic = self.name()
        msg_id, timestamp, attempts, defer_ms = _PUT_FIXED.unpack_from(
            self.data, self.need(_PUT_FIXED.size)
        )
        if defer_ms < 0:
            raise ReplicaProtocolError(f"negative deferral {defer_ms}")
        channels = self.channels()
        size = self.u32()
        pos = self.need(size)
        body = bytes(self.data[pos : pos + size])
        return Put(topic, msg_id, timestamp, attempts, body, channels, defer_ms, pos - self.origin)

    def puts(self) -> Puts:
        topic = self.name()
        channels = self.channels()
        size = self.u32()
        pos = self.need(size)
        records = bytes(self.data[pos : pos + size])
        if not records:
            raise ReplicaProtocolError("PUTS without records")
        return Puts(topic, records, channels, pos - self.origin, record_count(records))

    def run(self) -> Run:
        topic = self.name()
        channels = self.channels()
        timestamp = int(_I64.unpack_from(self.data, self.need(_I64.size))[0])
        at = self.pos
        ids = self.ids()
        if not ids:
            raise ReplicaProtocolError("RUN without messages")
        size = self.u32()
        pos = self.need(size)
        # each message at least its BE32 size and one byte: checked now, split when read back
        if size < 5 * len(ids):
            raise ReplicaProtocolError(f"RUN of {len(ids)} messages in {size} bytes")
        bodies = bytes(self.data[pos : pos + size])
        return Run(topic, timestamp, ids, bodies, channels, at - self.origin, self.pos - at)

    def event(self) -> Event:
        kind = self.u8()
        if kind == EVENT_RUN:
            return self.run()
        if kind == EVENT_PUTS:
            return self.puts()
        if kind == EVENT_PUT:
            return self.put()
        if kind == EVENT_FIN:
            return Fin(self.name(), self.name(), self.ids())
        if kind == EVENT_FANOUT:
            topic = self.name()
            channels = self.channels()
            if channels is None:
                raise ReplicaProtocolError("FANOUT without channels")
            return Fanout(topic, channels, self.ids())
        if kind == EVENT_ATTEMPTS:
            topic, channel = self.name(), self.name()
            msg_id, attempts = _ID_U16.unpack_from(self.data, self.need(_ID_U16.size))
            return Attempts(topic, channel, msg_id, attempts)
        if kind == EVENT_DEFER:
            topic, channel = self.name(), self.name()
            msg_id, remaining = _ID_I64.unpack_from(self.data, self.need(_ID_I64.size))
            return Defer(topic, channel, msg_id, remaining)
        if kind == EVENT_CHANNEL:
            return ChannelOp(self.name(), self.name(), self.op())
        if kind == EVENT_TOPIC:
            return TopicOp(self.name(), self.op())
        raise ReplicaProtocolError(f"unknown event type {kind} at byte {self.pos - 1}")


def run_bodies(bodies: bytes | memoryview, count: int) -> list[tuple[int, int]]:
    """(offset, length) in ``bodies`` of each of a :class:`Run`'s ``count`` messages;
    ReplicaProtocolError unless they fill it exactly, each body at least one byte."""
    unpack = _U32.unpack_from
    end = len(bodies)
    places: list[tuple[int, int]] = []
    pos = 0
    try:
        for _ in range(count):
            (size,) = unpack(bodies, pos)
            pos += 4
            if size < 1 or end - pos < size:
                raise ReplicaProtocolError(f"RUN body of {size} bytes at {pos - 4}")
            places.append((pos, size))
            pos += size
    except struct.error:
        raise ReplicaProtocolError(f"RUN body cut short at {pos}") from None
    if pos != end:
        raise ReplicaProtocolError(f"RUN of {count} messages leaves {end - pos} bytes")
    return places


def split_run_at(data: bytes) -> tuple[tuple[bytes, ...], memoryview]:
    """The IDs of a run read back from the ``size`` bytes a decoded :class:`Run` reports at
    its ``at``, and its bodies as :attr:`Run.bodies` holds them, not split."""
    reader = _Reader(data, 0)
    ids = reader.ids()
    size = reader.u32()
    pos = reader.need(size)
    if reader.pos != reader.end:
        raise ReplicaProtocolError(f"{reader.end - reader.pos} bytes after a RUN's bodies")
    return ids, memoryview(data)[pos : pos + size]


def decode_run_at(data: bytes) -> tuple[tuple[bytes, ...], list[bytes]]:
    """The IDs and bodies of a run read back from the ``size`` bytes a decoded :class:`Run`
    reports at its ``at``: ReplicaProtocolError if they do not match (see :func:`run_bodies`)."""
    ids, view = split_run_at(data)
    return ids, [bytes(view[at : at + length]) for at, length in run_bodies(view, len(ids))]


def _decode_events_at(data: bytes | bytearray | memoryview, pos: int) -> list[Event]:
    reader = _Reader(data, pos)
    count = reader.count(reader.u32(), _MIN_EVENT_SIZE)
    events = [reader.event() for _ in range(count)]
    if reader.pos != reader.end:
        raise ReplicaProtocolError(f"{reader.end - reader.pos} bytes after the last event")
    return events


def decode_events(data: bytes) -> list[Event]:
    """The events of a batch :func:`encode_events` made. Anything else (truncated, an unknown
    type or op, a count beyond the bytes given, bytes left over) raises ReplicaProtocolError."""
    return _decode_events_at(data, 0)


# --------------------------------------------------------------------------- frames
#
# ``BE32(size) type payload``, ``size`` counting the type byte and the payload.

FRAME_HELLO = 1
FRAME_WELCOME = 2
FRAME_EVENTS = 3
FRAME_ACK = 4
FRAME_PING = 5
FRAME_PONG = 6

#: A frame's head: ``BE32(size)`` and the type byte.
FRAME_HEAD = struct.Struct(">IB")
#: The default bound on a frame's size; a link passes its own (large enough for a batch of
#: its largest messages).
DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Hello:
    """The owner introduces itself: its address and incarnation (docs/replication.md)."""

    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Welcome:
    """The peer's answer: its incarnation and how much of the owner's stream it has stored."""

    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Events:
    """Events of the owner's stream, the first numbered ``first_seq``, the next ones after it."""

    first_seq: int
    events: list[Event]
    #: the events as they came (the frame's payload after the sequence number), so a store
    #: can log them without encoding them again
    encoded: bytes | memoryview = field(default=b"", compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Ack:
    """Every event of the owner's stream up to ``seq`` is stored on the peer."""

    seq: int


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Pong:
    pass


Frame = Hello | Welcome | Events | Ack | Ping | Pong

_PING = Ping()
_PONG = Pong()


def _frame(frame_type: int, payload: bytes) -> bytes:
    return FRAME_HEAD.pack(len(payload) + 1, frame_type) + payload


def _json(info: Mapping[str, Any]) -> bytes:
    return json.dumps(info, separators=(",", ":"), allow_nan=False).encode()


def hello(info: Mapping[str, Any]) -> bytes:
    return _frame(FRAME_HELLO, _json(info))


def welcome(info: Mapping[str, Any]) -> bytes:
    return _frame(FRAME_WELCOME, _json(info))


def events(first_seq: int, batch: Sequence[Event]) -> bytes:
    """An EVENTS frame, its events' bytes copied once (an MPUB's bodies among them)."""
    seq = _seq(first_seq)
    parts = _batch_parts(batch)
    size = 1 + len(seq) + sum(map(len, parts))
    return b"".join((FRAME_HEAD.pack(size, FRAME_EVENTS), seq, *parts))


def ack(seq: int) -> bytes:
    return _frame(FRAME_ACK, _seq(seq))


def ping() -> bytes:
    return _FRAME_PING


def pong() -> bytes:
    return _FRAME_PONG


_FRAME_PING = _frame(FRAME_PING, b"")
_FRAME_PONG = _frame(FRAME_PONG, b"")


def _seq(seq: int) -> bytes:
    if not 0 <= seq < 1 << 64:
        raise ReplicaProtocolError(f"sequence number {seq} out of range")
    return _U64.pack(seq)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _decode_info(payload: bytes, what: str) -> dict[str, Any]:
    try:
        info = json.loads(payload.decode(), parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        # ValueError covers bad UTF-8, bad JSON and integers beyond Python's digit limit;
        # RecursionError a nesting deeper than the decoder's stack
        raise ReplicaProtocolError(f"{what} payload is not JSON") from None
    if not isinstance(info, dict):
        raise ReplicaProtocolError(f"{what} payload is not a JSON object")
    return info


def _decode_seq(payload: bytes, what: str) -> int:
    if len(payload) != _U64.size:
        raise ReplicaProtocolError(f"{what} payload of {len(payload)} bytes, not 8")
    return int(_U64.unpack(payload)[0])


def _decode_frame(frame_type: int, payload: bytes) -> Frame:
    if frame_type == FRAME_EVENTS:
        if len(payload) < _U64.size:
            raise ReplicaProtocolError(f"EVENTS payload of {len(payload)} bytes")
        first_seq = int(_U64.unpack_from(payload)[0])
        encoded = memoryview(payload)[_U64.size :]
        return Events(first_seq, _decode_events_at(payload, _U64.size), encoded)
    if frame_type == FRAME_ACK:
        return Ack(_decode_seq(payload, "ACK"))
    if frame_type in (FRAME_PING, FRAME_PONG):
        if payload:
            raise ReplicaProtocolError(f"{len(payload)} bytes after PING or PONG")
        return _PING if frame_type == FRAME_PING else _PONG
    if frame_type == FRAME_HELLO:
        return Hello(_decode_info(payload, "HELLO"))
    if frame_type == FRAME_WELCOME:
        return Welcome(_decode_info(payload, "WELCOME"))
    raise ReplicaProtocolError(f"unknown frame type {frame_type}")


def _payload(source: bytes | bytearray, start: int, stop: int) -> bytes:
    """``source[start:stop]`` as bytes, copied once."""
    if type(source) is bytes:
        return source[start:stop]
    with memoryview(source) as view:
        return bytes(view[start:stop])


class FrameParser:
    """Incremental parser of R1 frames: feed it the bytes as they arrive, however split.

    A bad frame (size 0 or beyond ``max_frame_size``, an unknown type, a payload that does not
    parse) raises ReplicaProtocolError, and so does every later ``feed``: the link is done
    with, and frames parsed in the failing call are dropped with it (a new link resumes from
    the peer's WELCOME). A frame's bytes are buffered only once its size is known to be in
    bounds, so a peer cannot make the parser hold more than ``max_frame_size`` plus one read.
    """

    __slots__ = ("_buf", "_error", "_max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 1:
            raise ValueError(f"max_frame_size {max_frame_size} < 1")
        self._buf = bytearray()
        self._max_frame_size = max_frame_size
        self._error: ReplicaProtocolError | None = None

    def feed(self, data: bytes) -> list[Frame]:
        if self._error is not None:
            raise self._error
        buf = self._buf
        # frames whole in ``data`` are read from it as it is; only a partial frame is
        # buffered (a 40 KB MPUB's frame copied once, not three times)
        source: bytes | bytearray = data
        if buf:
            buf += data
            source = buf
        frames: list[Frame] = []
        pos = 0
        end = len(source)
        try:
            while end - pos >= 4:
                size = int(_U32.unpack_from(source, pos)[0])
                if size == 0 or size > self._max_frame_size:
                    raise ReplicaProtocolError(
                        f"frame size {size} not in 1..{self._max_frame_size}"
                    )
                stop = pos + 4 + size
                if stop > end:
                    break
                frames.append(_decode_frame(source[pos + 4], _payload(source, pos + 5, stop)))
                pos = stop
        except ReplicaProtocolError as exc:
            self._error = exc
            buf.clear()
            raise
        if source is buf:
            if pos:
                del buf[:pos]
        elif pos < end:
            buf += data[pos:] if pos else data
        return frames

    @property
    def buffered(self) -> int:
        """Bytes received of frames not complete yet."""
        return len(self._buf)
