"""V2 commands: encoders for clients and an incremental parser for servers.

A command is a line ``NAME param param...\\n``; IDENTIFY, AUTH, PUB, MPUB and DPUB are followed
by ``BE32(size)`` and ``size`` bytes of body.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import ProtocolError

_BE32 = struct.Struct(">i")

IDENTIFY = b"IDENTIFY"
AUTH = b"AUTH"
SUB = b"SUB"
PUB = b"PUB"
MPUB = b"MPUB"
DPUB = b"DPUB"
RDY = b"RDY"
FIN = b"FIN"
REQ = b"REQ"
TOUCH = b"TOUCH"
CLS = b"CLS"
NOP = b"NOP"

#: Go reads command lines through a 16 KiB bufio.Reader; a longer line closes the connection.
MAX_LINE_LENGTH = 16 * 1024

#: The name of a parsed run of FIN commands (see ``CommandParser(fin_runs=True)``). Real names
#: come from splitting a line on spaces, so none can contain one.
FIN_RUN = b" FIN"
#: Consecutive ``FIN <16-byte id>\n`` lines whose ID a plain parse would keep whole (no space,
#: no newline, no trailing carriage return): anything else goes through the general parse.
_FIN_RUN_PATTERN = re.compile(rb"(?:FIN [^ \n]{15}[^ \n\r]\n)+")
_FIN_LINE = 21
#: The most IDs one FIN_RUN carries (nsqd's largest RDY): a consumer's burst of FINs is one
#: run, and a longer stream comes out as several, so a caller that bounds its work per call
#: (``feed(limit=...)``) is never handed an unbounded run (a run may take it past ``limit``).
FIN_RUN_MAX = 2500
#: The most MPUB messages one ``feed`` call splits: the rest of a huge MPUB of tiny messages
#: is split by later calls (``more`` is true meanwhile).
MPUB_SCAN_SLICE = 4096

_UINT64 = 1 << 64


# --------------------------------------------------------------------------- client encoders


def _sized(data: bytes) -> bytes:
    return _BE32.pack(len(data)) + data


def identify(settings: Mapping[str, Any]) -> bytes:
    return b"IDENTIFY\n" + _sized(json.dumps(settings, separators=(",", ":")).encode())


def auth(secret: bytes | str) -> bytes:
    return b"AUTH\n" + _sized(secret.encode() if isinstance(secret, str) else secret)


def sub(topic: str, channel: str) -> bytes:
    return f"SUB {topic} {channel}\n".encode()


def pub(topic: str, body: bytes) -> bytes:
    return f"PUB {topic}\n".encode() + _sized(body)


def dpub(topic: str, defer_ms: int, body: bytes) -> bytes:
    return f"DPUB {topic} {defer_ms}\n".encode() + _sized(body)


def mpub_body(bodies: Iterable[bytes]) -> bytes:
    """``BE32(count) {BE32(size) bytes}*``: MPUB's body without its outer size."""
    items = list(bodies)
    parts = [_BE32.pack(len(items))]
    for body in items:
        parts.append(_BE32.pack(len(body)))
        parts.append(body)
    return b"".join(parts)


def mpub(topic: str, bodies: Iterable[bytes]) -> bytes:
    return f"MPUB {topic}\n".encode() + _sized(mpub_body(bodies))


def mpub_encoded(topic: str, count: int, messages: bytes | memoryview) -> bytes:
    """MPUB from messages already framed as ``{BE32(size) bytes}*`` (one copy, no per-message
    work): for callers that hold the bodies in one buffer, e.g. an Arrow column."""
    head = f"MPUB {topic}\n".encode()
    return b"".join((head, _BE32.pack(len(messages) + 4), _BE32.pack(count), messages))


def rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def req(msg_id: bytes, timeout_ms: int) -> bytes:
    return b"REQ " + msg_id + b" %d\n" % timeout_ms


def touch(msg_id: bytes) -> bytes:
    return b"TOUCH " + msg_id + b"\n"


def cls() -> bytes:
    return b"CLS\n"


def nop() -> bytes:
    return b"NOP\n"


# --------------------------------------------------------------------------- server parser


