"""One TCP connection's I/O: bytes in, a turn at a time, and frames out, buffered.

:class:`Connection` is the ``asyncio.Protocol`` under a :class:`~nsqpy.nsqd.client_v2.ClientV2`
(Go's ``protocolV2.IOLoop`` and ``messagePump`` with client_v2.go's reader and writer). It
knows bytes, frames, commands and timers, never what a command means: it hands each parsed
batch of commands to its client (:class:`Client`) and sends the frames it is given.

Input runs in turns. What a ``data_received`` brings is decrypted (TLS), inflated (snappy,
deflate) and parsed for at most :data:`TURN_BUDGET` seconds; the rest waits for a later loop
turn with the socket not read, so one busy connection cannot starve the others on the one
event loop. Reading also pauses while the client's commands wait (an AUTH query, a sliced
MPUB) and while the peer does not read what it is sent (:data:`OUTPUT_HIGH_WATER`).

Output is buffered and flushed as Go's message pump does: when the client stops being ready,
when the buffer is full, on the output-buffer timer, and together with any response or error
frame. Everything a single turn produces for this connection leaves in one
``transport.write``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol, cast

from ..protocol import (
    FRAME_HEARTBEAT,
    MAGIC_V2,
    CommandParser,
    LineTooLong,
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
from ..protocol.replica import MAGIC_R1
from .tls import TLSError, TLSSession

if TYPE_CHECKING:
    from OpenSSL import SSL

    from .nsqd import NSQD

_BAD_PROTOCOL = encode_error(b"E_BAD_PROTOCOL")
_OK = encode_response(b"OK")
#: Plain bytes taken out of the decompressor at a time: a compression bomb inflates a slice
#: per step, never all at once.
INFLATE_SLICE = 64 * 1024
#: Seconds of one connection's input run per loop turn, checked after each step of at most
#: TURN_STEP commands (a FIN run's IDs count one each) or one MPUB slice.
TURN_BUDGET = 0.0005
TURN_STEP = 64
#: Unsent output past which the connection's reading pauses until the peer reads (Go's
#: connection blocks on its socket): a client that never reads cannot grow nsqd's memory.
OUTPUT_HIGH_WATER = 4 * 1024 * 1024
OUTPUT_LOW_WATER = 1024 * 1024
TLS_HANDSHAKE_TIMEOUT = 5.0


class Pausable(Protocol):
    @property
    def paused(self) -> bool: ...


class Client(Protocol):
    """What a connection needs of the protocol state it carries (ClientV2 is the one)."""

    @property
    def ready_count(self) -> int: ...
    @property
    def in_flight_count(self) -> int: ...
    @property
    def channel(self) -> Pausable | None: ...
    @property
    def heartbeat_interval(self) -> float: ...
    @property
    def output_buffer_size(self) -> int: ...
    @property
    def output_buffer_timeout(self) -> float: ...

    def connected_from(self, host: str) -> None:
        """A TCP peer connected from ``host`` (not called for a unix socket)."""

    def run_commands(self, commands: list[Command]) -> None:
        """Run a batch of parsed commands (inside :meth:`Connection.batch`)."""

    def check_before_body(self, name: bytes, params: list[bytes]) -> None:
        """A command's header has arrived but not yet its body."""

    def report_truncated(self, name: bytes, params: list[bytes], partial: bytes | None) -> None:
        """The input ended inside a command."""

    def tls_established(self, session: TLSSession) -> None: ...
    def compression_started(self, compression: str) -> None: ...

    def connection_closed(self) -> None:
        """The socket is gone: nothing more is read or sent."""


