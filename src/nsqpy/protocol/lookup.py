"""nsqlookupd's V1 protocol as data (Go: nsqlookupd/lookup_protocol_v1.go, nsqd/lookup_peer.go).

The nsqd side opens with the magic ``"  V1"`` and sends text lines: ``IDENTIFY`` (followed by
``BE32(len)`` and a JSON body), ``REGISTER <topic> [<channel>]``, ``UNREGISTER <topic>
[<channel>]`` and ``PING``. Every reply, success or error, is *unframed*: ``BE32(len) data``
(:func:`~nsqpy.protocol.frames.encode_sized`), with no frame-type word. Every error is fatal.

Client side: :func:`identify`, :func:`register`, :func:`unregister`, :func:`ping` and
:func:`parse_identify_response`. Server side: :class:`LookupServerParser` turns the byte stream
into :class:`LookupRequest` values and :func:`parse_identify_body` decodes an IDENTIFY body with
Go's ``encoding/json`` rules.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from typing import Any

from .errors import ProtocolError
from .frames import MAGIC_V1

_BE32 = struct.Struct(">i")

IDENTIFY = "IDENTIFY"
REGISTER = "REGISTER"
UNREGISTER = "UNREGISTER"
PING = "PING"

#: The whole reply to a connection that opens with anything but ``"  V1"`` (no description).
BAD_PROTOCOL = b"E_BAD_PROTOCOL"
#: nsqd closes a peer whose IDENTIFY reply is exactly this.
E_INVALID = b"E_INVALID"
OK = b"OK"

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


# --------------------------------------------------------------------------- Go-style JSON


def _go_escape(text: str) -> str:
    """Escape what Go's encoding/json escapes beyond the JSON minimum."""
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def go_map_json(value: Mapping[str, Any]) -> bytes:
    """A Go ``map[string]interface{}`` marshalled: compact, keys sorted, HTML-escaped."""
    text = json.dumps(dict(value), separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    return _go_escape(text).encode("utf-8", "replace")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_text(text: str) -> str:
    """Go replaces invalid UTF-16 escapes (lone surrogates) with U+FFFD; so do we."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


class _Pairs(list[tuple[str, Any]]):
    """A decoded JSON object, as its (key, value) pairs in document order."""


def _go_unmarshal_object(body: bytes, fields: Mapping[str, type]) -> dict[str, Any]:
    """Decode ``body`` into the named fields the way Go's ``json.Unmarshal`` fills a struct.

    Keys match fields exactly or else case-insensitively; unknown keys are ignored; ``null``
    leaves a field unset; a value of the wrong type (a float or an out-of-range number for an
    int field, a non-string for a string field) or any non-object document is an error.
    Raises ValueError.
    """
    text = body.decode("utf-8", "replace")
    try:
        pairs = json.loads(text, object_pairs_hook=_Pairs, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("exceeded max depth") from None
    if pairs is None:
        return {}
    if not isinstance(pairs, _Pairs):
        raise ValueError("cannot unmarshal non-object")
    folded = {name.lower(): name for name in fields}
    out: dict[str, Any] = {}
    type_error = False
    for key, value in pairs:
        name = key if key in fields else folded.get(key.lower())
        if name is None or value is None:
            continue
        kind = fields[name]
        if kind is int:
            ok = type(value) is int and _INT64_MIN <= value <= _INT64_MAX
        else:
            ok = isinstance(value, str)
        if not ok:
            type_error = True  # Go keeps decoding, then reports the first type error
            continue
        out[name] = _valid_text(value) if kind is str else value
    if type_error:
        raise ValueError("cannot unmarshal value into field")
    return out


# --------------------------------------------------------------------------- client encoders


def _sized(data: bytes) -> bytes:
    return _BE32.pack(len(data)) + data


def identify(info: Mapping[str, Any]) -> bytes:
    """``IDENTIFY\\n BE32(len) json`` with keys in alphabetical order (go-nsq marshals a map)."""
    return b"IDENTIFY\n" + _sized(go_map_json(info))


def _topic_command(name: bytes, topic: str, channel: str | None) -> bytes:
    if channel:
        return b"%s %s %s\n" % (name, topic.encode(), channel.encode())
    return b"%s %s\n" % (name, topic.encode())


def register(topic: str, channel: str | None = None) -> bytes:
    """``REGISTER <topic> [<channel>]\\n`` (an empty channel is left out, as go-nsq does)."""
    return _topic_command(b"REGISTER", topic, channel)


def unregister(topic: str, channel: str | None = None) -> bytes:
    return _topic_command(b"UNREGISTER", topic, channel)


def ping() -> bytes:
    return b"PING\n"


class LookupdInfo:
    """What nsqd keeps from an nsqlookupd's IDENTIFY reply (Go: nsqd/lookup_peer.go peerInfo)."""

    __slots__ = ("broadcast_address", "http_port", "tcp_port", "version")

    def __init__(
        self, tcp_port: int = 0, http_port: int = 0, version: str = "", broadcast_address: str = ""
    ) -> None:
        self.tcp_port = tcp_port
        self.http_port = http_port
        self.version = version
        self.broadcast_address = broadcast_address

    def __repr__(self) -> str:
        return (
            f"{{TCPPort:{self.tcp_port} HTTPPort:{self.http_port} Version:{self.version} "
            f"BroadcastAddress:{self.broadcast_address}}}"
        )


_LOOKUPD_INFO_FIELDS = {"tcp_port": int, "http_port": int, "version": str, "broadcast_address": str}


def parse_identify_response(data: bytes) -> LookupdInfo:
    """Decode nsqlookupd's IDENTIFY reply; raises ValueError if it is not the JSON object."""
    return LookupdInfo(**_go_unmarshal_object(data, _LOOKUPD_INFO_FIELDS))


def decode_sized_length(header: bytes) -> int:
    """The length announced by a ``BE32(len)`` reply header."""
    (size,) = _BE32.unpack(header)
    return int(size)


# --------------------------------------------------------------------------- server side


class PeerIdentity:
    """An nsqd's IDENTIFY body as nsqlookupd understands it (Go: PeerInfo's JSON fields)."""

    __slots__ = ("broadcast_address", "hostname", "http_port", "tcp_port", "version")

    def __init__(
        self,
        broadcast_address: str = "",
        hostname: str = "",
        tcp_port: int = 0,
        http_port: int = 0,
        version: str = "",
    ) -> None:
        self.broadcast_address = broadcast_address
        self.hostname = hostname
        self.tcp_port = tcp_port
        self.http_port = http_port
        self.version = version


_IDENTITY_FIELDS = {
    "remote_address": str,  # accepted by Go's decoder, then overwritten from the socket
    "hostname": str,
    "broadcast_address": str,
    "tcp_port": int,
    "http_port": int,
    "version": str,
}


def parse_identify_body(body: bytes) -> PeerIdentity:
    """Decode and check an IDENTIFY body, raising nsqlookupd's exact errors."""
    try:
        fields = _go_unmarshal_object(body, _IDENTITY_FIELDS)
    except ValueError:
        raise ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
    fields.pop("remote_address", None)
    identity = PeerIdentity(**fields)
    if not (
        identity.broadcast_address and identity.tcp_port and identity.http_port and identity.version
    ):
        raise ProtocolError("E_BAD_BODY", "IDENTIFY missing fields")
    return identity


class LookupRequest:
    """One command line from an nsqd; IDENTIFY carries its body (or the error reading it)."""

    __slots__ = ("body", "error", "name", "params")

    def __init__(
        self,
        name: str,
        params: list[str],
        body: bytes | None = None,
        error: ProtocolError | None = None,
    ) -> None:
        self.name = name
        self.params = params
        self.body = body
        self.error = error

    def __repr__(self) -> str:
        body = None if self.body is None else len(self.body)
        return f"LookupRequest({self.name!r}, {self.params!r}, body={body}, error={self.error})"


class BadMagic(Exception):
    """The connection did not open with ``"  V1"``; reply :data:`BAD_PROTOCOL` and close."""

    def __init__(self, magic: bytes) -> None:
        super().__init__(f"bad protocol magic {magic!r}")
        self.magic = magic


# What Go's strings.TrimSpace removes: ASCII space characters and Unicode White_Space.
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)


