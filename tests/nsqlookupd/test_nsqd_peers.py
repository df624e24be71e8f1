"""nsqd's lookupd peers (nsqpy.nsqd.lookup.LookupPeers) against real nsqlookupd processes,
without an nsqd: registration, notifications, PINGs, reconnects after lookupd restarts,
runtime address changes and channel discovery over HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from tests.raw_v2 import wait_until_async

from nsqpy.internal import lg
from nsqpy.nsqd.lookup import LookupPeers, nsqd_identity
from nsqpy.testing import DaemonProcess, start_nsqlookupd

PING = 0.1


class Logs:
    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []

    def __call__(self, level: int, message: str) -> None:
        self.lines.append((level, message))

    def at(self, level: int) -> list[str]:
        return [message for lvl, message in self.lines if lvl == level]


class Registrations:
    """Stands in for nsqd's topic map: what a (re)connect must register."""

    def __init__(self, *items: tuple[str, str | None]) -> None:
        self.items = list(items)

    def __call__(self) -> list[tuple[str, str | None]]:
        return list(self.items)


def tcp_addr(proc: DaemonProcess) -> str:
    host, port = proc.tcp_address
    return f"{host}:{port}"


def http_addr(proc: DaemonProcess) -> str:
    host, port = proc.http_address
    return f"{host}:{port}"


async def get_json(proc: DaemonProcess, path: str) -> Any:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{proc.http_url}{path}") as resp,
    ):
        return json.loads(await resp.read())


async def post(proc: DaemonProcess, path: str) -> None:
    async with aiohttp.ClientSession() as session, session.post(f"{proc.http_url}{path}") as resp:
        assert resp.status == 200, await resp.text()


async def debug_keys(proc: DaemonProcess) -> set[str]:
    return set(await get_json(proc, "/debug"))


