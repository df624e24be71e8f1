"""One TCP client connection: the asyncio protocol, its V2 state, output buffering, heartbeats.

Delivery writes message frames into an output buffer that is flushed, as Go's message pump
does: when the client stops being ready, when the buffer is full, on the output-buffer timer,
and together with any response or error frame. Everything a single ``data_received`` produces
for this client leaves in one ``transport.write``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from ..protocol import (
    FRAME_HEARTBEAT,
    MAGIC_V2,
    CommandParser,
    LineTooLong,
    ProtocolError,
    encode_error,
    encode_response,
)
from ..protocol.commands import Command
from ..protocol.compression import (
    CompressionError,
    DeflateReader,
    DeflateWriter,
    SnappyFrameReader,
    SnappyFrameWriter,
)
from .errors import NeedsReauth
from .tls import TLSError, TLSSession

if TYPE_CHECKING:
    from OpenSSL import SSL

    from .auth import AuthState
    from .channel import Channel
    from .consumer import Consumer
    from .message import Message
    from .nsqd import NSQD

#: A message frame's size field counts the frame type, timestamp, attempts and ID.
STATE_INIT, STATE_DISCONNECTED, STATE_CONNECTED, STATE_SUBSCRIBED, STATE_CLOSING = range(5)
DEFAULT_BUFFER_SIZE = 16 * 1024
_BAD_PROTOCOL = encode_error(b"E_BAD_PROTOCOL")
#: Plain bytes taken out of the decompressor at a time: a compression bomb inflates a slice
#: per step, never all at once.
INFLATE_SLICE = 64 * 1024
#: Seconds of one connection's input run per loop turn, checked after each step of at most
#: TURN_STEP commands (a FIN run's IDs count one each) or one MPUB slice.
TURN_BUDGET = 0.002
TURN_STEP = 512
#: Unsent output past which the connection's reading pauses until the peer reads (Go's
#: connection blocks on its socket): a client that never reads cannot grow nsqd's memory.
OUTPUT_HIGH_WATER = 4 * 1024 * 1024
OUTPUT_LOW_WATER = 1024 * 1024
TLS_HANDSHAKE_TIMEOUT = 5.0


class ClientV2(asyncio.Protocol):
    """One consumer or producer connection; to its channel, a :class:`Consumer`."""

    def __init__(self, nsqd: NSQD, client_id: int) -> None:
        opts = nsqd.options
        self.nsqd = nsqd
        self.id = client_id
        self.loop = nsqd.loop
        self.transport: asyncio.Transport | None = None
        self.remote_address = ""
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.state = STATE_INIT
        self.channel: Channel | None = None
        self.ready_count = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        # wire bytes (after TLS and compression), one add per read or write call, never per
        # message; nsqd folds them into its totals when the connection goes (/metrics)
        self.bytes_received = 0
        self.bytes_sent = 0
        self.connect_ts = int(time.time())
        self.sample_rate = 0
        self.msg_timeout = opts.msg_timeout
        self.heartbeat_interval = opts.client_timeout / 2
        self.output_buffer_size = DEFAULT_BUFFER_SIZE
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.auth_state: AuthState | None = None
        self.auth_secret = ""
        self.tls_version = ""
        self.tls_cipher = ""
        self.tls_common_name = ""
        self._tls_session: TLSSession | None = None
        self._tls_backlog: list[bytes] = []
        self._pending_compression: tuple[str, int] = ("", 0)
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._compressor: SnappyFrameWriter | DeflateWriter | None = None
        self._decompressor: SnappyFrameReader | DeflateReader | None = None
        self._suspended = False  # an AUTH or a sliced MPUB is under way
        self._stash: list[Command] = []  # the commands parsed after it
        self._input: deque[bytes] = deque()  # received, not yet parsed
        self._backlog = False  # this turn's budget is spent: the rest runs on a later turn
        self._output_full = False  # the peer does not read: its input waits
        self._reading = True
        self._line_too_long = False
        self._eof = False
        #: when this connection's current turn ends (perf_counter): a handler whose work
        #: outlasts it continues on later turns
        self.turn_deadline = 0.0
        self._task: asyncio.Task[None] | None = None
        self._parser = CommandParser(opts.max_msg_size, opts.max_body_size, fin_runs=True)
        self._magic = b""
        self._out: list[bytes] = []
        self._out_len = 0
        self._in_batch = False
        self._response_at: int | None = None
        self._must_flush = False
        self._flush_pending = False
        self._flush_timer: asyncio.TimerHandle | None = None
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._closed = False

    def __repr__(self) -> str:
        return self.remote_address

    # ------------------------------------------------------------------ asyncio protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            host = peer[0]
            self.remote_address = f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
            self.client_id = self.hostname = host
        else:  # unix socket
            self.remote_address = "@"
        self._last_read = self.nsqd.now()
        self.transport.set_write_buffer_limits(OUTPUT_HIGH_WATER, OUTPUT_LOW_WATER)
        self.nsqd.logger.info(f"TCP: new client({self.remote_address})")
        self._schedule_heartbeat()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.state = STATE_CLOSING
        for handle in (self._heartbeat_timer, self._flush_timer, self._handshake_timer):
            if handle is not None:
                handle.cancel()
        if self._task is not None:
            self._task.cancel()
        self._out.clear()
        self._input.clear()
        self.nsqd.logger.info(f"PROTOCOL(V2): [{self.remote_address}] exiting ioloop")
        if self.channel is not None:
            self.channel.remove_client(self)
        self.nsqd.remove_client(self)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self.bytes_received += len(data)
        self._last_read = self.nsqd.now()
        if self._tls_session is not None:
            data = self._receive_tls(data)
        if not data:
            return
        self._input.append(data)
        if not self._input_waits():
            self._run_input()

    # ------------------------------------------------------------------ input, a turn at a time

    def _input_waits(self) -> bool:
        """Whether this connection's input must wait: an AUTH or a sliced MPUB is under way,
        its turn's budget is spent, or it does not read what it was sent."""
        return self._suspended or self._backlog or self._output_full

    def _update_reading(self) -> None:
        """Read from the socket only while the input can be run now: what is not read stays
        in the kernel's buffers and slows the peer down, as a blocked Go connection does."""
        reading = not self._input_waits()
        if reading != self._reading and not self._closed and self.transport is not None:
            self._reading = reading
            if reading:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def _run_input(self) -> None:
        """Run the input received so far for at most one turn's budget; the rest waits for a
        later loop turn, the socket not read meanwhile, so every other connection is served
        in between (one event loop serves them all)."""
        deadline = self.turn_deadline = time.perf_counter() + TURN_BUDGET
        while True:
            commands = self._next_commands()
            if commands is None:
                break
            if commands:
                self._run_batch(commands)
            if self._closed:
                return
            if self._line_too_long:
                self.nsqd.logger.error(
                    f"[{self.remote_address}] - failed to read command - bufio: buffer full"
                )
                self.close()
                return
            if self._suspended or self._output_full:
                self._update_reading()  # resumed by the AUTH's or MPUB's end, or the drain
                return
            if time.perf_counter() >= deadline:
                self._backlog = True
                self._update_reading()
                self.loop.call_soon(self._next_turn)
                return
        if self._eof:
            self._end_of_input()
            self.close()
            return
        if self._parser.pending is not None:
            self._check_pending_header()
        self._update_reading()

    def _next_turn(self) -> None:
        self._backlog = False
        if not self._closed and not self._input_waits():
            self._run_input()

    def _next_commands(self) -> list[Command] | None:
        """The next piece of parsed input: what the parser still holds, then what the
        decompressor still holds, then the next received chunk; None once all is run."""
        if self._parser.more:
            return self._parse(b"")
        decompressor = self._decompressor
        try:
            if decompressor is not None and decompressor.pending:
                return self._parse(decompressor.decompress(b"", INFLATE_SLICE))
            if not self._input:
                return None
            data = self._input.popleft()
            if decompressor is not None:
                data = decompressor.decompress(data, INFLATE_SLICE)
        except CompressionError as exc:
            self.nsqd.logger.error(f"[{self.remote_address}] - {exc}")
            self.close()
            return []
        return self._parse(data)

    def _parse(self, data: bytes) -> list[Command]:
        if len(self._magic) < 4:
            data = self._take_magic(data)
            if not data:
                return []
        try:
            return self._parser.feed(data, TURN_STEP)
        except LineTooLong as exc:  # Go runs the commands before the long line, then fails
            self._line_too_long = True
            return exc.commands

    def _take_magic(self, data: bytes) -> bytes:
        need = 4 - len(self._magic)
        self._magic += data[:need]
        if len(self._magic) < 4:
            return b""
        if self._magic != MAGIC_V2:
            self.nsqd.logger.error(
                f"client({self.remote_address}) bad protocol magic '{self._magic!r}'"
            )
            self._write(_BAD_PROTOCOL)
            self.close()
            return b""
        self.nsqd.logger.info(f"CLIENT({self.remote_address}): desired protocol magic '  V2'")
        return data[need:]

    def _run_batch(self, commands: list[Command]) -> None:
        with self.batch():
            self._exec_all(commands)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Frames sent inside leave together at its end, in one write."""
        self._in_batch = True
        try:
            yield
        finally:
            self._in_batch = False
            self._response_at = None
        if self._must_flush and not self._closed:
            self.flush()

    @property
    def closed(self) -> bool:
        return self._closed

    def eof_received(self) -> bool:
        """The peer finished sending: once everything it sent has run, report a command cut
        short, as Go does, then close."""
        if self._input_waits() or self._input or self._parser.more:
            self._eof = True
            return True  # kept open (for writing) until the input has run
        self._end_of_input()
        return False

    def _end_of_input(self) -> None:
        truncated = self._parser.truncated() if len(self._magic) == 4 else None
        if truncated is not None and not self._closed:
            err = self.nsqd.protocol.truncated_error(self, *truncated)
            if err is not None:
                self.send_error(err)

    def _exec_all(self, commands: list[Command]) -> None:
        handlers = self.nsqd.protocol.handlers
        for index, command in enumerate(commands):
            self.begin_command()
            try:
                handler = handlers.get(command.name)
                if handler is None:
                    self.nsqd.protocol.check_tls(self, command.name)
                    raise ProtocolError(
                        "E_INVALID", f"invalid command {command.name.decode(errors='replace')}"
                    )
                response = handler(self, command)
                if isinstance(response, bytes):
                    self.send_response(response)
                elif response is not None:  # AUTH: wait for the auth server, in order
                    self._suspend(response, commands[index + 1 :])
                    return
            except NeedsReauth:
                self._suspend(self.nsqd.auth.reauthenticate(self), commands[index:])
                return
            except ProtocolError as err:
                self.send_error(err)
                if err.fatal:
                    return
            if self._closed:
                return

    # ------------------------------------------------------------------ asynchronous commands

    def begin_command(self) -> None:
        """A command's response goes before any message the command itself delivered to this
        client (a PUB to a topic it is subscribed to): Go answers before its message pump."""
        self._response_at = len(self._out)

    def _suspend(self, pending: Awaitable[bytes | None], rest: list[Command]) -> None:
        """Hold the rest of the stream until ``pending`` (an auth query, a sliced MPUB) has
        answered."""
        self._suspended = True
        self._stash = rest
        self._update_reading()
        self._task = self.loop.create_task(self._resume_after(pending))

    async def _resume_after(self, pending: Awaitable[bytes | None]) -> None:
        try:
            response = await pending
        except ProtocolError as err:
            response = None
            if self._closed:
                return
            self.send_error(err)
            if err.fatal:
                return
        if self._closed:
            return
        if response:
            self.send_response(response)
        self._suspended = False
        rest, self._stash = self._stash, []
        self.turn_deadline = time.perf_counter() + TURN_BUDGET
        self._run_batch(rest)
        if not self._closed and not self._input_waits():
            self._run_input()

    def _check_pending_header(self) -> None:
        """Report errors Go raises before it reads a body, without waiting for the body."""
        pending = self._parser.pending
        assert pending is not None
        err = self.nsqd.protocol.check_before_body(self, pending[0], pending[1])
        if err is not None:
            self.send_error(err)

    def pause_writing(self) -> None:
        self._output_full = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._output_full = False
        if not self._closed and not self._input_waits():
            self._run_input()

    # ------------------------------------------------------------------ output

    def _write(self, data: bytes) -> None:
        if self.transport is None or self._closed:
            return
        if self._compressor is not None:
            data = self._compressor.compress(data)
        session = self._tls_session
        if session is not None:
            if not session.handshake_done:
                self._tls_backlog.append(data)
                return
            try:
                data = session.send(data)
            except TLSError as exc:
                self.nsqd.logger.error(f"[{self.remote_address}] - TLS: {exc}")
                self.close()
                return
        self.bytes_sent += len(data)
        self.transport.write(data)

    # ------------------------------------------------------------------ upgrades (IDENTIFY)

    def start_upgrades(self, tls_context: SSL.Context | None, compression: str, level: int) -> None:
        """After the IDENTIFY response: TLS (then OK over TLS), then compression (then OK)."""
        self.flush()  # the JSON response goes out in plain text
        if tls_context is not None:
            self.nsqd.logger.info(f"PROTOCOL(V2): [{self}] upgrading connection to TLS")
            self._tls_session = TLSSession(tls_context)
            self._pending_compression = (compression, level)
            self._handshake_timer = self.loop.call_later(
                TLS_HANDSHAKE_TIMEOUT, self._handshake_timed_out
            )
            return
        self._upgrade_compression(compression, level)

    def _receive_tls(self, data: bytes) -> bytes:
        session = self._tls_session
        assert session is not None
        was_done = session.handshake_done
        try:
            plain, outgoing = session.receive(data)
        except TLSError as exc:
            self.nsqd.logger.error(f"[{self}] - IDENTIFY failed TLS handshake: {exc}")
            if exc.alert and self.transport is not None:
                self.bytes_sent += len(exc.alert)
                self.transport.write(exc.alert)  # tell the peer why, as Go's crypto/tls does
            self.close()
            return b""
        if outgoing and self.transport is not None:
            self.bytes_sent += len(outgoing)
            self.transport.write(outgoing)
        if session.handshake_done and not was_done:
            self._tls_ready(session)
        if session.closed:
            self.close()
        return plain

    def _tls_ready(self, session: TLSSession) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        self.tls = True
        self.tls_version = session.version
        self.tls_cipher = session.cipher
        self.tls_common_name = session.peer_common_name
        backlog, self._tls_backlog = self._tls_backlog, []
        for data in backlog:
            self._write(data)
        self._out.append(encode_response(b"OK"))
        self.flush()
        compression, level = self._pending_compression
        self._upgrade_compression(compression, level)

    def _handshake_timed_out(self) -> None:
        if self._tls_session is not None and not self._tls_session.handshake_done:
            self.nsqd.logger.error(f"[{self}] - IDENTIFY failed TLS handshake timeout")
            self.close()

    def _upgrade_compression(self, compression: str, level: int) -> None:
        if compression == "snappy":
            self.nsqd.logger.info(f"PROTOCOL(V2): [{self}] upgrading connection to snappy")
            self._compressor = SnappyFrameWriter()
            self._decompressor = SnappyFrameReader()
            self.snappy = True
        elif compression == "deflate":
            self.nsqd.logger.info(
                f"PROTOCOL(V2): [{self}] upgrading connection to deflate (level {level})"
            )
            self._compressor = DeflateWriter(level)
            self._decompressor = DeflateReader()
            self.deflate = True
        else:
            return
        self._send_frame(encode_response(b"OK"))

    def flush(self) -> None:
        self._must_flush = False
        if self._response_at is not None:
            self._response_at = 0
        if self._out:
            data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
            self._out.clear()
            self._out_len = 0
            self._write(data)

    def send_response(self, data: bytes) -> None:
        self._send_frame(encode_response(data))

    def send_error(self, err: ProtocolError) -> None:
        self.nsqd.writes.log_client_error(self.remote_address, err)  # a failing disk: summarised
        self._send_frame(encode_error(err.to_bytes()))
        if err.fatal:
            self.flush()
            self.close()

    def _send_frame(self, frame: bytes) -> None:
        """Responses and errors are flushed at once, with any buffered messages before them
        (except those the current command itself delivered: see ``_exec_all``)."""
        at = self._response_at
        if at is not None and at < len(self._out):
            self._out.insert(at, frame)
            self._response_at = at + 1
        else:
            self._out.append(frame)
        self._out_len += len(frame)
        if self._in_batch:
            self._must_flush = True
        else:
            self.flush()

    def send_message(self, msg: Message) -> None:
        """Buffer the frame of a message its channel has put in flight to this client."""
        self.in_flight_count += 1
        self.message_count += 1
        frame = msg.frame()
        self._out.append(frame)
        self._out_len += len(frame)

    def send_messages(self, frames: list[bytes], count: int, size: int) -> None:
        """Buffer a window of message frames its channel has put in flight to this client
        (the flush's join copies each body once)."""
        self._out.extend(frames)
        self._out_len += size
        self.in_flight_count += count
        self.message_count += count

    def after_deliveries(self) -> None:
        """Flush policy after messages were buffered (Go's messagePump)."""
        if not self._out or self._flush_pending:
            return
        if (
            self._out_len >= self.output_buffer_size
            or self.in_flight_count >= self.ready_count
            or (self.channel is not None and self.channel.paused)
        ):
            if self._in_batch:  # this client's own commands (FIN, RDY): flushed after them
                self._must_flush = True
                return
            self._flush_pending = True
            self.loop.call_soon(self._flush_soon)
        elif self._flush_timer is None and self.output_buffer_timeout > 0:
            self._flush_timer = self.loop.call_later(self.output_buffer_timeout, self._on_timer)

    def _flush_soon(self) -> None:
        self._flush_pending = False
        if not self._in_batch:
            self.flush()

    def _on_timer(self) -> None:
        self._flush_timer = None
        if not self._in_batch:
            self.flush()

    # ------------------------------------------------------------------ heartbeats

    def _schedule_heartbeat(self) -> None:
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
            self._heartbeat_timer = None
        if self.heartbeat_interval > 0 and not self._closed:
            self._heartbeat_timer = self.loop.call_later(
                self.heartbeat_interval, self._on_heartbeat
            )

    def _on_heartbeat(self) -> None:
        self._heartbeat_timer = None
        if self._closed:
            return
        idle = self.nsqd.now() - self._last_read
        if idle >= 2 * self.heartbeat_interval:  # Go's read deadline: two missed heartbeats
            self.nsqd.logger.error(
                f"[{self.remote_address}] - failed to read command - i/o timeout"
            )
            self.close()
            return
        self._out.append(FRAME_HEARTBEAT)
        self.flush()
        self._schedule_heartbeat()

    def identified(self) -> None:
        """Restart timers with the settings IDENTIFY negotiated."""
        self._schedule_heartbeat()
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None

    # ------------------------------------------------------------------ state changes

    def set_ready_count(self, count: int) -> None:
        self.ready_count = count
        if self.channel is not None:
            self.channel.pump(self)

    def finished_message(self) -> None:
        self.finished_messages(1)

    def finished_messages(self, count: int) -> None:
        """``count`` FINs (of one run): one refill for all of them."""
        self.finish_count += count
        self.in_flight_count -= count
        if self.channel is not None:
            self.channel.pump(self)

    def requeued_message(self) -> None:
        self.requeue_count += 1
        self.in_flight_count -= 1
        if self.channel is not None:
            self.channel.pump(self)

    def timed_out_message(self) -> None:
        self.in_flight_count -= 1
        if self.channel is not None and not self._closed:
            self.channel.pump(self)

    def empty_in_flight(self) -> None:
        self.in_flight_count = 0

    def published(self, topic: str, count: int) -> None:
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + count

    def start_close(self) -> None:
        self.ready_count = 0
        self.state = STATE_CLOSING

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.transport is None:
                return
            if self._output_full:  # a peer that does not read would hold a graceful close open
                self.transport.abort()
            else:
                self.transport.close()

    def stats(self, topic_filter: str = "") -> dict[str, Any]:
        """Its entry in /stats (Go's clientV2.Stats)."""
        stats: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "version": "V2",
            "remote_address": self.remote_address,
            "state": self.state,
            "ready_count": self.ready_count,
            "in_flight_count": self.in_flight_count,
            "message_count": self.message_count,
            "finish_count": self.finish_count,
            "requeue_count": self.requeue_count,
            "connect_ts": self.connect_ts,
            "sample_rate": self.sample_rate,
            "deflate": self.deflate,
            "snappy": self.snappy,
            "user_agent": self.user_agent,
        }
        auth = self.auth_state
        if auth is not None:
            stats["authed"] = True
            identity = getattr(auth, "identity", "")
            identity_url = getattr(auth, "identity_url", "")
            if identity:
                stats["auth_identity"] = identity
            if identity_url:
                stats["auth_identity_url"] = identity_url
        for topic, count in self.pub_counts.items():  # Go reports at most one (an early break)
            if topic_filter and topic != topic_filter:
                continue
            stats["pub_counts"] = [{"topic": topic, "count": count}]
            break
        stats.update(self.tls_stats())
        return stats

    def tls_stats(self) -> dict[str, Any]:
        return {
            "tls": self.tls,
            "tls_cipher_suite": self.tls_cipher,
            "tls_version": self.tls_version,
            "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": False,
        }

    @property
    def is_ready(self) -> bool:
        channel = self.channel
        return (
            channel is not None
            and not channel.paused
            and self.ready_count > 0
            and self.in_flight_count < self.ready_count
        )


if TYPE_CHECKING:

    def _is_a_consumer(client: ClientV2) -> Consumer:
        return client  # mypy checks here that ClientV2 satisfies the Consumer protocol
