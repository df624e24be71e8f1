"""nsqd's Connection in process: the input's turns and pauses, the output buffer and when it is
flushed, heartbeats and a compression upgrade, under a client that only records.

The connection is the real one on an in-process NSQD (for its loop, logger, clock and
limits); the client above it is a stand-in for ClientV2 that answers each command with a
response frame, and the transport below it keeps every write apart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from nsqpy.nsqd.connection import TURN_BUDGET, TURN_STEP, Connection
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.tls import TLSSession
from nsqpy.protocol import (
    FRAME_HEARTBEAT,
    FRAME_OK,
    MAGIC_V2,
    FrameDecoder,
    encode_error,
    encode_response,
)
from nsqpy.protocol import commands as cmd
from nsqpy.protocol.commands import Command
from nsqpy.protocol.compression import SnappyFrameReader, SnappyFrameWriter

from .in_process_support import FakeClock, RecordingTransport

#: How long a test waits for a timer of a few tens of milliseconds to fire on a loaded machine.
TIMER_WAIT = 5.0


class WriteKeepingTransport(RecordingTransport):
    """A transport that also keeps each ``write`` call's bytes apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        super().write(data)
        self.writes.append(bytes(data))


class Paused:
    def __init__(self) -> None:
        self.paused = False


class RecordingClient:
    """What a connection carries, reduced to records: each command it runs is answered with a
    response frame of its name, after ``on_command`` (which ends the batch by returning True:
    a command that waits)."""

    def __init__(self) -> None:
        self.ready_count = 0
        self.in_flight_count = 0
        self.channel: Paused | None = Paused()
        self.heartbeat_interval = 0.0
        self.output_buffer_size = 16 * 1024
        self.output_buffer_timeout = 0.5
        self.connection: Connection | None = None
        self.ran: list[bytes] = []
        self.on_command: Callable[[Command, list[Command]], bool] | None = None
        self.before_body: list[bytes] = []
        self.truncated: list[tuple[bytes, bytes | None]] = []
        self.compression = ""
        self.host = ""
        self.closed_calls = 0

    def connected_from(self, host: str) -> None:
        self.host = host

    def run_commands(self, commands: list[Command]) -> None:
        conn = self.connection
        assert conn is not None
        for index, command in enumerate(commands):
            conn.begin_command()
            self.ran.append(command.name)
            if self.on_command is not None and self.on_command(command, commands[index + 1 :]):
                return
            conn.send_frame(encode_response(command.name))

    def check_before_body(self, name: bytes, params: list[bytes]) -> None:
        self.before_body.append(name)

    def report_truncated(self, name: bytes, params: list[bytes], partial: bytes | None) -> None:
        self.truncated.append((name, partial))

    def tls_established(self, session: TLSSession) -> None:
        raise AssertionError("no TLS here")

    def compression_started(self, compression: str) -> None:
        self.compression = compression

    def connection_closed(self) -> None:
        self.closed_calls += 1


def connect(
    nsqd: NSQD, configure: Callable[[RecordingClient], None] | None = None
) -> tuple[Connection, RecordingClient, WriteKeepingTransport]:
    client = RecordingClient()
    if configure is not None:
        configure(client)
    conn = client.connection = Connection(client, nsqd)
    transport = WriteKeepingTransport()
    transport.protocol = conn
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, client, transport


def frames(data: bytes) -> list[bytes]:
    return [frame.data for frame in FrameDecoder().feed(data)]