def registered(proc: DaemonProcess, *keys: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return set(keys) <= await debug_keys(proc)

    return check


def unregistered(proc: DaemonProcess, *keys: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return not set(keys) & await debug_keys(proc)

    return check


async def restart_on_same_ports(proc: DaemonProcess, kill: bool = False) -> None:
    tcp, http = proc.tcp_port, proc.http_port
    await asyncio.to_thread(proc.kill if kill else proc.stop)
    proc.args = [*proc.args, f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}"]
    await asyncio.to_thread(proc.start)


@pytest.fixture
async def lookupd() -> AsyncIterator[DaemonProcess]:
    proc = await asyncio.to_thread(start_nsqlookupd)
    try:
        yield proc
    finally:
        await asyncio.to_thread(proc.stop)


@pytest.fixture
async def lookupd2() -> AsyncIterator[DaemonProcess]:
    proc = await asyncio.to_thread(start_nsqlookupd)
    try:
        yield proc
    finally:
        await asyncio.to_thread(proc.stop)


def make_peers(
    addresses: list[str], registrations: Registrations, logs: Logs, **kwargs: Any
) -> LookupPeers:
    identity = nsqd_identity("127.0.0.1", 4150, 4151, hostname="nsqd-host")
    kwargs.setdefault("ping_interval", PING)
    return LookupPeers(addresses, identity, registrations, logs, **kwargs)


async def test_identify_then_register_everything(lookupd: DaemonProcess) -> None:
    logs = Logs()
    peers = make_peers(
        [tcp_addr(lookupd)], Registrations(("t1", None), ("t2", "a"), ("t2", "b")), logs
    )
    await peers.start()
    try:
        await wait_until_async(
            registered(lookupd, "topic:t1:", "topic:t2:", "channel:t2:a", "channel:t2:b")
        )
        [node] = (await get_json(lookupd, "/nodes"))["producers"]
        assert node["hostname"] == "nsqd-host"
        assert node["broadcast_address"] == "127.0.0.1"
        assert (node["tcp_port"], node["http_port"], node["version"]) == (4150, 4151, "1.3.0")
        assert sorted(node["topics"]) == ["t1", "t2"]
        assert "channel:t1:" not in await debug_keys(lookupd)  # a topic without channels

        [peer] = peers.peers
        assert peer.connected
        assert (peer.info.tcp_port, peer.info.http_port) == (lookupd.tcp_port, lookupd.http_port)
        assert (peer.info.broadcast_address, peer.info.version) == ("127.0.0.1", "1.3.0")
        assert peers.lookupd_http_addresses() == [http_addr(lookupd)]
        assert any("peer info" in line for line in logs.at(lg.INFO))
    finally:
        await peers.stop()
    # closing the connection makes lookupd forget this nsqd
    await wait_until_async(unregistered(lookupd, "client::", "topic:t1:"))


async def test_notifications_register_and_unregister(lookupd: DaemonProcess) -> None:
    peers = make_peers([tcp_addr(lookupd)], Registrations(), Logs())
    await peers.start()
    try:
        await wait_until_async(registered(lookupd, "client::"))
        peers.notify("t3", None, register=True)
        await wait_until_async(registered(lookupd, "topic:t3:"))
        peers.notify("t3", "c", register=True)
        peers.notify("t3", "d#ephemeral", register=True)
        await wait_until_async(registered(lookupd, "channel:t3:c", "channel:t3:d#ephemeral"))
        lookup = await get_json(lookupd, "/lookup?topic=t3")
        assert sorted(lookup["channels"]) == ["c", "d#ephemeral"]
        assert len(lookup["producers"]) == 1

        peers.notify("t3", "c", register=False)
        peers.notify("t3", "d#ephemeral", register=False)
        await wait_until_async(unregistered(lookupd, "channel:t3:c", "channel:t3:d#ephemeral"))
        # the ephemeral channel's key is gone, the normal one stays listed
        assert (await get_json(lookupd, "/channels?topic=t3"))["channels"] == ["c"]
        peers.notify("t3", None, register=False)
        await wait_until_async(unregistered(lookupd, "topic:t3:"))
        assert (await get_json(lookupd, "/lookup?topic=t3"))["producers"] == []
        assert peers.peers[0].connected
    finally:
        await peers.stop()


async def test_pings_keep_the_producer_active() -> None:
    proc = await asyncio.to_thread(start_nsqlookupd, "--inactive-producer-timeout=400ms")
    pinging = make_peers([tcp_addr(proc)], Registrations(("pinged", None)), Logs())
    silent = make_peers(
        [tcp_addr(proc)], Registrations(("silent", None)), Logs(), ping_interval=60.0
    )
    try:
        await pinging.start()
        await silent.start()
        await wait_until_async(registered(proc, "topic:pinged:", "topic:silent:"))
        await asyncio.sleep(0.8)
        nodes = (await get_json(proc, "/nodes"))["producers"]
        assert [node["topics"] for node in nodes] == [["pinged"]]
        assert len((await get_json(proc, "/lookup?topic=pinged"))["producers"]) == 1
        assert (await get_json(proc, "/lookup?topic=silent"))["producers"] == []
    finally:
        await pinging.stop()
        await silent.stop()
        await asyncio.to_thread(proc.stop)


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
async def test_reregisters_after_lookupd_restart(lookupd: DaemonProcess, kill: bool) -> None:
    logs = Logs()
    registrations = Registrations(("rt", "ch"))
    peers = make_peers([tcp_addr(lookupd)], registrations, logs)
    await peers.start()
    try:
        await wait_until_async(registered(lookupd, "topic:rt:", "channel:rt:ch"))
        registrations.items.append(("rt2", None))  # nsqd changes while lookupd is away
        await restart_on_same_ports(lookupd, kill=kill)
        await wait_until_async(registered(lookupd, "topic:rt:", "channel:rt:ch", "topic:rt2:"))
        assert peers.peers[0].connected
        assert any("PING" in line for line in logs.at(lg.ERROR))
    finally:
        await peers.stop()


async def test_lookupd_down_at_start_then_up(lookupd: DaemonProcess) -> None:
    address = tcp_addr(lookupd)
    tcp, http = lookupd.tcp_port, lookupd.http_port
    await asyncio.to_thread(lookupd.stop)
    logs = Logs()
    peers = make_peers([address], Registrations(("late", None)), logs)
    await peers.start()
    try:
        await asyncio.sleep(3 * PING)
        assert not peers.peers[0].connected
        assert peers.lookupd_http_addresses() == []
        # a notification while lookupd is away is dropped; the connect registers everything
        peers.notify("late", None, register=True)
        lookupd.args = [*lookupd.args, f"--tcp-address=127.0.0.1:{tcp}"]
        lookupd.args.append(f"--http-address=127.0.0.1:{http}")
        await asyncio.to_thread(lookupd.start)
        await wait_until_async(registered(lookupd, "topic:late:"))
        assert peers.lookupd_http_addresses() == [http_addr(lookupd)]
    finally:
        await peers.stop()


async def test_set_addresses_adds_and_removes_peers(
    lookupd: DaemonProcess, lookupd2: DaemonProcess
) -> None:
    logs = Logs()
    peers = make_peers([tcp_addr(lookupd)], Registrations(("moved", None)), logs)
    await peers.start()
    try:
        await wait_until_async(registered(lookupd, "topic:moved:"))
        peers.set_addresses([tcp_addr(lookupd), tcp_addr(lookupd2)])
        await wait_until_async(registered(lookupd2, "topic:moved:"))
        assert sorted(peers.lookupd_http_addresses()) == sorted(
            [http_addr(lookupd), http_addr(lookupd2)]
        )
        peers.set_addresses([tcp_addr(lookupd2)])
        await wait_until_async(unregistered(lookupd, "topic:moved:", "client::"))
        assert [p.addr for p in peers.peers] == [tcp_addr(lookupd2)]
        assert peers.lookupd_http_addresses() == [http_addr(lookupd2)]
        assert f"LOOKUP({tcp_addr(lookupd)}): removing peer" in logs.at(lg.INFO)
        peers.notify("moved", "ch", register=True)
        await wait_until_async(registered(lookupd2, "channel:moved:ch"))
        assert "channel:moved:ch" not in await debug_keys(lookupd)
    finally:
        await peers.stop()


def query_warnings(logs: Logs) -> list[str]:
    return [line for line in logs.at(lg.WARN) if line.startswith("failed to query")]


async def test_fetch_channels_is_a_sorted_union(
    lookupd: DaemonProcess, lookupd2: DaemonProcess
) -> None:
    await post(lookupd, "/channel/create?topic=ft&channel=x")
    await post(lookupd, "/channel/create?topic=ft&channel=y%23ephemeral")
    await post(lookupd2, "/channel/create?topic=ft&channel=w")
    await post(lookupd2, "/channel/create?topic=ft&channel=x")
    logs = Logs()
    peers = make_peers([tcp_addr(lookupd), tcp_addr(lookupd2)], Registrations(), logs)
    assert await peers.fetch_channels("ft") == []  # nothing identified yet
    assert any("no available nsqlookupd" in line for line in logs.at(lg.ERROR))
    await peers.start()
    try:
        await wait_until_async(registered(lookupd, "client::"))
        await wait_until_async(registered(lookupd2, "client::"))
        assert await peers.fetch_channels("ft") == ["w", "x", "y#ephemeral"]
        assert await peers.fetch_channels("unknown") == []
        assert logs.at(lg.WARN) == []

        await asyncio.to_thread(lookupd2.stop)
        assert await peers.fetch_channels("ft") == ["x", "y#ephemeral"]
        # the peer's reconnect loop may warn about the stopped lookupd too; only the
        # query warnings are this test's business
        [warning] = query_warnings(logs)
        assert warning.startswith("failed to query nsqlookupd for channels to pre-create")
        await asyncio.to_thread(lookupd.stop)
        assert await peers.fetch_channels("ft") == []
        assert "failed to query any nsqlookupd" in query_warnings(logs)[-1]
    finally:
        await peers.stop()


async def test_no_addresses_means_no_lookups() -> None:
    logs = Logs()
    peers = make_peers([], Registrations(("t", None)), logs)
    await peers.start()
    assert peers.peers == []
    peers.notify("t", None, register=True)
    assert await peers.fetch_channels("t") == []
    assert logs.at(lg.ERROR) == []
    await peers.stop()


# --------------------------------------------------------------------------- wire capture


class CapturingListener:
    """A bare socket that records what the peer sends and plays canned replies. It checks the
    client's bytes only; behaviour is tested above against the real nsqlookupd."""

    def __init__(self, replies: list[bytes]) -> None:
        self.replies = replies
        self.received = bytearray()
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        replies = list(self.replies)
        try:
            self.received += await reader.readexactly(4)
            while replies:
                line = await reader.readline()
                self.received += line
                if line.startswith(b"IDENTIFY"):
                    size = await reader.readexactly(4)
                    self.received += size + await reader.readexactly(int.from_bytes(size, "big"))
                reply = replies.pop(0)
                writer.write(len(reply).to_bytes(4, "big") + reply)
                await writer.drain()
            await reader.read()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def test_wire_bytes_of_a_connect() -> None:
    info = (
        b'{"broadcast_address":"lk","hostname":"h","http_port":4161,"tcp_port":4160,'
        b'"version":"1.3.0"}'
    )
    listener = CapturingListener([info, b"OK", b"OK"])
    addr = await listener.start()
    identity = {
        "version": "1.3.0",
        "tcp_port": 4150,
        "http_port": 4151,
        "hostname": "h1",
        "broadcast_address": "b1",
    }
    peers = LookupPeers([addr], identity, Registrations(("a", None), ("b", "c")), Logs())
    await peers.start()
    try:

        async def got_all() -> bool:
            return bytes(listener.received).endswith(b"REGISTER b c\n")

        await wait_until_async(got_all)
        body = (
            b'{"broadcast_address":"b1","hostname":"h1","http_port":4151,"tcp_port":4150,'
            b'"version":"1.3.0"}'
        )
        assert bytes(listener.received) == (
            b"  V1IDENTIFY\n" + len(body).to_bytes(4, "big") + body + b"REGISTER a\nREGISTER b c\n"
        )
        assert peers.lookupd_http_addresses() == ["lk:4161"]
    finally:
        await peers.stop()
        await listener.stop()


async def test_identify_refused_closes_and_retries() -> None:
    listener = CapturingListener([b"E_INVALID"])
    addr = await listener.start()
    logs = Logs()
    peers = make_peers([addr], Registrations(("a", None)), logs)
    await peers.start()
    try:

        async def retried() -> bool:
            return listener.connections >= 2

        await wait_until_async(retried)
        assert b"REGISTER" not in listener.received
        assert f"LOOKUPD({addr}): lookupd returned E_INVALID" in logs.at(lg.INFO)
        assert peers.lookupd_http_addresses() == []
    finally:
        await peers.stop()
        await listener.stop()


def test_identity_helper_defaults_to_the_os_hostname() -> None:
    identity = nsqd_identity("b", 1, 2)
    assert identity == {
        "broadcast_address": "b",
        "hostname": socket.gethostname(),
        "http_port": 2,
        "tcp_port": 1,
        "version": "1.3.0",
    }


async def test_reconnects_are_paced_by_the_ping_interval() -> None:
    # a lookupd that refuses every IDENTIFY: each attempt fails fast, and the next one must
    # still wait for the next tick (no burst of reconnects)
    listener = CapturingListener([b"E_INVALID"])
    addr = await listener.start()
    peers = make_peers([addr], Registrations(), Logs(), ping_interval=0.2)
    await peers.start()
    try:
        await asyncio.sleep(1.0)
        assert 3 <= listener.connections <= 7
    finally:
        await peers.stop()
        await listener.stop()


async def test_dropped_connection_reconnects_with_backoff_not_at_the_next_ping(
    lookupd: DaemonProcess,
) -> None:
    # a ping far beyond the test: only the drop detection can bring the registrations back
    logs = Logs()
    peers = make_peers([tcp_addr(lookupd)], Registrations(("drop", "ch")), logs, ping_interval=60)
    await peers.start()
    try:
        await wait_until_async(registered(lookupd, "topic:drop:", "channel:drop:ch"))
        tcp, http = lookupd.tcp_port, lookupd.http_port
        await asyncio.to_thread(lookupd.kill)

        def retries() -> list[str]:
            return [line for line in logs.at(lg.WARN) if "reconnect failed" in line]

        async def three_refused() -> bool:
            return len(retries()) >= 3

        await wait_until_async(three_refused)  # about 0.1 + 0.2 + 0.4 s after the drop
        delays = [float(line.rsplit("retrying in ", 1)[1].rstrip("s")) for line in retries()]
        assert delays[:3] == [0.2, 0.4, 0.8], delays
        assert f"LOOKUPD({tcp_addr(lookupd)}): connection lost - EOF" in logs.at(lg.ERROR)

        lookupd.args += [f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}"]
        await asyncio.to_thread(lookupd.start)
        await wait_until_async(registered(lookupd, "topic:drop:", "channel:drop:ch"), timeout=5.0)
        assert peers.peers[0].connected
        assert not any("PING" in line for line in logs.at(lg.ERROR))
    finally:
        await peers.stop()
