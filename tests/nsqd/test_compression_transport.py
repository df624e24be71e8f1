"""nsqd snappy and deflate streams negotiated by IDENTIFY, alone and inside TLS (the stream
starts right after the IDENTIFY response, as Go's protocol tests exercise), broken streams and
decompression bombs, and the bounded decompression of
``nsqpy.protocol.compression`` that keeps a bomb from inflating in one piece.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import cramjam
import pytest

from nsqpy.protocol.compression import DeflateReader, DeflateWriter, SnappyFrameReader
from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import (
    SNAPPY_IDENTIFIER,
    NsqConn,
    command,
    mpub_cmd,
    pub_cmd,
    snappy_encode,
    unique,
)
from .nsqd_transport_support import (
    Certs,
    alive,
    client_round_trip,
    client_stats,
    make_certs,
    proc_status_kib,
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def nsqd(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """TLS configured; snappy and deflate are on by default."""
    daemon = start_nsqd(tmp_path_factory.mktemp("nsqd"), *certs.server_flags(), https=True)
    yield daemon
    crashed = daemon.proc is not None and daemon.proc.poll() is not None
    daemon.stop()
    assert not crashed, daemon.log


@pytest.fixture(scope="module")
def featureless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """No TLS configured, ``--snappy=false --deflate=false``."""
    daemon = start_nsqd(tmp_path_factory.mktemp("plain"), "--snappy=false", "--deflate=false")
    yield daemon
    daemon.stop()


@pytest.fixture
def fresh_nsqd(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon of the test's own, so its peak RSS (VmHWM) says what this test cost.

    Its address space is capped at 3 GiB: if a bomb does inflate, nsqd fails, not the machine.
    """
    daemon = start_nsqd(tmp_path, "--mem-queue-size=100")
    resource.prlimit(daemon.pid, resource.RLIMIT_AS, (3 << 30, 3 << 30))
    yield daemon
    daemon.stop()


# --------------------------------------------------------------------------- negotiation

COMBINATIONS: list[tuple[bool, bool, bool]] = [
    (tls, snappy, deflate) for tls, snappy, deflate in itertools.product([False, True], repeat=3)
]


def combo_id(combo: tuple[bool, bool, bool]) -> str:
    names = [n for n, on in zip(("tls", "snappy", "deflate"), combo, strict=True) if on]
    return "+".join(names) or "plain"


def connect(nsqd: DaemonProcess, certs: Certs, tls: bool, snappy: bool, deflate: bool) -> NsqConn:
    conn = NsqConn(nsqd.tcp_address)
    response = conn.negotiate(
        certs.client_context() if tls else None,
        tls_v1=tls,
        snappy=snappy,
        deflate=deflate,
        user_agent="transport-test",
    )
    assert (response["tls_v1"], response["snappy"], response["deflate"]) == (tls, snappy, deflate)
    if snappy:  # as Go's TestSnappy: the server's stream starts with the stream identifier chunk
        assert conn.snappy_decoder is not None
        assert bytes(conn.snappy_decoder.raw).startswith(SNAPPY_IDENTIFIER)
    return conn


@pytest.mark.parametrize("combo", COMBINATIONS, ids=[combo_id(c) for c in COMBINATIONS])
def test_every_combination_publishes_and_consumes(
    nsqd: DaemonProcess, certs: Certs, combo: tuple[bool, bool, bool]
) -> None:
    """As Go's TestDeflate, TestSnappy, TestTLSDeflate and TestTLSSnappy: each upgrade ``OK``
    arrives in the new encoding; both compressions at once are refused, in plain text, before any
    upgrade."""
    tls, snappy, deflate = combo
    if snappy and deflate:
        with NsqConn(nsqd.tcp_address) as conn:
            body = {"feature_negotiation": True, "tls_v1": tls, "snappy": True, "deflate": True}
            conn.send(command("IDENTIFY", json.dumps(body).encode()))
            conn.expect_error("E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")
        return
    topic, channel = unique("combo"), "ch"
    big = os.urandom(128_000)  # incompressible: spans several snappy chunks
    text = b"compressible " * 5_000
    with connect(nsqd, certs, *combo) as consumer, connect(nsqd, certs, *combo) as producer:
        consumer.sub(topic, channel)
        consumer.send(command("RDY 100"))
        producer.pub(topic, big)
        producer.send(mpub_cmd(topic, [text, b"x", b""[:0] + b"y"]))
        producer.expect_ok()
        producer.send(command(f"DPUB {topic} 0", b"deferred"))
        producer.expect_ok()
        received = [consumer.expect_message() for _ in range(5)]
        assert sorted(m.body for m in received) == sorted([big, text, b"x", b"y", b"deferred"])
        consumer.send(b"".join(command("FIN " + m.id.decode()) for m in received))
        producer.pub(topic, b"after the FINs")  # both directions are still in sync
        assert consumer.expect_message().body == b"after the FINs"

        [client] = client_stats(nsqd, topic, channel)
        assert (client["tls"], client["snappy"], client["deflate"]) == combo
        assert client["user_agent"] == "transport-test"  # Go's TestClientAttributes
        assert client["finish_count"] == 5


