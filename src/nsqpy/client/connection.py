"""One TCP connection to one nsqd: handshake, negotiated upgrades, framing, batched writes.

It is an ``asyncio.Protocol`` (cheaper per read than streams: no StreamReader buffer copies and
no task switch per frame). Commands written during one event-loop turn go out in one
``transport.write`` (one syscall, one compressed block), so FINs for a burst of messages cost
one write, not one per message.

The handshake (magic, IDENTIFY, TLS/snappy/deflate upgrades, AUTH, then SUB for consumers)
reads one frame at a time, because bytes after the IDENTIFY response may already belong to the
compressed stream. Afterwards :meth:`Connection.start_streaming` switches to the batch decoder
and frames go to the delegate as they arrive.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from .. import __version__
from ..protocol import commands
from ..protocol.compression import (
    CompressionError,
    DeflateReader,
    DeflateWriter,
    SnappyFrameReader,
    SnappyFrameWriter,
)
from ..protocol.frames import (
    FRAME_HEADER,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    OK,
    Frame,
    FrameDecoder,
    FrameTooLarge,
)
from ..protocol.message import ID_START, MESSAGE_HEADER, MESSAGE_HEADER_LENGTH
from .errors import ConnectionClosedError, IdentifyError, ServerError, go_dial_error
from .message import Message
from .rdy import RdyState

__all__ = ["Connection", "ConnectionDelegate", "ConnectionOptions", "split_address"]

log = logging.getLogger("nsqpy.client")

DEFAULT_USER_AGENT = f"nsqpy/{__version__}"
#: nsqd before 0.2.20 does not announce max_rdy_count; 2500 was its fixed limit
DEFAULT_MAX_RDY_COUNT = 2500

_NOP = commands.nop()


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


@dataclass(frozen=True)
class ConnectionOptions:
    """Settings for each nsqd connection, most of them sent in IDENTIFY.

    Durations are in seconds. ``0`` for ``output_buffer_size``, ``output_buffer_timeout`` and
    ``msg_timeout`` keeps nsqd's default; ``-1`` disables output buffering (size) or timed
    flushing (timeout). ``heartbeat_interval=None`` disables heartbeats (nsqd then refuses SUB).
    ``tls`` is ``True`` (system trust store, hostname checked) or an ``ssl.SSLContext``.
    """

    client_id: str = field(default_factory=_short_hostname)
    hostname: str = field(default_factory=socket.gethostname)
    user_agent: str = DEFAULT_USER_AGENT
    heartbeat_interval: float | None = 30.0
    output_buffer_size: int = 0
    output_buffer_timeout: float = 0.0
    sample_rate: int = 0
    msg_timeout: float = 0.0
    tls: bool | ssl.SSLContext = False
    tls_server_hostname: str | None = None
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    auth_secret: str | bytes | None = None
    dial_timeout: float = 1.0
    #: no bytes at all for this long (not even a heartbeat) means the connection is dead
    read_timeout: float = 60.0
    max_frame_size: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.snappy and self.deflate:
            raise ValueError("snappy and deflate are mutually exclusive")
        if not 0 <= self.sample_rate <= 99:
            raise ValueError("sample_rate must be between 0 and 99")
        if not 1 <= self.deflate_level <= 9:
            raise ValueError("deflate_level must be between 1 and 9")
        if self.heartbeats_enabled and (self.heartbeat_interval or 0) < 1.0:
            raise ValueError("heartbeat_interval must be >= 1s (or None to disable)")

    @property
    def heartbeats_enabled(self) -> bool:
        return self.heartbeat_interval is not None and self.heartbeat_interval != -1

    def identify_body(self) -> dict[str, Any]:
        """The IDENTIFY JSON (feature negotiation on)."""

        def ms(seconds: float) -> int:
            return -1 if seconds == -1 else round(seconds * 1000)

        heartbeat = self.heartbeat_interval
        return {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": ms(heartbeat) if heartbeat is not None else -1,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": ms(self.output_buffer_timeout),
            "sample_rate": self.sample_rate,
            "msg_timeout": ms(self.msg_timeout),
            "tls_v1": bool(self.tls),
            "snappy": self.snappy,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
        }


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` to (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"invalid nsqd address {address!r} (expected host:port)")
    return host.strip("[]"), int(port)


class ConnectionDelegate(Protocol):
    """What a connection reports to its owner (a consumer or a producer)."""

    def on_message(self, conn: Connection, message: Message) -> None: ...

    def on_message_finished(self, conn: Connection, message: Message) -> None: ...

    def on_message_requeued(
        self, conn: Connection, message: Message, delay: float | None, backoff: bool
    ) -> None: ...

    def on_response(self, conn: Connection, data: bytes) -> None: ...

    def on_server_error(self, conn: Connection, error: ServerError) -> None: ...

    def on_close(self, conn: Connection, exc: BaseException | None) -> None: ...


class Connection(asyncio.Protocol):
    """A V2 protocol connection to one nsqd."""

    def __init__(
        self, address: str, options: ConnectionOptions, delegate: ConnectionDelegate
    ) -> None:
        self.address = address
        self.host, self.port = split_address(address)
        self.options = options
        self.delegate = delegate
        #: nsqd's IDENTIFY response ({} if it did not negotiate features)
        self.server_settings: dict[str, Any] = {}
        self.auth_response: dict[str, Any] | None = None
        self.max_rdy_count = DEFAULT_MAX_RDY_COUNT
        #: set by a consumer once subscribed
        self.rdy_state: RdyState | None = None
        #: True once CLS was sent
        self.closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transport: asyncio.Transport | None = None
        self._lost = False
        self._closed_fut: asyncio.Future[None] | None = None
        self._wbuf: list[bytes] = []
        self._flush_scheduled = False
        self._writer: SnappyFrameWriter | DeflateWriter | None = None
        self._reader: SnappyFrameReader | DeflateReader | None = None
        # handshake mode: raw frames accumulate here until start_streaming()
        self._hs_buf: bytearray | None = bytearray()
        self._hs_waiter: asyncio.Future[None] | None = None
        self._decoder = FrameDecoder(options.max_frame_size)
        self._pending: deque[asyncio.Future[bytes]] = deque()
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._last_read = 0.0
        self._watchdog: asyncio.TimerHandle | None = None
        self._close_exc: BaseException | None = None

    def __repr__(self) -> str:
        return f"<Connection {self.address}{' lost' if self._lost else ''}>"

    # ------------------------------------------------------------------ state

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._lost

    @property
    def compression(self) -> str | None:
        if isinstance(self._writer, SnappyFrameWriter):
            return "snappy"
        if isinstance(self._writer, DeflateWriter):
            return "deflate"
        return None

    @property
    def tls(self) -> bool:
        transport = self._transport
        return transport is not None and transport.get_extra_info("sslcontext") is not None

    # ------------------------------------------------------------------ handshake

    async def connect(self) -> dict[str, Any]:
        """Open the socket, send the magic and IDENTIFY, apply upgrades, AUTH if required.

        Returns nsqd's IDENTIFY response. On failure the connection is aborted and
        :class:`ConnectionClosedError` or :class:`IdentifyError` is raised.
        """
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._closed_fut = loop.create_future()
        try:
            async with asyncio.timeout(self.options.dial_timeout):
                await loop.create_connection(lambda: self, self.host, self.port)
        except (TimeoutError, OSError) as exc:
            raise ConnectionClosedError(go_dial_error(self.address, exc)) from exc
        try:
            self.write(MAGIC_V2)
            settings = await self._identify()
            if settings.get("auth_required"):
                await self._auth()
        except BaseException:
            self.abort()
            raise
        return settings

    async def handshake_command(self, data: bytes) -> bytes:
        """Send a command during the handshake (e.g. SUB) and return its response."""
        self.write(data)
        self._flush()
        frame_type, body = await self._read_handshake_frame()
        if frame_type == FRAME_TYPE_ERROR:
            raise ServerError(body)
        return body

    def start_streaming(self) -> None:
        """Leave handshake mode: from now on frames are dispatched as they arrive."""
        buf = self._hs_buf
        if buf is None:
            return
        self._hs_buf = None
        if self.options.heartbeats_enabled and self._loop is not None:
            self._arm_watchdog(self.options.read_timeout)
        if buf and not self._lost:
            self._process(bytes(buf))

    async def _identify(self) -> dict[str, Any]:
        opts = self.options
        self.write(commands.identify(opts.identify_body()))
        self._flush()
        frame_type, data = await self._read_handshake_frame()
        if frame_type == FRAME_TYPE_ERROR:
            raise IdentifyError(f"{self.address}: IDENTIFY failed: {data.decode(errors='replace')}")
        if not data.startswith(b"{"):
            # an nsqd without feature negotiation answers OK: no upgrades, default limits
            if opts.tls:
                raise IdentifyError(f"{self.address}: TLS requested but nsqd cannot negotiate it")
            return {}
        try:
            settings: dict[str, Any] = json.loads(data)
        except ValueError as exc:
            raise IdentifyError(f"{self.address}: bad IDENTIFY response {data[:64]!r}") from exc
        self.server_settings = settings
        self.max_rdy_count = int(settings.get("max_rdy_count") or DEFAULT_MAX_RDY_COUNT)

        if settings.get("tls_v1"):
            await self._upgrade_tls()
        elif opts.tls:
            raise IdentifyError(f"{self.address}: TLS requested but nsqd did not enable it")
        if settings.get("snappy"):
            self._install_codec(SnappyFrameReader(), SnappyFrameWriter())
            await self._expect_ok("snappy")
        elif settings.get("deflate"):
            level = int(settings.get("deflate_level") or opts.deflate_level)
            self._install_codec(DeflateReader(), DeflateWriter(level))
            await self._expect_ok("deflate")
        return settings

    async def _upgrade_tls(self) -> None:
        opts = self.options
        context = opts.tls if isinstance(opts.tls, ssl.SSLContext) else ssl.create_default_context()
        assert self._loop is not None and self._transport is not None
        self._flush()
        try:
            transport = await self._loop.start_tls(
                self._transport,
                self,
                context,
                server_hostname=opts.tls_server_hostname or self.host,
                ssl_handshake_timeout=opts.read_timeout,
            )
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            raise IdentifyError(f"{self.address}: TLS handshake failed: {exc!r}") from exc
        if transport is None:
            raise ConnectionClosedError(f"{self.address}: connection lost during TLS handshake")
        self._transport = transport
        await self._expect_ok("TLS")

    def _install_codec(
        self,
        reader: SnappyFrameReader | DeflateReader,
        writer: SnappyFrameWriter | DeflateWriter,
    ) -> None:
        # everything queued so far was meant to go out uncompressed
        self._flush()
        self._writer = writer
        buf = self._hs_buf
        assert buf is not None
        leftover = bytes(buf)
        buf.clear()
        self._reader = reader
        if leftover:
            buf += reader.decompress(leftover)

    async def _expect_ok(self, what: str) -> None:
        frame_type, data = await self._read_handshake_frame()
        if frame_type != FRAME_TYPE_RESPONSE or data != OK:
            raise IdentifyError(f"{self.address}: invalid response from {what} upgrade: {data!r}")

    async def _auth(self) -> None:
        secret = self.options.auth_secret
        if not secret:
            raise IdentifyError(f"{self.address}: nsqd requires AUTH but no auth_secret was set")
        self.write(commands.auth(secret))
        self._flush()
        frame_type, data = await self._read_handshake_frame()
        if frame_type == FRAME_TYPE_ERROR:
            raise IdentifyError(f"{self.address}: AUTH failed: {data.decode(errors='replace')}")
        try:
            self.auth_response = json.loads(data)
        except ValueError as exc:
            raise IdentifyError(f"{self.address}: bad AUTH response {data[:64]!r}") from exc
        log.info(
            "(%s) AUTH accepted: identity %r, %s permission(s)",
            self.address,
            self.auth_response.get("identity") if self.auth_response else None,
            self.auth_response.get("permission_count") if self.auth_response else None,
        )

    async def _read_handshake_frame(self) -> Frame:
        """The next non-heartbeat frame while in handshake mode."""
        assert self._loop is not None
        while True:
            buf = self._hs_buf
            assert buf is not None
            if len(buf) >= 8:
                size, frame_type = FRAME_HEADER.unpack_from(buf, 0)
                if size < 4 or size > self.options.max_frame_size:
                    raise ConnectionClosedError(f"{self.address}: invalid frame size {size}")
                if len(buf) >= 4 + size:
                    data = bytes(buf[8 : 4 + size])
                    del buf[: 4 + size]
                    if frame_type == FRAME_TYPE_RESPONSE and data == HEARTBEAT:
                        self.write(_NOP)
                        continue
                    return Frame(frame_type, data)
            if self._lost:
                raise ConnectionClosedError(
                    f"{self.address}: connection closed during handshake"
                ) from self._close_exc
            waiter = self._loop.create_future()
            self._hs_waiter = waiter
            try:
                async with asyncio.timeout(self.options.read_timeout):
                    await waiter
            except TimeoutError as exc:
                raise ConnectionClosedError(f"{self.address}: handshake timed out") from exc
            finally:
                self._hs_waiter = None

    # ------------------------------------------------------------------ writing

    def write(self, data: bytes) -> None:
        """Queue a command; everything queued in this loop turn goes out in one write."""
        if self._lost or self._transport is None:
            return
        self._wbuf.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        wbuf = self._wbuf
        if not wbuf or self._lost or self._transport is None:
            wbuf.clear()
            return
        data = wbuf[0] if len(wbuf) == 1 else b"".join(wbuf)
        wbuf.clear()
        writer = self._writer
        if writer is not None:
            data = writer.compress(data)
        self._transport.write(data)

    def send_rdy(self, count: int) -> None:
        self.write(commands.rdy(count))

    def request(self, data: bytes) -> asyncio.Future[bytes]:
        """Send a command answered by a response frame (PUB, MPUB, DPUB, CLS).

        Answers come back in the order the commands were sent, so requests pipeline.
        """
        if self._lost or self._transport is None or self._loop is None:
            raise ConnectionClosedError(f"{self.address}: connection is closed")
        fut: asyncio.Future[bytes] = self._loop.create_future()
        self._pending.append(fut)
        self.write(data)
        return fut

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark."""
        if not self._write_paused or self._loop is None:
            return
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter

    def start_close(self) -> asyncio.Future[bytes]:
        """Send CLS: nsqd stops sending messages and answers CLOSE_WAIT."""
        self.closing = True
        if self.rdy_state is not None:
            self.rdy_state.closing = True
        return self.request(commands.cls())

    def close(self) -> None:
        """Flush what is queued and close the socket."""
        if self._transport is not None and not self._lost:
            self._flush()
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None and not self._lost:
            self._transport.abort()

    async def wait_closed(self) -> None:
        if self._closed_fut is not None:
            await asyncio.shield(self._closed_fut)

    # ------------------------------------------------------------------ message verbs

    def finish_message(self, message: Message) -> None:
        self.delegate.on_message_finished(self, message)

    def requeue_message(self, message: Message, delay: float | None, backoff: bool) -> None:
        self.delegate.on_message_requeued(self, message, delay, backoff)

    def touch_message(self, message: Message) -> None:
        self.write(commands.touch(message.id))

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self._transport = cast(asyncio.Transport, transport)
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._last_read = self._loop.time()

    def data_received(self, data: bytes) -> None:
        assert self._loop is not None
        self._last_read = self._loop.time()
        reader = self._reader
        if reader is not None:
            try:
                data = reader.decompress(data)
            except CompressionError as exc:
                self._fail(exc)
                return
            if not data:
                return
        hs_buf = self._hs_buf
        if hs_buf is not None:
            hs_buf += data
            waiter = self._hs_waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            return
        self._process(data)

    def _process(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except FrameTooLarge as exc:
            self._fail(exc)
            return
        delegate = self.delegate
        id_start, header_length = ID_START, MESSAGE_HEADER_LENGTH  # locals: read per message
        for frame_type, body in frames:
            if frame_type == FRAME_TYPE_MESSAGE:
                if len(body) < header_length:
                    self._fail(ValueError(f"message frame too short ({len(body)} bytes)"))
                    return
                timestamp, attempts = MESSAGE_HEADER.unpack_from(body, 0)
                delegate.on_message(
                    self,
                    Message(
                        body[id_start:header_length],
                        body[header_length:],
                        timestamp,
                        attempts,
                        self.address,
                        self,
                    ),
                )
            elif frame_type == FRAME_TYPE_RESPONSE:
                if body == HEARTBEAT:
                    self.write(_NOP)
                elif self._pending:
                    fut = self._pending.popleft()
                    if not fut.done():
                        fut.set_result(body)
                else:
                    delegate.on_response(self, body)
            elif frame_type == FRAME_TYPE_ERROR:
                error = ServerError(body)
                if error.fatal and self._pending:
                    fut = self._pending.popleft()
                    if not fut.done():
                        fut.set_exception(error)
                delegate.on_server_error(self, error)
            else:
                self._fail(ValueError(f"unknown frame type {frame_type}"))
                return
            if self._lost:
                return

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._close_exc is None:
            self._close_exc = exc
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._wbuf.clear()
        waiter = self._hs_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        error = ConnectionClosedError(f"{self.address}: connection closed")
        while self._pending:
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(error)
        for drain in self._drain_waiters:
            if not drain.done():
                drain.set_result(None)
        self._drain_waiters.clear()
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)
        self.delegate.on_close(self, self._close_exc)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    # ------------------------------------------------------------------ failure detection

    def _fail(self, exc: BaseException) -> None:
        log.error("(%s) IO error - %s", self.address, exc)
        self._close_exc = exc
        self.abort()

    def _arm_watchdog(self, delay: float) -> None:
        assert self._loop is not None
        self._watchdog = self._loop.call_later(delay, self._check_read_timeout)

    def _check_read_timeout(self) -> None:
        self._watchdog = None
        if self._lost or self._loop is None:
            return
        timeout = self.options.read_timeout
        idle = self._loop.time() - self._last_read
        if idle >= timeout:
            self._fail(ConnectionClosedError(f"{self.address}: nothing read for {idle:.1f}s"))
            return
        self._arm_watchdog(timeout - idle)