class Command:
    """One parsed command. ``body`` is None for commands without one.

    When the announced body size is out of bounds the body is never read: ``body`` is None and
    ``bad_body_size`` holds the announced size, so the handler can report it in Go's order
    (parameter checks first, then the size).
    """

    __slots__ = ("bad_body_size", "body", "messages", "name", "params")

    def __init__(
        self,
        name: bytes,
        params: list[bytes],
        body: bytes | None = None,
        bad_body_size: int | None = None,
        messages: list[bytes] | None = None,
    ) -> None:
        self.name = name
        self.params = params
        self.body = body
        self.bad_body_size = bad_body_size
        #: MPUB: the message bodies, split while the body arrived (None when the body stopped
        #: at a bad count or size, for the handler to report from ``body``)
        self.messages = messages

    def __repr__(self) -> str:
        body = None if self.body is None else len(self.body)
        return f"Command({self.name!r}, {self.params!r}, body={body}, bad={self.bad_body_size})"


class LineTooLong(Exception):
    """The peer sent a command line longer than Go's read buffer; Go just closes.

    ``commands`` holds the complete commands that preceded the long line in the same feed: Go
    executes those before it fails to read the next line.
    """

    def __init__(self, commands: list[Command] | None = None) -> None:
        super().__init__("failed to read command - line too long")
        self.commands: list[Command] = commands or []