async def until(condition: Callable[[], bool], timeout: float = TIMER_WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        await asyncio.sleep(0.005)


async def test_the_commands_of_one_read_are_answered_in_one_write(nsqd: NSQD) -> None:
    conn, client, transport = connect(nsqd)
    assert client.host == "127.0.0.1" and conn.remote_address == "127.0.0.1:40000"
    conn.data_received(MAGIC_V2 + cmd.nop() + cmd.rdy(1) + cmd.cls())
    assert client.ran == [b"NOP", b"RDY", b"CLS"]
    assert transport.writes == [
        encode_response(b"NOP") + encode_response(b"RDY") + encode_response(b"CLS")
    ]
    assert conn.bytes_received == len(MAGIC_V2 + cmd.nop() + cmd.rdy(1) + cmd.cls())
    assert conn.bytes_sent == len(transport.written)


async def test_a_response_goes_before_the_messages_its_own_command_delivered(
    nsqd: NSQD,
) -> None:
    conn, client, transport = connect(nsqd)
    conn.out.append(b"earlier-message")  # buffered before the command: it goes first

    def deliver_while_running(command: Command, rest: list[Command]) -> bool:
        conn.out.append(b"delivered-by-the-command")
        return False

    client.on_command = deliver_while_running
    conn.data_received(MAGIC_V2 + cmd.nop())
    assert transport.writes == [
        b"earlier-message" + encode_response(b"NOP") + b"delivered-by-the-command"
    ]


async def test_a_bad_magic_is_answered_with_E_BAD_PROTOCOL_and_closed(nsqd: NSQD) -> None:
    conn, client, transport = connect(nsqd)
    conn.data_received(b"  V1" + cmd.nop())
    assert transport.written == encode_error(b"E_BAD_PROTOCOL")
    assert client.ran == []
    assert conn.closed and transport.closed


async def test_input_past_its_turn_budget_waits_for_later_turns_with_reading_paused(
    nsqd: NSQD,
) -> None:
    def slow_batch(command: Command, rest: list[Command]) -> bool:
        if not rest:  # the last command of each parsed step spends the whole budget
            time.sleep(TURN_BUDGET * 1.5)
        return False

    conn, client, transport = connect(nsqd)
    client.on_command = slow_batch
    conn.data_received(MAGIC_V2 + cmd.nop() * (3 * TURN_STEP))
    assert len(client.ran) == TURN_STEP, "one step ran, the rest waits"
    assert not transport.reading
    await asyncio.sleep(0)
    assert len(client.ran) == 2 * TURN_STEP, "the next step ran on the next loop turn"
    await until(lambda: len(client.ran) == 3 * TURN_STEP)
    assert transport.reading


async def test_a_waiting_command_holds_the_rest_until_the_client_resumes_the_input(
    nsqd: NSQD,
) -> None:
    held: list[list[Command]] = []

    def wait_on_auth(command: Command, rest: list[Command]) -> bool:
        if command.name != b"AUTH_LIKE":
            return False
        conn.suspend_input()
        held.append(rest)
        return True

    conn, client, transport = connect(nsqd)
    client.on_command = wait_on_auth
    conn.data_received(MAGIC_V2 + b"AUTH_LIKE\n" + cmd.nop())
    conn.data_received(cmd.rdy(1))
    assert client.ran == [b"AUTH_LIKE"]
    assert not transport.reading
    (rest,) = held
    conn.resume_input(rest)
    assert client.ran == [b"AUTH_LIKE", b"NOP", b"RDY"]
    assert transport.reading


async def test_a_header_without_its_body_and_an_end_inside_a_command_reach_the_client(
    nsqd: NSQD,
) -> None:
    conn, client, _transport = connect(nsqd)
    conn.data_received(MAGIC_V2 + b"PUB t\n")
    assert client.before_body == [b"PUB"]
    conn.data_received(b"\x00\x00\x00\x05ab")
    assert conn.eof_received() is False
    assert client.truncated == [(b"PUB", b"ab")]


async def test_a_peer_that_stops_reading_stops_being_read_and_is_aborted_on_close(
    nsqd: NSQD,
) -> None:
    conn, client, transport = connect(nsqd)
    conn.data_received(MAGIC_V2)
    conn.pause_writing()
    assert not transport.reading
    conn.data_received(cmd.nop())
    assert client.ran == [], "its input waits until it reads"
    conn.resume_writing()
    assert client.ran == [b"NOP"] and transport.reading
    conn.pause_writing()
    conn.close()
    assert transport.closed
    await until(lambda: client.closed_calls == 1)


async def test_deliveries_are_flushed_at_once_when_the_client_is_full_else_on_the_timer(
    nsqd: NSQD,
) -> None:
    conn, client, transport = connect(nsqd)
    client.ready_count = 2
    client.in_flight_count = 1
    conn.out.append(b"m1")
    conn.out_len += 2
    conn.after_deliveries()
    await asyncio.sleep(0)
    assert transport.written == b"", "below RDY: it waits for the output-buffer timer"
    await until(lambda: transport.written == b"m1")
    client.in_flight_count = 2
    conn.out.append(b"m2")
    conn.out_len += 2
    conn.after_deliveries()
    assert transport.written == b"m1"
    await asyncio.sleep(0)
    assert transport.written == b"m1m2", "at its RDY: flushed on the next loop turn"


async def test_heartbeats_go_out_and_two_missed_close_the_connection(
    nsqd: NSQD, clock: FakeClock
) -> None:
    def beat_fast(client: RecordingClient) -> None:
        client.heartbeat_interval = 0.02

    conn, _client, transport = connect(nsqd, beat_fast)
    await until(lambda: FRAME_HEARTBEAT in transport.writes)
    clock.advance(0.05)  # nothing read for two intervals
    await until(lambda: conn.closed)
    assert transport.closed


async def test_a_snappy_upgrade_answers_OK_compressed_and_reads_compressed_input(
    nsqd: NSQD,
) -> None:
    conn, client, transport = connect(nsqd)
    conn.data_received(MAGIC_V2)
    conn.send_frame(encode_response(b"{}"))  # the IDENTIFY response, sent in plain text
    conn.start_upgrades(None, "snappy", 0)
    assert client.compression == "snappy"
    plain, compressed = transport.writes
    assert frames(plain) == [b"{}"]
    assert SnappyFrameReader().decompress(compressed) == FRAME_OK
    conn.data_received(SnappyFrameWriter().compress(cmd.nop()))
    assert client.ran == [b"NOP"]
    reader = SnappyFrameReader()
    assert frames(reader.decompress(b"".join(transport.writes[1:]))) == [b"OK", b"NOP"]
