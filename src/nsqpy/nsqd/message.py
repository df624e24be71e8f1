"""An nsqd message and its per-channel delivery state (Go: nsqd/message.go)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Protocol

from ..protocol.frames import FRAME_TYPE_MESSAGE
from ..protocol.message import (
    ID_START,
    MESSAGE_FRAME_HEAD,
    MESSAGE_FRAME_HEADER,
    MESSAGE_FRAME_OVERHEAD,
    MESSAGE_HEADER,
    MESSAGE_HEADER_LENGTH,
    decode_message,
)

if TYPE_CHECKING:
    from .diskqueue.holds import Hold

_new_message = object.__new__


class Owner(Protocol):
    """The consumer a message is in flight to, as far as the message and its readers need
    it (a channel's :class:`~nsqpy.nsqd.consumer.Consumer` is one)."""

    @property
    def client_id(self) -> str: ...

    def timed_out_message(self) -> None: ...


class Message:
    """One message in one channel (each channel gets its own copy from the topic).

    A topic with several channels puts the *same* object, marked ``shared``, in every
    channel's memory queue (one object and one body for all of them); a channel takes its own
    copy (:meth:`private`) when the message leaves the queue to be delivered or deferred, as
    attempts, timeouts and the owning client are per channel.
    """

    __slots__ = (
        "attempts",
        "body",
        "client",
        "deferred",
        "delivery_ts",
        "group",
        "hold",
        "id",
        "pri",
        "shared",
        "timestamp",
    )

    def __init__(self, msg_id: bytes, body: bytes, timestamp: int, attempts: int = 0) -> None:
        self.id = msg_id
        self.body = body
        self.timestamp = timestamp  # publish time, ns since the epoch; kept across requeues
        self.attempts = attempts
        self.deferred = 0.0  # seconds to defer, for DPUB and topic fan-out
        self.client: Owner | None = None  # owner while in flight
        self.delivery_ts = 0.0  # monotonic seconds
        self.pri = 0.0  # in-flight deadline or deferred due time, monotonic seconds
        self.group: dict[bytes, Message] | None = None  # the in-flight group holding it
        # its record in the channel's disk queue, kept until it is finished (diskqueue/holds.py)
        self.hold: Hold | None = None
        self.shared = False  # queued in several channels at once: never mutate, copy first

    def copy(self) -> Message:
        """A new message with this one's ID, body (shared bytes), timestamp, attempts and
        deferral, and none of its delivery state (a channel makes one per delivered message of
        a topic with several channels)."""
        clone = _build(self.id, self.body, self.timestamp, self.attempts)
        clone.deferred = self.deferred
        return clone

    def private(self) -> Message:
        """This message for one channel to own: itself, or a copy if it is shared."""
        return self.copy() if self.shared else self

    def detached(self) -> Message:
        """This message as it may wait in a queue for long (requeued, deferred): itself."""
        return self

    def encode(self) -> bytes:
        """The wire and disk encoding: ``BE64 ts, BE16 attempts, 16-byte id, body``."""
        return MESSAGE_HEADER.pack(self.timestamp, self.attempts) + self.id + self.body

    def frame(self) -> bytes:
        """The complete message frame as sent to a consumer."""
        size = MESSAGE_FRAME_OVERHEAD + len(self.body)
        header = MESSAGE_FRAME_HEADER.pack(size, FRAME_TYPE_MESSAGE, self.timestamp, self.attempts)
        return header + self.id + self.body


class RunMessage(Message):
    """A message an MPUB published, delivered from its run (:func:`frame_runs_in_flight`):
    its ID and body are read from the run, not kept. The cycle collector walks each message in
    flight that a young collection finds, and every object a message refers to is a memory
    read for it: the run is one object for all its messages, where their IDs and bodies are
    one each. Leaving flight for a queue, the message is :meth:`detached` from its run, so
    that a requeued or deferred message does not keep its whole run in memory."""

    __slots__ = ("index", "run")
    run: MessageRun
    index: int

    @property
    def id(self) -> bytes:
        return self.run.ids[self.index]

    @id.setter
    def id(self, msg_id: bytes) -> None:
        raise AttributeError("a run's message reads its ID from the run")

    @property
    def body(self) -> bytes:
        return self.run.bodies[self.index]

    @body.setter
    def body(self, body: bytes) -> None:
        raise AttributeError("a run's message reads its body from the run")

    def detached(self) -> Message:
        """A plain message with this one's ID, body, timestamp, attempts and deferral."""
        return self.copy()


class MessageRun:
    """An MPUB's messages as published, before any is a :class:`Message`: their IDs and
    bodies and the one timestamp they share. A topic queues the run and hands the same run
    to every channel; a channel builds its own messages from it only as it takes them
    (:meth:`messages`), so a queued message costs no object of its own. The IDs and bodies
    are tuples of bytes, which the cycle collector stops tracking the first time it sees
    them: a run queued through later collections costs them one object, not one reference
    per message (a list would be walked again by every collection of its generation).
    Immutable: every slice is a new run."""

    __slots__ = ("bodies", "ids", "timestamp")

    def __init__(self, ids: Sequence[bytes], bodies: Sequence[bytes], timestamp: int) -> None:
        self.ids = tuple(ids)  # a tuple as it is (a slice of a run's), not copied
        self.bodies = tuple(bodies)
        self.timestamp = timestamp

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())

    def messages(self, start: int = 0, stop: int | None = None) -> list[Message]:
        """New messages (attempts 0, owned by whoever takes them) for ``[start:stop]``."""
        ids, bodies = self.ids[start:stop], self.bodies[start:stop]
        return list(map(_build, ids, bodies, repeat(self.timestamp), repeat(0)))

    def slice(self, start: int, stop: int | None = None) -> MessageRun:
        return MessageRun(self.ids[start:stop], self.bodies[start:stop], self.timestamp)

    def body_bytes(self) -> int:
        return sum(map(len, self.bodies))