@pytest.mark.parametrize(
    "requested, deflate, expected", [(0, True, 6), (1, True, 1), (9, True, 6), (1, False, 6)]
)
def test_deflate_level_negotiation(
    nsqd: DaemonProcess, requested: int, deflate: bool, expected: int
) -> None:
    """The level is reported even without deflate; a request above the max is clamped."""
    with NsqConn(nsqd.tcp_address) as conn:
        response = conn.identify_json(deflate=deflate, deflate_level=requested)
        assert (response["deflate_level"], response["max_deflate_level"]) == (expected, 6)
        conn.upgrade(response)
        conn.pub(unique("level"), b"x" * 1000)


def test_features_off_or_unconfigured_answer_false(featureless: DaemonProcess) -> None:
    """No TLS configured and ``--snappy=false --deflate=false``: the connection stays plain
    (asking for both compressions is then no error)."""
    with NsqConn(featureless.tcp_address) as conn:
        response = conn.identify_json(tls_v1=True, snappy=True, deflate=True)
        assert (response["tls_v1"], response["snappy"], response["deflate"]) == (False,) * 3
        conn.upgrade(response)
        conn.pub(unique("plain"), b"still plain")


def test_snappy_reader_accepts_skippable_padding_and_repeated_identifiers(
    nsqd: DaemonProcess,
) -> None:
    with NsqConn(nsqd.tcp_address) as conn:
        conn.upgrade(conn.identify_json(snappy=True))
        skippable = bytes([0x80, 3, 0, 0]) + b"abc"
        padding = bytes([0xFE, 2, 0, 0]) + b"\0\0"
        body = snappy_encode(pub_cmd(unique("skip"), b"m"))  # starts with an identifier again
        conn.send_raw(SNAPPY_IDENTIFIER + skippable + padding + body)
        conn.expect_ok()


def test_commands_split_across_chunks_and_writes(nsqd: DaemonProcess) -> None:
    """A command may end in the middle of a compressed write; nsqd waits for the rest."""
    topic = unique("split")
    for option in ("snappy", "deflate"):
        with NsqConn(nsqd.tcp_address) as conn:
            conn.upgrade(conn.identify_json(**{option: True}))
            data = pub_cmd(topic, b"z" * 70_000) + pub_cmd(topic, b"second")
            for i in range(0, len(data), 9_999):
                conn.send(data[i : i + 9_999])
                time.sleep(0.001)
            conn.expect_ok()
            conn.expect_ok()


# --------------------------------------------------------------------------- nsqpy.client


@pytest.mark.parametrize("option", ["snappy", "deflate"])
async def test_nsqpy_client_with_compression(nsqd: DaemonProcess, option: str) -> None:
    [client] = await client_round_trip(nsqd, unique(f"client_{option}"), **{option: True})
    assert (client["snappy"], client["deflate"], client["tls"]) == (
        option == "snappy",
        option == "deflate",
        False,
    )


async def test_nsqpy_client_with_tls_and_deflate(nsqd: DaemonProcess, certs: Certs) -> None:
    [client] = await client_round_trip(
        nsqd, unique("client_tls_deflate"), tls=certs.client_context(), deflate=True
    )
    assert (client["tls"], client["deflate"]) == (True, True)


# --------------------------------------------------------------------------- broken streams

