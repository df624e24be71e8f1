"""A scripted fake nsqd: a real TCP server in the test process, in the spirit of go-nsq's mockNSQD.

Each accepted connection runs the next script, a list of instructions: send a frame, wait for
the client to have sent some command, switch on snappy/deflate/TLS, close. Messages honour RDY
like a real nsqd (sent only while in-flight < RDY; FIN/REQ free a slot), so scripts do not race
the client. Every command the client sends is recorded with the time it arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

from nsqpy.protocol import commands as cmd
from nsqpy.protocol.commands import CommandParser
from nsqpy.protocol.compression import (
    DeflateReader,
    DeflateWriter,
    SnappyFrameReader,
    SnappyFrameWriter,
)
from nsqpy.protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    encode_frame,
)
from nsqpy.protocol.message import encode_message

IDENTIFY_DEFAULTS: dict[str, Any] = {
    "max_rdy_count": 2500,
    "version": "1.3.0",
    "max_msg_timeout": 900000,
    "msg_timeout": 60000,
    "tls_v1": False,
    "deflate": False,
    "deflate_level": 6,
    "max_deflate_level": 6,
    "snappy": False,
    "sample_rate": 0,
    "auth_required": False,
    "output_buffer_size": 16384,
    "output_buffer_timeout": 250,
}


@dataclass
class Step:
    """One script instruction; build them with the helper functions below."""

    kind: str
    delay: float = 0.0
    frame_type: int = FRAME_TYPE_RESPONSE
    body: bytes = b""
    prefix: bytes = b""
    count: int = 1
    extra: Any = None


def respond(body: bytes = b"OK", delay: float = 0.0) -> Step:
    return Step("frame", delay, FRAME_TYPE_RESPONSE, body)


def identify_response(delay: float = 0.0, **overrides: Any) -> Step:
    settings = dict(IDENTIFY_DEFAULTS, **overrides)
    return respond(json.dumps(settings, separators=(",", ":")).encode(), delay)


def error(body: bytes, delay: float = 0.0) -> Step:
    return Step("frame", delay, FRAME_TYPE_ERROR, body)


def heartbeat(delay: float = 0.0) -> Step:
    return respond(HEARTBEAT, delay)


def message(msg_id: bytes, body: bytes, attempts: int = 1, delay: float = 0.0) -> Step:
    assert len(msg_id) == 16
    data = encode_message(time.time_ns(), attempts, msg_id, body)
    return Step("message", delay, FRAME_TYPE_MESSAGE, data)


def wait_for(prefix: bytes, count: int = 1, delay: float = 0.0) -> Step:
    """Wait until the client has sent ``count`` commands starting with ``prefix`` in total."""
    return Step("wait", delay, prefix=prefix, count=count)


def upgrade(
    kind: str,
    delay: float = 0.0,
    context: ssl.SSLContext | None = None,
    after: bytes = b"",
) -> Step:
    """Switch to ``tls``/``snappy``/``deflate`` and send the upgraded OK.

    ``after`` is a plain frame sent in the same write just before the compressed OK, so the
    client receives plain and compressed bytes in one read.
    """
    return Step("upgrade", delay, body=kind.encode(), extra=context, prefix=after)


def sleep(delay: float) -> Step:
    return Step("sleep", delay)


def close(delay: float = 0.0) -> Step:
    return Step("close", delay)


def handshake(**identify: Any) -> list[Step]:
    """IDENTIFY answered with feature negotiation, then SUB answered OK."""
    return [wait_for(b"IDENTIFY"), identify_response(**identify), wait_for(b"SUB"), respond()]


@dataclass
class FakeConnection:
    commands: list[tuple[float, bytes]] = field(default_factory=list)
    bodies: dict[bytes, list[bytes]] = field(default_factory=dict)
    rdy: int = 0
    in_flight: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None
    closed: bool = False
    script_end: int | None = None

    @property
    def lines(self) -> list[bytes]:
        """Every command received so far."""
        return [line for _, line in self.commands]

    @property
    def script_lines(self) -> list[bytes]:
        """The commands received by the time the script ended."""
        end = len(self.commands) if self.script_end is None else self.script_end
        return [line for _, line in self.commands[:end]]

    def finish(self) -> None:
        if self.script_end is None:
            self.script_end = len(self.commands)
        self.done.set()

    def times(self, prefix: bytes) -> list[float]:
        return [t for t, line in self.commands if line.startswith(prefix)]

    def identify(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.bodies[b"IDENTIFY"][0])
        return result


class FakeNsqd:
    """Serves ``scripts[i]`` to the i-th connection; later connections are closed at once."""

    def __init__(self, *scripts: list[Step]) -> None:
        self.scripts = list(scripts)
        self.connections: list[FakeConnection] = []
        self.server: asyncio.Server | None = None
        self.port = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> FakeNsqd:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for writer in self._writers:
            writer.close()
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=2.0)
            for task in pending:
                task.cancel()

    async def __aenter__(self) -> FakeNsqd:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_connection(self, index: int, timeout: float = 5.0) -> FakeConnection:
        """The index-th connection once its script has run to the end."""
        deadline = time.monotonic() + timeout
        while len(self.connections) <= index:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.connections)} connection(s)")
            await asyncio.sleep(0.005)
        conn = self.connections[index]
        await asyncio.wait_for(conn.done.wait(), max(0.0, deadline - time.monotonic()))
        if conn.error is not None:
            raise conn.error
        return conn

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        index = len(self.connections)
        conn = FakeConnection()
        self.connections.append(conn)
        try:
            if index >= len(self.scripts):
                return
            await _Session(conn, self.scripts[index], reader, writer).run()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except BaseException as exc:
            conn.error = exc
            raise
        finally:
            conn.closed = True
            conn.finish()
            writer.close()
            with contextlib.suppress(BaseException):
                await writer.wait_closed()
            self._tasks.discard(task)


class _Session:
    def __init__(
        self,
        conn: FakeConnection,
        script: list[Step],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.conn = conn
        self.script = script
        self.reader = reader
        self.writer = writer
        self.parser = CommandParser(1 << 24, 1 << 24)
        self.compressor: SnappyFrameWriter | DeflateWriter | None = None
        self.decompressor: SnappyFrameReader | DeflateReader | None = None
        self.changed = asyncio.Event()
        self.reading = True

    async def run(self) -> None:
        magic = await self.reader.readexactly(4)
        assert magic == b"  V2", magic
        read_task = asyncio.create_task(self._read_loop())
        script_task = asyncio.create_task(self._run_script())
        try:
            # the client going away ends the script too
            await asyncio.wait([read_task, script_task], return_when=asyncio.FIRST_COMPLETED)
            if script_task.done():
                if script_task.result():
                    self.conn.finish()
                    await read_task  # keep recording until the client goes away
            elif read_task.exception() is not None:
                read_task.result()
        finally:
            for task in (read_task, script_task):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _run_script(self) -> bool:
        """Run every step; False if a step closed the connection."""
        for step in self.script:
            if step.delay:
                await asyncio.sleep(step.delay)
            if not await self._do(step):
                return False
        return True

    async def _do(self, step: Step) -> bool:
        conn = self.conn
        if step.kind == "frame":
            self._send(encode_frame(step.frame_type, step.body))
        elif step.kind == "message":
            while conn.in_flight >= conn.rdy:
                await self._changed()
            conn.in_flight += 1
            self._send(encode_frame(FRAME_TYPE_MESSAGE, step.body))
        elif step.kind == "wait":
            while sum(1 for line in conn.lines if line.startswith(step.prefix)) < step.count:
                await self._changed()
        elif step.kind == "upgrade":
            await self._upgrade(step.body.decode(), step.extra, step.prefix)
        elif step.kind == "close":
            conn.finish()
            return False
        return True

    async def _changed(self) -> None:
        self.changed.clear()
        waiter = asyncio.ensure_future(self.changed.wait())
        try:
            await asyncio.wait_for(waiter, 10.0)
        except TimeoutError:
            raise AssertionError(f"fake nsqd stalled; client sent {self.conn.lines}") from None

    def _send(self, data: bytes) -> None:
        if self.compressor is not None:
            data = self.compressor.compress(data)
        self.writer.write(data)

    async def _upgrade(self, kind: str, context: ssl.SSLContext | None, plain: bytes) -> None:
        ok = encode_frame(FRAME_TYPE_RESPONSE, b"OK")
        if kind == "tls":
            assert context is not None
            await self.writer.drain()
            self.reading = False
            await self.writer.start_tls(context)
            self.reading = True
            self.changed.set()
        elif kind == "snappy":
            self.compressor, self.decompressor = SnappyFrameWriter(), SnappyFrameReader()
        elif kind == "deflate":
            self.compressor, self.decompressor = DeflateWriter(6), DeflateReader()
        else:
            raise ValueError(kind)
        if plain:
            assert self.compressor is not None
            self.writer.write(plain + self.compressor.compress(ok))
        else:
            self._send(ok)

    async def _read_loop(self) -> None:
        conn = self.conn
        while True:
            if not self.reading:
                await asyncio.sleep(0.001)
                continue
            data = await self.reader.read(65536)
            if not data:
                return
            if self.decompressor is not None:
                data = self.decompressor.decompress(data)
            now = time.monotonic()
            for command in self.parser.feed(data):
                line = b" ".join([command.name, *command.params])
                conn.commands.append((now, line))
                if command.body is not None:
                    conn.bodies.setdefault(command.name, []).append(command.body)
                if command.name == cmd.RDY:
                    conn.rdy = int(command.params[0])
                elif command.name in (cmd.FIN, cmd.REQ):
                    conn.in_flight -= 1
                elif command.name == cmd.CLS:
                    self._send(encode_frame(FRAME_TYPE_RESPONSE, b"CLOSE_WAIT"))
            self.changed.set()
