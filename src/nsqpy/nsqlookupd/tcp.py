"""nsqlookupd's TCP side: the V1 protocol nsqd speaks (Go: nsqlookupd/tcp.go,
nsqlookupd/lookup_protocol_v1.go).

One :class:`LookupProtocolV1` per connection turns bytes into requests with the sans-IO
:class:`~nsqpy.protocol.lookup.LookupServerParser`, applies them to the registration database
and writes unframed ``BE32(len) data`` replies. Every error is fatal: the reply is written, then
the connection is closed. When the connection ends, the peer stops being a producer anywhere.

Fairness: all connections share one event loop, so no connection may keep it for long. Input is
parsed :data:`FEED_SIZE` bytes at a time and a loop turn runs a connection's commands for at
most :data:`TURN_BUDGET` seconds (the clock is read every :data:`CHECK_EVERY` commands). What is
left waits, with the socket's reading paused, for a later turn (``call_soon``), so the other
connections' I/O is served in between; replies keep their order. A peer that does not read its
replies is not read from either: once the transport holds :data:`WRITE_BUFFER_HIGH` unsent
bytes, commands and reading stop until it has drained.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, cast

from .. import NSQ_VERSION
from ..internal import lg
from ..internal.durations import format_duration
from ..internal.net import format_address
from ..protocol.errors import ProtocolError
from ..protocol.frames import MAGIC_V1, encode_sized
from ..protocol.lookup import (
    BAD_PROTOCOL,
    IDENTIFY,
    OK,
    PING,
    REGISTER,
    UNREGISTER,
    BadMagic,
    LookupRequest,
    LookupServerParser,
    error_bytes,
    go_map_json,
    parse_identify_body,
)
from ..protocol.names import is_ephemeral, is_valid_channel_name, is_valid_topic_name
from .registration_db import PeerInfo, Producer, Registration

if TYPE_CHECKING:
    from .nsqlookupd import NSQLookupd

CLIENT_REGISTRATION: Registration = ("client", "", "")

#: Bytes of input handed to the parser at once: a read can be 256 KiB, whose parsing alone
#: would hold the loop for milliseconds.
FEED_SIZE = 4096
#: How long one connection's commands may hold the event loop in one turn, in seconds.
TURN_BUDGET = 0.0005
#: Commands run between two readings of the clock.
CHECK_EVERY = 32
#: Unsent reply bytes at which a connection stops being read (asyncio's default), and the
#: level it must drain to before reading resumes.
WRITE_BUFFER_HIGH = 64 * 1024
WRITE_BUFFER_LOW = 16 * 1024


def _topic_and_channel(command: str, params: list[str]) -> tuple[str, str]:
    """Go's ``getTopicChan``: the topic and the (possibly empty) channel, validated."""
    if not params:
        raise ProtocolError("E_INVALID", f"{command} insufficient number of params")
    topic = params[0]
    channel = params[1] if len(params) >= 2 else ""
    if not is_valid_topic_name(topic):
        raise ProtocolError("E_BAD_TOPIC", f"{command} topic name '{topic}' is not valid")
    if channel and not is_valid_channel_name(channel):
        raise ProtocolError("E_BAD_CHANNEL", f"{command} channel name '{channel}' is not valid")
    return topic, channel