SNAPPY_BROKEN = {
    "no identifier": snappy_encode(b"NOP\n")[len(SNAPPY_IDENTIFIER) :],
    "reserved chunk type": bytes([0x02, 1, 0, 0, 0]),
    "bad crc": bytes([0x01, 9, 0, 0]) + b"\0\0\0\0" + b"NOP\n\n",
    "bad block": bytes([0x00, 12, 0, 0]) + b"\0\0\0\0" + b"\xff\xff\xff\xff\x0f\x00\x00\x00",
    "chunk too long": bytes([0x00, 0xFF, 0xFF, 0xFF]) + b"\0" * 100,
    "bad identifier": bytes([0xFF, 6, 0, 0]) + b"sNaPpX",
}


@pytest.mark.parametrize("name", sorted(SNAPPY_BROKEN))
def test_broken_snappy_stream_closes_the_connection(nsqd: DaemonProcess, name: str) -> None:
    with NsqConn(nsqd.tcp_address) as conn:
        conn.upgrade(conn.identify_json(snappy=True))
        raw = SNAPPY_BROKEN[name]
        if name not in ("no identifier", "bad identifier"):
            raw = SNAPPY_IDENTIFIER + raw
        conn.send_raw(raw)
        conn.expect_closed()
    assert alive(nsqd)


DEFLATE_BROKEN = {
    "reserved block type": b"\x07" + os.urandom(100),  # BTYPE 11
    "stored length mismatch": b"\x00\x05\x00\x05\x00hello",  # NLEN is not ~LEN
    # "SUB topic channel\n" as one match into a preset dictionary nsqd does not have
    "distance too far back": bytes.fromhex("c21401000000ffff"),
}


@pytest.mark.parametrize("name", sorted(DEFLATE_BROKEN))
def test_broken_deflate_stream_closes_the_connection(nsqd: DaemonProcess, name: str) -> None:
    with NsqConn(nsqd.tcp_address) as conn:
        conn.upgrade(conn.identify_json(deflate=True))
        conn.send_raw(DEFLATE_BROKEN[name])
        conn.expect_closed()
    assert alive(nsqd)


def test_random_garbage_on_compressed_connections(nsqd: DaemonProcess) -> None:
    """Seeded random bytes after each upgrade: nsqd closes or waits, never crashes."""
    for seed in range(40):
        option = ("snappy", "deflate")[seed % 2]
        with NsqConn(nsqd.tcp_address) as conn:
            conn.upgrade(conn.identify_json(**{option: True}))
            garbage = os.urandom(1 + seed * 997 % 20_000)
            try:
                conn.send_raw(garbage)
                conn.sock.settimeout(0.05)
                conn.sock.recv(65536)
            except (TimeoutError, ConnectionResetError, BrokenPipeError):
                pass
    assert alive(nsqd)
    with NsqConn(nsqd.tcp_address) as conn:
        conn.upgrade(conn.identify_json(deflate=True))
        conn.pub(unique("after_garbage"), b"still serving")


# --------------------------------------------------------------------------- bombs

MIB = 1 << 20
#: How much nsqd's peak RSS may grow while it reads a bomb. A plain connection reading the same
#: plain bytes at socket speed stays well inside this.
BOMB_HWM_BUDGET_KIB = 32 * 1024


def deflate_bomb(plain: bytes) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    return z.compress(plain) + z.flush(zlib.Z_SYNC_FLUSH)


def send_bomb(nsqd: DaemonProcess, option: str, wire: bytes) -> tuple[int, int]:
    """Upgrade, send ``wire`` below the compression layer, then a PUB; returns the peak RSS
    growth (KiB) and whether the connection answered the PUB (1) or was closed (0)."""
    before = proc_status_kib(nsqd.pid, "VmHWM")
    answered = 0
    with NsqConn(nsqd.tcp_address) as conn:
        conn.upgrade(conn.identify_json(**{option: True}))
        conn.sock.settimeout(30)
        try:
            conn.send_raw(wire)
            conn.send(pub_cmd("after_bomb", b"x"))
            conn.expect_ok(timeout=30)
            answered = 1
        except (AssertionError, ConnectionResetError, BrokenPipeError):
            pass
    assert alive(nsqd), nsqd.log[-2000:]
    return proc_status_kib(nsqd.pid, "VmHWM") - before, answered


