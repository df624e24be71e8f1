"""NSQLookupd as a library inside this event loop, with an injected clock: inactivity and
tombstone expiry exactly at their boundaries, without sleeping."""

from __future__ import annotations

import asyncio
import io
import json
import struct
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from nsqpy.internal import lg
from nsqpy.nsqlookupd import NSQLookupd, Options

IDENTIFY_BODY = b'{"broadcast_address":"node","http_port":4151,"tcp_port":4150,"version":"1.3.0"}'
IDENTIFY = b"IDENTIFY\n" + struct.pack(">i", len(IDENTIFY_BODY)) + IDENTIFY_BODY


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Peer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def command(self, data: bytes) -> bytes:
        self.writer.write(data)
        header = await asyncio.wait_for(self.reader.readexactly(4), 5)
        (size,) = struct.unpack(">i", header)
        return await asyncio.wait_for(self.reader.readexactly(size), 5)


@pytest.fixture
async def env() -> AsyncIterator[tuple[NSQLookupd, FakeClock, aiohttp.ClientSession]]:
    clock = FakeClock(1_000_000.0)
    options = Options(
        tcp_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        broadcast_address="lookupd.example",
        inactive_producer_timeout=10.0,
        tombstone_lifetime=5.0,
    )
    logger = lg.Logger("[test] ", lg.INFO, stream=io.StringIO())
    async with NSQLookupd(options, clock=clock, logger=logger) as lookupd:
        host, port = lookupd.real_http_address
        async with aiohttp.ClientSession(base_url=f"http://{host}:{port}") as session:
            yield lookupd, clock, session


async def connect(lookupd: NSQLookupd) -> Peer:
    peer = Peer(*await asyncio.open_connection(*lookupd.real_tcp_address))
    peer.writer.write(b"  V1")
    return peer


async def get(session: aiohttp.ClientSession, path: str) -> Any:
    async with session.get(path) as resp:
        assert resp.status == 200
        return json.loads(await resp.read())


async def producers(session: aiohttp.ClientSession, topic: str) -> int:
    return len((await get(session, f"/lookup?topic={topic}"))["producers"])


async def test_identify_reply_uses_real_ports_and_options(env: Any) -> None:
    lookupd, _, _ = env
    peer = await connect(lookupd)
    reply = json.loads(await peer.command(IDENTIFY))
    assert reply["broadcast_address"] == "lookupd.example"
    assert reply["tcp_port"] == lookupd.real_tcp_address[1]
    assert reply["http_port"] == lookupd.real_http_address[1]
    assert reply["hostname"] == lookupd.hostname
    peer.writer.close()


async def test_inactivity_boundary_and_ping(env: Any) -> None:
    lookupd, clock, session = env
    peer = await connect(lookupd)
    await peer.command(IDENTIFY)
    assert await peer.command(b"REGISTER t\n") == b"OK"

    clock.now += 10.0  # exactly the timeout: still active
    assert await producers(session, "t") == 1
    assert len((await get(session, "/nodes"))["producers"]) == 1
    clock.now += 0.001
    assert await producers(session, "t") == 0
    assert (await get(session, "/nodes"))["producers"] == []

    assert await peer.command(b"PING\n") == b"OK"
    assert await producers(session, "t") == 1
    [record] = (await get(session, "/debug"))["client::"]
    assert record["last_update"] == round(clock.now * 1e9)
    peer.writer.close()


async def test_tombstone_boundary(env: Any) -> None:
    lookupd, clock, session = env
    peer = await connect(lookupd)
    await peer.command(IDENTIFY)
    assert await peer.command(b"REGISTER t\n") == b"OK"
    assert await peer.command(b"REGISTER u\n") == b"OK"
    async with session.post("/topic/tombstone?topic=t&node=node:4151") as resp:
        assert resp.status == 200
    tombstoned_at = clock.now
    clock.now += 4.5
    assert await producers(session, "t") == 0
    assert await producers(session, "u") == 1
    [node] = (await get(session, "/nodes"))["producers"]
    assert dict(zip(node["topics"], node["tombstones"], strict=True)) == {"t": True, "u": False}
    [record] = (await get(session, "/debug"))["topic:t:"]
    assert record["tombstoned_at"] == round(tombstoned_at * 1e9)

    clock.now += 0.5  # the lifetime has passed: the producer is back, the flag stays
    assert await producers(session, "t") == 1
    [node] = (await get(session, "/nodes"))["producers"]
    assert node["tombstones"] == [False, False]
    assert (await get(session, "/debug"))["topic:t:"][0]["tombstoned"] is True
    peer.writer.close()


async def test_stop_closes_nsqd_connections() -> None:
    options = Options(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0")
    lookupd = NSQLookupd(options, logger=lg.Logger("", lg.FATAL, stream=io.StringIO()))
    await lookupd.start()
    peer = await connect(lookupd)
    assert await peer.command(b"PING\n") == b"OK"
    await lookupd.stop()
    assert await asyncio.wait_for(peer.reader.read(), 5) == b""
    peer.writer.close()