class Connection(asyncio.Protocol):
    """One client's socket: the input's turns, the output buffer, heartbeats, upgrades."""

    def __init__(self, client: Client, nsqd: NSQD) -> None:
        opts = nsqd.options
        self.client = client
        self.nsqd = nsqd
        self.loop = nsqd.loop
        self.transport: asyncio.Transport | None = None
        self.remote_address = ""
        # wire bytes (after TLS and compression), one add per read or write call, never per
        # message; nsqd folds them into its totals when the connection goes (/metrics)
        self.bytes_received = 0
        self.bytes_sent = 0
        self.closed = False
        #: the output buffer: frames for the next flush and their size in bytes (a delivery
        #: appends to them directly, without a call per message)
        self.out: list[bytes] = []
        self.out_len = 0
        #: when this connection's current turn ends (perf_counter): a handler whose work
        #: outlasts it continues on later turns
        self.turn_deadline = 0.0
        self.parser = CommandParser(opts.max_msg_size, opts.max_body_size, fin_runs=True)
        self._magic = b""
        self._input: deque[bytes] = deque()  # received, not yet parsed
        self._suspended = False  # the client's commands wait (an AUTH, a sliced MPUB)
        self._backlog = False  # this turn's budget is spent: the rest runs on a later turn
        self._output_full = False  # the peer does not read: its input waits
        self._reading = True
        self._line_too_long = False
        self._eof = False
        self._in_batch = False
        self._response_at: int | None = None
        self._must_flush = False
        self._flush_pending = False
        self._flush_timer: asyncio.TimerHandle | None = None
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._tls_session: TLSSession | None = None
        self._tls_backlog: list[bytes] = []
        self._pending_compression: tuple[str, int] = ("", 0)
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._compressor: SnappyFrameWriter | DeflateWriter | None = None
        self._decompressor: SnappyFrameReader | DeflateReader | None = None

    def __repr__(self) -> str:
        return self.remote_address

    # ------------------------------------------------------------------ asyncio protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            host = peer[0]
            self.remote_address = f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
            self.client.connected_from(host)
        else:  # unix socket
            self.remote_address = "@"
        self._last_read = self.nsqd.now()
        self.transport.set_write_buffer_limits(OUTPUT_HIGH_WATER, OUTPUT_LOW_WATER)
        self.nsqd.logger.info(f"TCP: new client({self.remote_address})")
        self._schedule_heartbeat()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for handle in (self._heartbeat_timer, self._flush_timer, self._handshake_timer):
            if handle is not None:
                handle.cancel()
        self.out.clear()
        self._input.clear()
        self.nsqd.logger.info(f"PROTOCOL(V2): [{self.remote_address}] exiting ioloop")
        self.client.connection_closed()

    def data_received(self, data: bytes) -> None:
        if self.closed:
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

    def eof_received(self) -> bool:
        """The peer finished sending: once everything it sent has run, report a command cut
        short, as Go does, then close."""
        if self._input_waits() or self._input or self.parser.more:
            self._eof = True
            return True  # kept open (for writing) until the input has run
        self._end_of_input()
        return False

    def pause_writing(self) -> None:
        self._output_full = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._output_full = False
        if not self.closed and not self._input_waits():
            self._run_input()

    # ------------------------------------------------------------------ input, a turn at a time

    def _input_waits(self) -> bool:
        """Whether this connection's input must wait: the client's commands wait, its turn's
        budget is spent, or it does not read what it was sent."""
        return self._suspended or self._backlog or self._output_full

    def _update_reading(self) -> None:
        """Read from the socket only while the input can be run now: what is not read stays
        in the kernel's buffers and slows the peer down, as a blocked Go connection does."""
        reading = not self._input_waits()
        if reading != self._reading and not self.closed and self.transport is not None:
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
            if self.closed:
                return
            if self._line_too_long:
                self.nsqd.logger.error(
                    f"[{self.remote_address}] - failed to read command - bufio: buffer full"
                )
                self.close()
                return
            if self._suspended or self._output_full:
                self._update_reading()  # resumed by the client's resume_input, or the drain
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
        pending = self.parser.pending
        if pending is not None:
            self.client.check_before_body(pending[0], pending[1])
        self._update_reading()

    def _next_turn(self) -> None:
        self._backlog = False
        if not self.closed and not self._input_waits():
            self._run_input()

    def _next_commands(self) -> list[Command] | None:
        """The next piece of parsed input: what the parser still holds, then what the
        decompressor still holds, then the next received chunk; None once all is run."""
        if self.parser.more:
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
            return self.parser.feed(data, TURN_STEP)
        except LineTooLong as exc:  # Go runs the commands before the long line, then fails
            self._line_too_long = True
            return exc.commands

    def _take_magic(self, data: bytes) -> bytes:
        need = 4 - len(self._magic)
        self._magic += data[:need]
        if len(self._magic) < 4:
            return b""
        if self._magic == MAGIC_R1 and self.nsqd.replication is not None:
            self._hand_over_to_replication(data[need:])
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

    def _hand_over_to_replication(self, rest: bytes) -> None:
        """A peer's replication link (docs/replication.md): the socket leaves the clients."""
        transport, replication = self.transport, self.nsqd.replication
        rest += b"".join(self._input)
        self.connection_lost(None)
        if transport is not None and replication is not None:
            replication.accept(transport, rest)

    def _run_batch(self, commands: list[Command]) -> None:
        with self.batch():
            self.client.run_commands(commands)
        if self.nsqd.replication is not None:
            self.nsqd.replication.flush_settled()

    def _end_of_input(self) -> None:
        truncated = self.parser.truncated() if len(self._magic) == 4 else None
        if truncated is not None and not self.closed:
            self.client.report_truncated(*truncated)

    def suspend_input(self) -> None:
        """Hold the input until :meth:`resume_input`: the client's commands wait for an
        answer (an auth query, a sliced MPUB)."""
        self._suspended = True
        self._update_reading()

    def resume_input(self, rest: list[Command]) -> None:
        """Run the commands parsed after the one that suspended the input, then the rest of
        the input, in a fresh turn."""
        self._suspended = False
        self.turn_deadline = time.perf_counter() + TURN_BUDGET
        self._run_batch(rest)
        if not self.closed and not self._input_waits():
            self._run_input()

    # ------------------------------------------------------------------ output

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Frames sent inside leave together at its end, in one write."""
        self._in_batch = True
        try:
            yield
        finally:
            self._in_batch = False
            self._response_at = None
        if self._must_flush and not self.closed:
            self.flush()

    def begin_command(self) -> None:
        """A command's response goes before any message the command itself delivered to this
        client (a PUB to a topic it is subscribed to): Go answers before its message pump."""
        self._response_at = len(self.out)

    def send_frame(self, frame: bytes) -> None:
        """Responses and errors are flushed at once, with any buffered messages before them
        (except those the current command itself delivered: see :meth:`begin_command`)."""
        at = self._response_at
        if at is not None and at < len(self.out):
            self.out.insert(at, frame)
            self._response_at = at + 1
        else:
            self.out.append(frame)
        self.out_len += len(frame)
        if self._in_batch:
            self._must_flush = True
        else:
            self.flush()

    def flush(self) -> None:
        self._must_flush = False
        if self._response_at is not None:
            self._response_at = 0
        if self.out:
            data = b"".join(self.out) if len(self.out) > 1 else self.out[0]
            self.out.clear()
            self.out_len = 0
            self._write(data)

    def after_deliveries(self) -> None:
        """Flush policy after messages were buffered (Go's messagePump)."""
        if not self.out or self._flush_pending:
            return
        client = self.client
        if (
            self.out_len >= client.output_buffer_size
            or client.in_flight_count >= client.ready_count
            or (client.channel is not None and client.channel.paused)
        ):
            if self._in_batch:  # this client's own commands (FIN, RDY): flushed after them
                self._must_flush = True
                return
            self._flush_pending = True
            self.loop.call_soon(self._flush_soon)
        elif self._flush_timer is None and client.output_buffer_timeout > 0:
            self._flush_timer = self.loop.call_later(client.output_buffer_timeout, self._on_timer)

    def _flush_soon(self) -> None:
        self._flush_pending = False
        if not self._in_batch:
            self.flush()

    def _on_timer(self) -> None:
        self._flush_timer = None
        if not self._in_batch:
            self.flush()

    def _write(self, data: bytes) -> None:
        if self.transport is None or self.closed:
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
        self.client.tls_established(session)
        backlog, self._tls_backlog = self._tls_backlog, []
        for data in backlog:
            self._write(data)
        self.out.append(_OK)
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
        elif compression == "deflate":
            self.nsqd.logger.info(
                f"PROTOCOL(V2): [{self}] upgrading connection to deflate (level {level})"
            )
            self._compressor = DeflateWriter(level)
            self._decompressor = DeflateReader()
        else:
            return
        self.client.compression_started(compression)
        self.send_frame(_OK)

    # ------------------------------------------------------------------ heartbeats

    def restart_timers(self) -> None:
        """Restart the heartbeat and drop the output-buffer timer: the client's settings
        changed (IDENTIFY)."""
        self._schedule_heartbeat()
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None

    def _schedule_heartbeat(self) -> None:
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
            self._heartbeat_timer = None
        interval = self.client.heartbeat_interval
        if interval > 0 and not self.closed:
            self._heartbeat_timer = self.loop.call_later(interval, self._on_heartbeat)

    def _on_heartbeat(self) -> None:
        self._heartbeat_timer = None
        if self.closed:
            return
        idle = self.nsqd.now() - self._last_read
        if idle >= 2 * self.client.heartbeat_interval:  # Go's read deadline: two missed beats
            self.nsqd.logger.error(
                f"[{self.remote_address}] - failed to read command - i/o timeout"
            )
            self.close()
            return
        self.out.append(FRAME_HEARTBEAT)
        self.flush()
        self._schedule_heartbeat()

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is None:
                return
            if self._output_full:  # a peer that does not read would hold a graceful close open
                self.transport.abort()
            else:
                self.transport.close()