def test_deflate_bomb_of_zeros_does_not_balloon(fresh_nsqd: DaemonProcess) -> None:
    """200 KiB inflating to 200 MiB without a newline: Go fails the line after 4 KiB read."""
    growth, answered = send_bomb(fresh_nsqd, "deflate", deflate_bomb(bytes(200 * MIB)))
    assert answered == 0  # the over-long line closes the connection
    assert growth < BOMB_HWM_BUDGET_KIB, f"peak RSS grew by {growth} KiB"


def test_deflate_bomb_of_commands_does_not_balloon(fresh_nsqd: DaemonProcess) -> None:
    """2 KiB inflating to 2 MiB of ``NOP``: half a million valid commands, run in slices."""
    growth, answered = send_bomb(fresh_nsqd, "deflate", deflate_bomb(b"NOP\n" * (MIB // 2)))
    assert answered == 1
    assert growth < BOMB_HWM_BUDGET_KIB, f"peak RSS grew by {growth} KiB"


def test_snappy_bomb_of_commands_does_not_balloon(fresh_nsqd: DaemonProcess) -> None:
    """Snappy inflates at most ~21x, so a 256 KiB read still makes ~5 MiB of commands."""
    growth, answered = send_bomb(fresh_nsqd, "snappy", snappy_encode(b"NOP\n" * (MIB // 4)))
    assert answered == 1
    assert growth < BOMB_HWM_BUDGET_KIB, f"peak RSS grew by {growth} KiB"


def test_plain_nop_flood_stays_within_the_budget(fresh_nsqd: DaemonProcess) -> None:
    """The reference point for the bomb budget: the same commands without compression."""
    before = proc_status_kib(fresh_nsqd.pid, "VmHWM")
    with NsqConn(fresh_nsqd.tcp_address) as conn:
        conn.sock.settimeout(30)
        conn.send(command("IDENTIFY", b"{}"))
        conn.expect_ok()
        conn.send(b"NOP\n" * (MIB // 2) + pub_cmd("after_flood", b"x"))
        conn.expect_ok(timeout=30)
    growth = proc_status_kib(fresh_nsqd.pid, "VmHWM") - before
    assert growth < BOMB_HWM_BUDGET_KIB, f"peak RSS grew by {growth} KiB"


# --------------------------------------------------------------------------- bounded codecs


def test_deflate_reader_bounds_each_call_and_drains_the_rest() -> None:
    plain = b"NOP\n" * (4 * MIB // 4)
    wire = deflate_bomb(plain)
    reader = DeflateReader()
    out = [reader.decompress(wire, 64 * 1024)]
    assert len(out[0]) == 64 * 1024 and reader.pending
    while reader.pending:
        piece = reader.decompress(b"", 64 * 1024)
        assert len(piece) <= 64 * 1024
        out.append(piece)
    assert b"".join(out) == plain
    assert reader.decompress(b"") == b"" and not reader.pending


def test_deflate_reader_keeps_its_tail_when_more_input_arrives() -> None:
    writer = DeflateWriter(6)
    first, second = writer.compress(b"a" * 100_000), writer.compress(b"b" * 100_000)
    reader = DeflateReader()
    out = reader.decompress(first, 1000)
    out += reader.decompress(second, 1000)  # new input while the first is not drained
    while reader.pending:
        out += reader.decompress(b"", 50_000)
    assert out == b"a" * 100_000 + b"b" * 100_000


def test_deflate_reader_unbounded_by_default() -> None:
    assert DeflateReader().decompress(deflate_bomb(bytes(MIB))) == bytes(MIB)


def test_snappy_reader_bounds_each_call_by_whole_chunks() -> None:
    plain = os.urandom(20_000) + b"NOP\n" * 100_000  # incompressible then 21x chunks
    wire = bytes(cramjam.snappy.compress(plain))
    reader = SnappyFrameReader()
    out = [reader.decompress(wire, 100_000)]
    assert 0 < len(out[0]) <= 100_000 and reader.pending
    while reader.pending:
        piece = reader.decompress(b"", 100_000)
        assert 0 < len(piece) <= 100_000
        out.append(piece)
    assert b"".join(out) == plain
    # a chunk bigger than the bound still comes out whole (progress is guaranteed)
    reader = SnappyFrameReader()
    assert reader.decompress(bytes(cramjam.snappy.compress(b"x" * 60_000)), 10) == b"x" * 60_000
    assert not reader.pending