def decode_text(raw: bytes) -> str:
    """Bytes to str without loss: invalid UTF-8 is carried by surrogate escapes."""
    return raw.decode("utf-8", "surrogateescape")


def encode_text(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def error_bytes(error: ProtocolError) -> bytes:
    """``"<CODE> <description>"`` with any raw bytes echoed from the client kept as they were."""
    return encode_text(f"{error.code} {error.desc}")


def split_line(raw: bytes) -> tuple[str, list[str]]:
    """Go: ``strings.Split(strings.TrimSpace(line), " ")`` -> (command, params)."""
    parts = decode_text(raw).strip(_GO_SPACE).split(" ")
    return parts[0], parts[1:]


_MAGIC, _LINE, _BODY_SIZE, _BODY = 0, 1, 2, 3


class LookupServerParser:
    """Incremental parser of what an nsqd sends to nsqlookupd.

    ``feed(data)`` returns the complete requests so far (raising :class:`BadMagic` if the first
    four bytes are wrong); ``eof()`` returns the request cut short by the end of the stream, if
    any, carrying the error Go reports for it. Lines have no length limit (Go reads them with
    ``ReadString``). Only the first IDENTIFY has a body read: Go refuses a second IDENTIFY before
    reading anything, and every IDENTIFY failure closes the connection.
    """

    __slots__ = ("_buf", "_identified", "_pending", "_scanned", "_size", "_state", "magic")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._state = _MAGIC
        self._identified = False
        self._pending: LookupRequest | None = None
        self._size = 0
        self._scanned = 0  # bytes of an unfinished line already searched for its newline
        self.magic: bytes | None = None

    def feed(self, data: bytes) -> list[LookupRequest]:
        buf = self._buf
        buf += data
        out: list[LookupRequest] = []
        pos = 0
        end = len(buf)
        while True:
            state = self._state
            if state == _LINE:
                nl = buf.find(b"\n", max(pos, self._scanned))
                if nl < 0:
                    self._scanned = end  # a long line in small pieces is scanned once
                    break
                name, params = split_line(bytes(buf[pos:nl]))
                pos = nl + 1
                if name == IDENTIFY and not self._identified:
                    self._identified = True
                    self._pending = LookupRequest(name, params)
                    self._state = _BODY_SIZE
                else:
                    out.append(LookupRequest(name, params))
            elif state == _BODY_SIZE:
                if end - pos < 4:
                    break
                (size,) = _BE32.unpack_from(buf, pos)
                pos += 4
                request = self._pending
                assert request is not None
                if size < 0:  # Go panics here (make with a negative length); we refuse it
                    request.error = ProtocolError("E_BAD_BODY", "IDENTIFY failed to read body")
                    out.append(request)
                    self._finish_identify()
                    pos = end  # the stream cannot be resynchronised; the server closes
                    break
                self._size = size
                self._state = _BODY
            elif state == _BODY:
                if end - pos < self._size:
                    break
                request = self._pending
                assert request is not None
                request.body = bytes(buf[pos : pos + self._size])
                pos += self._size
                out.append(request)
                self._finish_identify()
            else:  # _MAGIC
                if end - pos < 4:
                    break
                magic = bytes(buf[pos : pos + 4])
                pos += 4
                self.magic = magic
                if magic != MAGIC_V1:
                    del buf[:]
                    raise BadMagic(magic)
                self._state = _LINE
        if pos:
            del buf[:pos]
            self._scanned = max(0, self._scanned - pos)
        return out

    def _finish_identify(self) -> None:
        self._pending = None
        self._size = 0
        self._state = _LINE

    def eof(self) -> LookupRequest | None:
        """The IDENTIFY left incomplete by the end of the stream, with Go's error for it."""
        request = self._pending
        if request is None:
            return None
        if self._state == _BODY_SIZE:
            request.error = ProtocolError("E_BAD_BODY", "IDENTIFY failed to read body size")
        else:
            request.error = ProtocolError("E_BAD_BODY", "IDENTIFY failed to read body")
        self._finish_identify()
        return request

    @property
    def buffered(self) -> int:
        return len(self._buf)