def _printable(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


class LookupProtocolV1(asyncio.Protocol):
    """One nsqd connection."""

    __slots__ = (
        "_addr",
        "_closing",
        "_eof",
        "_inbox",
        "_inbox_pos",
        "_lookupd",
        "_magic_logged",
        "_next_request",
        "_parser",
        "_peer",
        "_reading_paused",
        "_requests",
        "_scheduled",
        "_transport",
        "_writing_paused",
    )

    def __init__(self, lookupd: NSQLookupd) -> None:
        self._lookupd = lookupd
        self._parser = LookupServerParser()
        self._transport: asyncio.Transport | None = None
        self._peer: PeerInfo | None = None
        self._addr = ""
        self._closing = False
        self._magic_logged = False
        # Input received but not parsed yet, from _inbox_pos on.
        self._inbox = b""
        self._inbox_pos = 0
        # Parsed requests not run yet, from _next_request on.
        self._requests: list[LookupRequest] = []
        self._next_request = 0
        self._eof = False  # the peer has shut down its side; close once the backlog is done
        self._scheduled = False  # a later turn of _work is queued with call_soon
        self._reading_paused = False
        self._writing_paused = False

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        self._addr = format_address(transport.get_extra_info("peername"))
        self._lookupd.tcp_clients.add(self)
        self._lookupd.logger.info(f"TCP: new client({self._addr})")

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._inbox_pos < len(self._inbox):  # only if bytes come while reading is paused
            self._inbox = self._inbox[self._inbox_pos :] + data
        else:
            self._inbox = data
        self._inbox_pos = 0
        if not self._scheduled:
            self._work()

    def eof_received(self) -> bool:
        if self._closing:
            return False
        self._eof = True
        if self._scheduled or self._writing_paused:
            return True  # half-closed until the backlog is done; _work closes then
        self._finish_at_eof()
        return False  # close the connection: Go's read loop ends at EOF

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        lookupd = self._lookupd
        lookupd.tcp_clients.discard(self)
        if self._parser.magic != MAGIC_V1:
            return  # never got past the magic: Go's read loop never started
        lookupd.logger.info(f"PROTOCOL(V1): [{self._addr}] exiting ioloop")
        peer = self._peer
        if peer is None:
            return
        db = lookupd.db
        for registration in db.lookup_registrations(peer.id):
            removed, _ = db.remove_producer(registration, peer.id)
            if removed:
                self._log_db("UNREGISTER", registration)

    def pause_writing(self) -> None:
        # A peer that sends commands without reading the replies: run none of its commands
        # and read nothing more from it until the replies have drained.
        self._writing_paused = True
        self._set_reading(False)

    def resume_writing(self) -> None:
        self._writing_paused = False
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_work)

    # ------------------------------------------------------------------ bounded work per turn

    def _scheduled_work(self) -> None:
        self._scheduled = False
        if not self._closing:
            self._work()

    def _work(self) -> None:
        """Run what is buffered until it is done, the turn's budget is spent or the peer stops
        reading; then read again, or continue in a later turn with reading paused."""
        deadline = time.monotonic() + TURN_BUDGET
        done = 0
        while not self._writing_paused:
            if self._next_request < len(self._requests):
                request = self._requests[self._next_request]
                self._next_request += 1
                if not self._execute(request):
                    return
                done += 1
                if done % CHECK_EVERY == 0 and time.monotonic() >= deadline:
                    self._continue_later()
                    return
            elif self._inbox_pos < len(self._inbox):
                if not self._parse_next_piece():
                    return
            else:
                self._idle()
                return
        self._set_reading(False)  # resume_writing schedules the rest

    def _parse_next_piece(self) -> bool:
        """Parse the next :data:`FEED_SIZE` bytes of input; False once the connection closes."""
        start = self._inbox_pos
        piece = self._inbox[start : start + FEED_SIZE]
        self._inbox_pos = start + len(piece)
        try:
            self._requests = self._parser.feed(piece)
        except BadMagic as exc:
            self._bad_magic(exc.magic)
            return False
        self._next_request = 0
        if not self._magic_logged and self._parser.magic is not None:
            self._magic_logged = True
            magic = _printable(self._parser.magic)
            self._lookupd.logger.info(f"CLIENT({self._addr}): desired protocol magic '{magic}'")
        return True

    def _continue_later(self) -> None:
        self._set_reading(False)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_work)

    def _idle(self) -> None:
        """Everything received has been run: read again, or end if the peer has."""
        self._inbox = b""
        self._inbox_pos = 0
        self._requests = []
        self._next_request = 0
        if self._eof:
            self._finish_at_eof()
            self.close()
        else:
            self._set_reading(True)

    def _finish_at_eof(self) -> None:
        request = self._parser.eof()
        if request is not None and not self._closing:
            self._execute(request)

    def _set_reading(self, reading: bool) -> None:
        transport = self._transport
        paused = not reading
        if transport is None or transport.is_closing() or paused == self._reading_paused:
            return
        self._reading_paused = paused
        if reading:
            transport.resume_reading()
        else:
            transport.pause_reading()

    @property
    def transport(self) -> asyncio.Transport | None:
        """The connection's transport (None before it is made): its unsent reply bytes and
        whether it is being read show how the peer is throttled."""
        return self._transport

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def _bad_magic(self, magic: bytes) -> None:
        logger = self._lookupd.logger
        logger.info(f"CLIENT({self._addr}): desired protocol magic '{_printable(magic)}'")
        assert self._transport is not None
        self._transport.write(encode_sized(BAD_PROTOCOL))
        self.close()
        logger.error(f"client({self._addr}) bad protocol magic '{_printable(magic)}'")

    def _execute(self, request: LookupRequest) -> bool:
        """Run one request and write its reply; False once the connection is closing."""
        transport = self._transport
        assert transport is not None
        try:
            response = self._exec(request)
        except ProtocolError as exc:
            self._lookupd.logger.error(f"[{self._addr}] - {exc.code} {exc.desc}")
            transport.write(encode_sized(error_bytes(exc)))
            self.close()  # every nsqlookupd error is fatal
            return False
        transport.write(encode_sized(response))
        return True

    def _exec(self, request: LookupRequest) -> bytes:
        name = request.name
        if name == PING:
            return self.PING()
        if name == IDENTIFY:
            return self.IDENTIFY(request)
        if name == REGISTER:
            return self.REGISTER(request.params)
        if name == UNREGISTER:
            return self.UNREGISTER(request.params)
        raise ProtocolError("E_INVALID", f"invalid command {name}")

    def _log_db(self, action: str, registration: Registration) -> None:
        category, key, subkey = registration
        self._lookupd.logger.info(
            f"DB: client({self._addr}) {action} category:{category} key:{key} subkey:{subkey}"
        )

    # ------------------------------------------------------------------ commands (Go's names)

    def PING(self) -> bytes:
        peer = self._peer
        if peer is not None:  # a PING may come before IDENTIFY: then it only answers OK
            now = self._lookupd.clock()
            if self._lookupd.logger.enabled(lg.INFO):
                since = format_duration(now - peer.last_update)
                self._lookupd.logger.info(f"CLIENT({peer.id}): pinged (last ping {since})")
            peer.last_update = now
        return OK

    def IDENTIFY(self, request: LookupRequest) -> bytes:
        if self._peer is not None:
            raise ProtocolError("E_INVALID", "cannot IDENTIFY again")
        if request.error is not None:
            raise request.error
        assert request.body is not None
        identity = parse_identify_body(request.body)
        lookupd = self._lookupd
        peer = PeerInfo(
            id=self._addr,
            remote_address=self._addr,
            hostname=identity.hostname,
            broadcast_address=identity.broadcast_address,
            tcp_port=identity.tcp_port,
            http_port=identity.http_port,
            version=identity.version,
            last_update=lookupd.clock(),
        )
        lookupd.logger.info(
            f"CLIENT({self._addr}): IDENTIFY Address:{peer.broadcast_address} "
            f"TCP:{peer.tcp_port} HTTP:{peer.http_port} Version:{peer.version}"
        )
        self._peer = peer
        if lookupd.db.add_producer(CLIENT_REGISTRATION, Producer(peer)):
            self._log_db("REGISTER", CLIENT_REGISTRATION)
        return go_map_json(
            {
                "tcp_port": lookupd.real_tcp_address[1],
                "http_port": lookupd.real_http_address[1],
                "version": NSQ_VERSION,
                "broadcast_address": lookupd.options.broadcast_address,
                "hostname": lookupd.hostname,
            }
        )

    def REGISTER(self, params: list[str]) -> bytes:
        peer = self._peer
        if peer is None:
            raise ProtocolError("E_INVALID", "client must IDENTIFY")
        topic, channel = _topic_and_channel(REGISTER, params)
        db = self._lookupd.db
        if channel:
            registration: Registration = ("channel", topic, channel)
            if db.add_producer(registration, Producer(peer)):
                self._log_db("REGISTER", registration)
        registration = ("topic", topic, "")
        if db.add_producer(registration, Producer(peer)):
            self._log_db("REGISTER", registration)
        return OK

    def UNREGISTER(self, params: list[str]) -> bytes:
        peer = self._peer
        if peer is None:
            raise ProtocolError("E_INVALID", "client must IDENTIFY")
        topic, channel = _topic_and_channel(UNREGISTER, params)
        db = self._lookupd.db
        if channel:
            registration: Registration = ("channel", topic, channel)
            removed, left = db.remove_producer(registration, peer.id)
            if removed:
                self._log_db("UNREGISTER", registration)
            # an ephemeral channel goes away with its last producer
            if left == 0 and is_ephemeral(channel):
                db.remove_registration(registration)
            return OK
        # A topic unregistration: nsqd unregisters its channels first, so anything left over
        # here is unexpected, hence the warning.
        for registration in db.peer_channels(peer.id, topic):
            removed, _ = db.remove_producer(registration, peer.id)
            if removed:
                self._lookupd.logger.warn(
                    f"client({self._addr}) unexpected UNREGISTER category:channel "
                    f"key:{topic} subkey:{registration[2]}"
                )
        registration = ("topic", topic, "")
        removed, left = db.remove_producer(registration, peer.id)
        if removed:
            self._log_db("UNREGISTER", registration)
        if left == 0 and is_ephemeral(topic):
            db.remove_registration(registration)
        return OK