def _whole_fin_lines(buf: bytearray, pos: int, end: int, most: int) -> list[bytes] | None:
    """The IDs when every whole 21-byte line from ``pos`` on (``most`` lines at most) is a
    ``FIN <id>`` line that :data:`_FIN_RUN_PATTERN` accepts (what follows is less than a line,
    or more lines), else None. A burst of FINs, as a consumer flushes them, is checked and split
    by a few C-level passes instead of the regex and a slice per line."""
    count = min((end - pos) // _FIN_LINE, most)
    if not count:
        return None
    run = bytes(buf[pos : pos + count * _FIN_LINE])
    # exactly one space and one newline per line, each in its place: the IDs hold neither
    if run.count(b"\n") != count or run.count(b" ") != count:
        return None
    if run[20::_FIN_LINE] != b"\n" * count or run[3::_FIN_LINE] != b" " * count:
        return None
    if run[0::_FIN_LINE] != b"F" * count or run[1::_FIN_LINE] != b"I" * count:
        return None
    if run[2::_FIN_LINE] != b"N" * count or b"\r" in run[19::_FIN_LINE]:
        return None
    return run[4:-1].split(b"\nFIN ")


class _MpubScan:
    """How far the split of an MPUB body in transit got: the bodies so far, the offset (from
    the body's start, after its size) of the next message, the messages still to come."""

    __slots__ = ("bodies", "left", "offset")

    def __init__(self, count: int) -> None:
        self.bodies: list[bytes] = []
        self.left = count
        self.offset = 4


class CommandParser:
    """Turns a byte stream into :class:`Command` objects.

    ``max_msg_size`` bounds PUB and DPUB bodies, ``max_body_size`` the others. After a command
    with ``bad_body_size`` the stream cannot be resynchronised; callers close the connection.

    With ``fin_runs`` consecutive well-formed ``FIN <id>`` lines come out as one command named
    :data:`FIN_RUN` whose params are the IDs in order: a consumer FINs every message, and
    nsqd handles a whole run in one pass (one regex match instead of a split per line).

    ``feed(data, limit)`` parses at most ``limit`` units of work (a command, or one ID of a
    FIN run) and at most :data:`MPUB_SCAN_SLICE` MPUB messages; ``more`` then tells that the
    buffer may hold more, for ``feed(b"", limit)`` on a later call. Every byte is looked at
    once, however the stream is split: an MPUB body in transit is split as it arrives.
    """

    __slots__ = ("_buf", "_fin_runs", "_limits", "_max_msg_size", "_mpub", "_pending", "more")

    def __init__(self, max_msg_size: int, max_body_size: int, fin_runs: bool = False) -> None:
        self._fin_runs = fin_runs
        self._buf = bytearray()
        self._pending: tuple[bytes, list[bytes]] | None = None
        self._mpub: _MpubScan | None = None
        self._max_msg_size = max_msg_size
        self._limits = {
            PUB: max_msg_size,
            DPUB: max_msg_size,
            MPUB: max_body_size,
            IDENTIFY: max_body_size,
            AUTH: max_body_size,
        }
        self.more = False

    def set_limits(self, max_msg_size: int, max_body_size: int) -> None:
        self._max_msg_size = max_msg_size
        self._limits.update({PUB: max_msg_size, DPUB: max_msg_size})
        self._limits.update({MPUB: max_body_size, IDENTIFY: max_body_size, AUTH: max_body_size})

    @property
    def pending(self) -> tuple[bytes, list[bytes]] | None:
        """The line of a body command whose body has not fully arrived yet."""
        return self._pending

    def truncated(self) -> tuple[bytes, list[bytes], bytes | None] | None:
        """At end of stream: the unfinished body command as (name, params, partial body),
        the body None when not even its 4-byte size arrived; None if no command was cut."""
        if self._pending is None:
            return None
        name, params = self._pending
        if len(self._buf) < 4:
            return name, params, None
        return name, params, bytes(self._buf[4:])

    def feed(self, data: bytes, limit: int = 0) -> list[Command]:
        buf = self._buf
        if data:
            buf += data
        commands: list[Command] = []
        pos = 0
        end = len(buf)
        limits = self._limits
        fin_runs = self._fin_runs
        budget = limit or end + 1  # every command or FIN ID takes at least one byte
        self.more = False
        while True:
            if budget <= 0:
                self.more = pos < end
                break
            if self._pending is not None:
                name, params = self._pending
                if end - pos < 4:
                    break
                (size,) = _BE32.unpack_from(buf, pos)
                if size <= 0 or size > limits[name]:
                    self._pending = None
                    commands.append(Command(name, params, None, size))
                    pos = end  # unrecoverable: the caller closes the connection
                    break
                if name == MPUB:
                    mpub = self._mpub_command(params, buf, pos, end)
                    if mpub is None:
                        break
                    command, size = mpub
                    pos += 4 + size
                    self._pending = None
                    commands.append(command)
                    budget -= 1
                    continue
                if end - pos - 4 < size:
                    break
                body = bytes(buf[pos + 4 : pos + 4 + size])
                pos += 4 + size
                self._pending = None
                commands.append(Command(name, params, body))
                budget -= 1
                continue
            if fin_runs and buf.startswith(b"FIN ", pos):
                most = FIN_RUN_MAX
                ids = _whole_fin_lines(buf, pos, end, most)
                if ids is not None:
                    commands.append(Command(FIN_RUN, ids))
                    pos += len(ids) * _FIN_LINE
                    budget -= len(ids)
                    continue
                match = _FIN_RUN_PATTERN.match(buf, pos, pos + most * _FIN_LINE)
                if match is not None:
                    run = bytes(buf[pos : match.end()])
                    ids = [run[i : i + 16] for i in range(4, len(run), _FIN_LINE)]
                    commands.append(Command(FIN_RUN, ids))
                    pos = match.end()
                    budget -= len(ids)
                    continue
            # Go's bufio.ReadSlice fails once MAX_LINE_LENGTH bytes hold no newline
            nl = buf.find(b"\n", pos, pos + MAX_LINE_LENGTH)
            if nl < 0:
                if end - pos >= MAX_LINE_LENGTH:
                    del buf[:pos]
                    raise LineTooLong(commands)
                break
            line_end = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl  # strip a trailing \r
            parts = bytes(buf[pos:line_end]).split(b" ")
            pos = nl + 1
            name = parts[0]
            if name in limits:
                self._pending = (name, parts[1:])
            else:
                commands.append(Command(name, parts[1:]))
                budget -= 1
        if pos:
            del buf[:pos]
        return commands

    def _mpub_command(
        self, params: list[bytes], buf: bytearray, start: int, end: int
    ) -> tuple[Command, int] | None:
        """The MPUB whose body (after its 4-byte size) starts at ``start + 4`` and its size as
        Go's streaming read takes it: the count, then that many size-prefixed messages, split
        as they arrive. At the first bad count or size the body stops there and goes whole
        into the command for the handler to report; None while more bytes are needed."""
        first = start + 4
        scan = self._mpub
        if scan is None:
            if end - first < 4:
                return None
            (count,) = _BE32.unpack_from(buf, first)
            if count <= 0 or count > (self._limits[MPUB] - 4) // 5:
                return Command(MPUB, params, bytes(buf[first : first + 4])), 4
            (announced,) = _BE32.unpack_from(buf, start)
            if count <= MPUB_SCAN_SLICE and end - first >= announced:
                whole = self._whole_mpub(params, bytes(buf[first : first + announced]), count)
                if whole is not None:
                    return whole
            scan = self._mpub = _MpubScan(count)
        pos = first + scan.offset
        left = scan.left
        append = scan.bodies.append
        unpack = _BE32.unpack_from
        max_size = self._max_msg_size
        stop = max(left - MPUB_SCAN_SLICE, 0)
        while left > stop:
            if end - pos < 4:
                break
            (size,) = unpack(buf, pos)
            if size <= 0 or size > max_size:
                self._mpub = None
                return Command(MPUB, params, bytes(buf[first : pos + 4])), pos + 4 - first
            if end - pos - 4 < size:
                break
            pos += 4
            append(bytes(buf[pos : pos + size]))
            pos += size
            left -= 1
        scan.offset = pos - first
        scan.left = left
        if left:
            if left == stop:
                self.more = True  # the slice is split; the rest of what arrived waits
            return None
        self._mpub = None
        body = bytes(buf[first : first + scan.offset])
        return Command(MPUB, params, body, None, scan.bodies), scan.offset

    def _whole_mpub(
        self, params: list[bytes], body: bytes, count: int
    ) -> tuple[Command, int] | None:
        """:meth:`_mpub_command` for an MPUB whose announced body has arrived whole (the
        common case): split from one immutable copy, each message one slice of it. None if
        the messages run past the announced size: the streaming split then reads on, as Go
        reads the messages and not the announced size."""
        pos = 4
        end = len(body)
        bodies: list[bytes] = []
        append = bodies.append
        unpack = _BE32.unpack_from
        max_size = self._max_msg_size
        for _ in range(count):
            if end - pos < 4:
                return None
            (size,) = unpack(body, pos)
            if size <= 0 or size > max_size:
                return Command(MPUB, params, body[: pos + 4]), pos + 4
            pos += 4
            if end - pos < size:
                return None
            append(body[pos : pos + size])
            pos += size
        if pos < end:
            body = body[:pos]
        return Command(MPUB, params, body, None, bodies), pos


def parse_mpub_body(body: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """Split an MPUB body into message bodies, raising Go's exact errors."""
    length = len(body)
    if length < 4:
        raise ProtocolError("E_BAD_BODY", "MPUB failed to read message count")
    (count,) = _BE32.unpack_from(body, 0)
    max_messages = (max_body_size - 4) // 5
    if count <= 0 or count > max_messages:
        raise ProtocolError("E_BAD_BODY", f"MPUB invalid message count {count}")
    messages: list[bytes] = []
    pos = 4
    unpack = _BE32.unpack_from
    for i in range(count):
        if length - pos < 4:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
        (size,) = unpack(body, pos)
        if size <= 0:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
        if size > max_msg_size:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg_size}")
        pos += 4
        if length - pos < size:
            raise ProtocolError("E_BAD_MESSAGE", "MPUB failed to read message body")
        messages.append(body[pos : pos + size])
        pos += size
    return messages


def parse_base10(raw: bytes) -> int | None:
    """Go's ByteToBase10: ASCII digits only (empty is 0); anything else is None.

    Go accumulates in a uint64 that silently wraps, so the result is taken modulo 2**64; Go
    callers then convert it to int64 (``RDY 18446744073709551615`` reports count -1).
    """
    if raw and not raw.isdigit():
        return None
    # isdigit() accepts only ASCII digits for bytes
    return int(raw) % _UINT64 if raw else 0


def as_int64(value: int) -> int:
    """Go's ``int64(u)`` for a uint64: two's complement wrap."""
    value %= 1 << 64
    return value - (1 << 64) if value >= 1 << 63 else value