def message_from_bytes(data: bytes) -> Message:
    if len(data) < MESSAGE_HEADER_LENGTH:
        decode_message(data)  # raises the decoder's error
    timestamp, attempts = MESSAGE_HEADER.unpack_from(data, 0)
    msg_id = bytes(data[ID_START:MESSAGE_HEADER_LENGTH])
    return _build(msg_id, bytes(data[MESSAGE_HEADER_LENGTH:]), timestamp, attempts)


def own_copies(msgs: Iterable[Message]) -> list[Message]:
    """The messages for one channel to own (:meth:`Message.private` of each), built in one
    loop: a channel of a topic with several channels copies every message it delivers."""
    owned: list[Message] = []
    append = owned.append
    for msg in msgs:
        if msg.shared:
            clone = _new_message(Message)
            clone.id = msg.id
            clone.body = msg.body
            clone.timestamp = msg.timestamp
            clone.attempts = msg.attempts
            clone.deferred = msg.deferred
            clone.client = None
            clone.delivery_ts = 0.0
            clone.pri = 0.0
            clone.group = None
            clone.hold = None
            clone.shared = False
            msg = clone
        append(msg)
    return owned


def decode_records(records: Iterable[bytes], out: list[Message]) -> list[str]:
    """:func:`message_from_bytes` for a run of disk records, in one loop: the messages are
    appended to ``out``; the result holds the error of each record too short to decode."""
    errors: list[str] = []
    append = out.append
    unpack = MESSAGE_HEADER.unpack_from
    for data in records:
        if len(data) < MESSAGE_HEADER_LENGTH:
            errors.append(f"not enough data to decode valid message ({len(data)} bytes)")
            continue
        msg = _new_message(Message)
        msg.timestamp, msg.attempts = unpack(data, 0)
        msg.id = data[ID_START:MESSAGE_HEADER_LENGTH]
        msg.body = data[MESSAGE_HEADER_LENGTH:]
        msg.deferred = 0.0
        msg.client = None
        msg.delivery_ts = 0.0
        msg.pri = 0.0
        msg.group = None
        msg.hold = None
        msg.shared = False
        append(msg)
    return errors


def frame_runs_in_flight(
    runs: list[MessageRun],
    in_flight: dict[bytes, Message],
    group: dict[bytes, Message],
    client: Owner,
    now: float,
    deadline: float,
    frames: list[bytes],
) -> tuple[int, int]:
    """The messages of ``runs``, in order, built already in flight to ``client`` (attempts 1,
    delivered at ``now``, due at ``deadline``, in ``group``), each put in ``in_flight`` and
    its frame appended to ``frames`` (header and ID packed as one part, the body as another),
    in one loop: a channel's SUB of MPUBs' messages. An ID already in ``in_flight`` is skipped
    (the copy in flight stands for it). How many were put in flight and their bodies' bytes;
    the caller adds them to ``group`` if it is not ``in_flight`` itself."""
    put_in_flight = in_flight.setdefault
    append = frames.append
    pack = MESSAGE_FRAME_HEAD.pack
    size = sent = 0
    for run in runs:
        timestamp = run.timestamp
        ids = run.ids
        for index, msg_id, body in zip(range(len(ids)), ids, run.bodies, strict=True):
            msg = _new_message(RunMessage)
            if put_in_flight(msg_id, msg) is not msg:
                continue
            msg.run = run
            msg.index = index
            msg.timestamp = timestamp
            msg.attempts = 1
            msg.deferred = 0.0
            msg.client = client
            msg.delivery_ts = now
            msg.pri = deadline
            msg.group = group
            msg.hold = None
            msg.shared = False
            append(
                pack(MESSAGE_FRAME_OVERHEAD + len(body), FRAME_TYPE_MESSAGE, timestamp, 1, msg_id)
            )
            append(body)
            size += len(body)
            sent += 1
    return sent, size


def _build(msg_id: bytes, body: bytes, timestamp: int, attempts: int) -> Message:
    """``Message(...)`` without the ``__init__`` call: the per-message paths (a copy per
    channel, a decode per record read back from disk) make millions of them."""
    msg = _new_message(Message)
    msg.id = msg_id
    msg.body = body
    msg.timestamp = timestamp
    msg.attempts = attempts
    msg.deferred = 0.0
    msg.client = None
    msg.delivery_ts = 0.0
    msg.pri = 0.0
    msg.group = None
    msg.hold = None
    msg.shared = False
    return msg
