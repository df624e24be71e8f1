"""nsqd's side of nsqlookupd: one peer per ``--lookupd-tcp-address`` (Go: nsqd/lookup.go,
nsqd/lookup_peer.go).

:class:`LookupPeers` is standalone: nsqd hands it plain values and callables.

    peers = LookupPeers(
        options.nsqlookupd_tcp_addresses,
        nsqd_identity(options.broadcast_address, tcp_port, http_port),
        registrations=lambda: [("t", None), ("t2", "ch")],  # every topic / topic+channel now
        log=logger.log,
    )
    await peers.start()
    peers.notify("t", None, register=True)        # a topic was created
    peers.notify("t2", "ch", register=False)      # a channel was deleted
    channels = await peers.fetch_channels("t3")   # for channel pre-creation
    peers.set_addresses([...])                    # PUT /config/nsqlookupd_tcp_addresses
    await peers.stop()

Each peer is a task that runs its commands in order over one connection. It connects lazily:
when it is added and then whenever a command finds it disconnected; every (re)connect sends the
magic, IDENTIFY, then REGISTER for all current topics and channels. A PING every
``ping_interval`` (15 s) keeps lookupd's inactivity timer fresh and drives reconnects. A failed
command closes the connection; commands queued while the peer cannot connect are dropped,
because the next connect registers the whole current state anyway.

Names are resolved again on every connect, and once per ping interval a peer checks that its
name still leads to the address it is connected to; when it no longer does, the peer reconnects
to the new address (nsqio/nsq#1233: lookupd moved, e.g. a rescheduled pod).

Unlike Go, which notices a lookupd restart only when its next command (at worst the next PING)
fails, a peer also watches its idle connection: lookupd never speaks unprompted, so EOF or stray
bytes mean it is gone. Such a drop, or a command failing on an established connection, starts
reconnect attempts after ``RECONNECT_DELAY``, doubling up to the ping interval, until one
succeeds; a restarted lookupd so gets the registrations back within about a second.

All methods must be called from the event loop's thread.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .. import NSQ_VERSION
from ..internal import lg
from ..internal.api_client import ApiClient, api_url
from ..internal.net import join_host_port
from ..protocol.frames import MAGIC_V1
from ..protocol.lookup import (
    E_INVALID,
    LookupdInfo,
    decode_sized_length,
    identify,
    parse_identify_response,
    ping,
)
from ..protocol.lookup import register as register_command
from ..protocol.lookup import unregister as unregister_command

LogFunc = Callable[[int, str], None]
Identity = Mapping[str, Any] | Callable[[], Mapping[str, Any]]
RegistrationsFunc = Callable[[], Iterable[tuple[str, str | None]]]

DEFAULT_PING_INTERVAL = 15.0
DIAL_TIMEOUT = 1.0
IO_TIMEOUT = 1.0
DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024
#: first pause before reconnecting after a dropped connection (it doubles per failed attempt)
RECONNECT_DELAY = 0.1


def nsqd_identity(
    broadcast_address: str,
    tcp_port: int,
    http_port: int,
    hostname: str | None = None,
    version: str = NSQ_VERSION,
) -> dict[str, Any]:
    """The IDENTIFY body Go nsqd sends (its keys go out alphabetically)."""
    return {
        "broadcast_address": broadcast_address,
        "hostname": hostname if hostname is not None else socket.gethostname(),
        "http_port": http_port,
        "tcp_port": tcp_port,
        "version": version,
    }


def _split_address(addr: str) -> tuple[str, str]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), port


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _describe(cmd: bytes) -> str:
    """A command as go-nsq's ``Command.String()`` prints it: its line, without a body."""
    return cmd.split(b"\n", 1)[0].decode("utf-8", "replace")


class _ConnectFailed(Exception):
    pass


class LookupPeer:
    """One nsqlookupd: its connection, its command queue and what its IDENTIFY reply said."""

    __slots__ = (
        "_closed",
        "_owner",
        "_peer_ip",
        "_queue",
        "_reader",
        "_retry_at",
        "_retry_delay",
        "_task",
        "_wakeup",
        "_writer",
        "addr",
        "connected",
        "info",
    )

    def __init__(self, addr: str, owner: LookupPeers) -> None:
        self.addr = addr
        self.connected = False
        #: from the last IDENTIFY reply; kept across disconnects, as Go does
        self.info = LookupdInfo()
        self._owner = owner
        self._closed = False
        self._queue: deque[tuple[bytes | None, str]] = deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        #: when to try reconnecting after a dropped connection (None: not reconnecting)
        self._retry_at: float | None = None
        self._retry_delay = RECONNECT_DELAY
        #: the IP the last connection reached (to log when the name moves elsewhere)
        self._peer_ip = ""

    def __repr__(self) -> str:
        return f"LookupPeer({self.addr!r}, connected={self.connected})"

    @property
    def http_address(self) -> str | None:
        if not self.info.broadcast_address:
            return None
        return join_host_port(self.info.broadcast_address, self.info.http_port)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.enqueue(None, "")  # Go: lookupPeer.Command(nil) starts the connection
        self._task = asyncio.get_running_loop().create_task(self._run())

    def cancel(self) -> asyncio.Task[None] | None:
        # The flag as well as the cancel: Python 3.11's wait_for can swallow a cancellation
        # that races with its inner future finishing.
        self._closed = True
        self._wakeup.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    def enqueue(self, cmd: bytes | None, label: str) -> None:
        self._queue.append((cmd, label))
        self._wakeup.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._owner.ping_interval
        next_ping = loop.time() + interval
        try:
            while not self._closed:
                while self._queue and not self._closed:
                    cmd, label = self._queue.popleft()
                    if cmd is not None:
                        self._owner.log(lg.INFO, f"LOOKUPD({self.addr}): {label}{_describe(cmd)}")
                    await self.command(cmd)
                if self._closed:
                    # cancel() during a command whose wait_for swallowed the cancellation:
                    # _idle would clear the wake-up and hold the connection for a ping interval
                    break
                now = loop.time()
                if now >= next_ping:
                    # a ticker: on schedule, but never a burst after a slow round trip
                    next_ping += interval
                    if next_ping <= now:
                        next_ping = now + interval
                    await self._follow_name()
                    self._owner.log(lg.DEBUG, f"LOOKUPD({self.addr}): sending heartbeat")
                    await self.command(ping())
                    continue
                retry_at = self._retry_at
                if retry_at is not None and now >= retry_at:
                    await self._reconnect()
                    continue
                wake_at = next_ping if retry_at is None else min(next_ping, retry_at)
                await self._idle(wake_at - now)
        finally:
            self._disconnect()

    async def _idle(self, timeout: float) -> None:
        """Wait for a queued command or ``timeout``, noticing meanwhile if lookupd hangs up."""
        self._wakeup.clear()
        waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._wakeup.wait())]
        reader = self._reader if self.connected else None
        if reader is not None:
            waiters.append(asyncio.ensure_future(reader.read(1)))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            # the cancelled read must be over before a command reads the same stream
            await asyncio.wait(waiters)
        if reader is None or reader is not self._reader:
            return
        watch = waiters[1]
        if watch.cancelled():
            return
        exc = watch.exception()
        if exc is not None:
            reason = _error_text(exc)
        else:
            data = watch.result()
            reason = "EOF" if not data else f"unexpected data {data!r}"
        self._owner.log(lg.ERROR, f"LOOKUPD({self.addr}): connection lost - {reason}")
        self._disconnect()
        self._schedule_reconnect()

    def _schedule_reconnect(self) -> None:
        self._retry_at = asyncio.get_running_loop().time() + self._retry_delay

    async def _reconnect(self) -> None:
        """One attempt after a dropped connection; on failure wait twice as long next time."""
        if self.connected:
            self._retry_at = None
            return
        try:
            await self._connect()
        except (OSError, TimeoutError, _ConnectFailed) as exc:
            self._disconnect()
            self._retry_delay = min(self._retry_delay * 2, self._owner.ping_interval)
            self._schedule_reconnect()
            self._owner.log(
                lg.WARN,
                f"LOOKUPD({self.addr}): reconnect failed - {_error_text(exc)}; "
                f"retrying in {self._retry_delay:g}s",
            )
            return
        self._reconnected()

    def _reconnected(self) -> None:
        self._retry_at = None
        self._retry_delay = RECONNECT_DELAY

    # ------------------------------------------------------------------ commands

    async def command(self, cmd: bytes | None) -> bytes | None:
        """One round trip, connecting first if needed (Go: ``lookupPeer.Command``).

        Errors are logged and close the connection; the result is then None.
        """
        log = self._owner.log
        if not self.connected:
            try:
                await self._connect()
            except (OSError, TimeoutError, _ConnectFailed) as exc:
                self._disconnect()
                self._queue.clear()  # the next successful connect registers everything
                if cmd is not None:
                    log(lg.ERROR, f"LOOKUPD({self.addr}): {_describe(cmd)} - {_error_text(exc)}")
                return None
            self._reconnected()
        if cmd is None:
            return None
        try:
            return await self._round_trip(cmd)
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
            log(lg.ERROR, f"LOOKUPD({self.addr}): {_describe(cmd)} - {_error_text(exc)}")
            self._disconnect()
            self._schedule_reconnect()
            return None

    async def _connect(self) -> None:
        owner = self._owner
        owner.log(lg.INFO, f"LOOKUP connecting to {self.addr}")
        host, port = _split_address(self.addr)
        # The name is resolved again on every connect (open_connection asks the resolver each
        # time; nothing caches it), so a lookupd whose IP changed is found at its new address
        # on the next reconnect: nsqio/nsq#1233.
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancel that
        # comes as the connect fails, and stop() would then wait for this loop forever
        async with asyncio.timeout(owner.dial_timeout):
            reader, writer = await asyncio.open_connection(host, port)
        self._note_peer_ip(writer)
        self._reader, self._writer = reader, writer
        self.connected = True
        writer.write(MAGIC_V1)
        await self._on_connect()

    async def _follow_name(self) -> None:
        """Once per ping interval: when the name no longer resolves to the address this
        connection reached, drop it, so that the PING that follows connects (and registers
        everything) where the name leads now, even if the old lookupd still answers (#1233)."""
        host, port = _split_address(self.addr)
        if not self.connected or not self._peer_ip or _is_ip_literal(host):
            return
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._owner.dial_timeout):
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError):
            return  # a resolver hiccup is no reason to leave a working lookupd
        if self._peer_ip in {str(info[4][0]) for info in infos}:
            return
        self._owner.log(
            lg.INFO, f"LOOKUP {self.addr} no longer resolves to {self._peer_ip}: reconnecting"
        )
        self._disconnect()
        self._schedule_reconnect()

    def _note_peer_ip(self, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        peer_ip = str(peer[0]) if isinstance(peer, tuple) else ""
        if self._peer_ip and peer_ip and peer_ip != self._peer_ip:
            self._owner.log(
                lg.INFO, f"LOOKUP {self.addr} now resolves to {peer_ip} (was {self._peer_ip})"
            )
        self._peer_ip = peer_ip or self._peer_ip

    async def _on_connect(self) -> None:
        """IDENTIFY, then REGISTER everything (Go: ``connectCallback``)."""
        owner = self._owner
        log = owner.log
        cmd = identify(owner.identity())
        response = await self._callback_round_trip(cmd)
        if response == E_INVALID:
            log(lg.INFO, f"LOOKUPD({self.addr}): lookupd returned {response.decode()}")
            raise _ConnectFailed("lookupPeer connectCallback() failed")
        try:
            self.info = parse_identify_response(response)
        except ValueError:
            text = response.decode("utf-8", "replace")
            log(lg.ERROR, f"LOOKUPD({self.addr}): parsing response - {text}")
            raise _ConnectFailed("lookupPeer connectCallback() failed") from None
        log(lg.INFO, f"LOOKUPD({self.addr}): peer info {self.info!r}")
        if not self.info.broadcast_address:
            log(lg.ERROR, f"LOOKUPD({self.addr}): no broadcast address")
        for topic, channel in list(owner.registrations()):
            cmd = register_command(topic, channel)
            log(lg.INFO, f"LOOKUPD({self.addr}): {_describe(cmd)}")
            await self._callback_round_trip(cmd)

    async def _callback_round_trip(self, cmd: bytes) -> bytes:
        try:
            return await self._round_trip(cmd)
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
            self._owner.log(
                lg.ERROR, f"LOOKUPD({self.addr}): {_describe(cmd)} - {_error_text(exc)}"
            )
            raise _ConnectFailed("lookupPeer connectCallback() failed") from exc

    async def _round_trip(self, cmd: bytes) -> bytes:
        reader, writer = self._reader, self._writer
        if reader is None or writer is None:
            raise ConnectionResetError("not connected")
        timeout = self._owner.io_timeout
        writer.write(cmd)
        async with asyncio.timeout(timeout):
            await writer.drain()
        async with asyncio.timeout(timeout):
            size = decode_sized_length(await reader.readexactly(4))
        limit = self._owner.max_body_size
        if size > limit:
            raise ValueError(f"response body size ({size}) is greater than limit ({limit})")
        if size < 0:
            raise ValueError(f"invalid response body size ({size})")
        async with asyncio.timeout(timeout):
            return await reader.readexactly(size)

    def _disconnect(self) -> None:
        self.connected = False
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "i/o timeout"
    if isinstance(exc, asyncio.IncompleteReadError):
        return "EOF"
    return str(exc) or type(exc).__name__


class LookupPeers:
    """nsqd's set of nsqlookupd peers (Go: ``NSQD.lookupLoop`` and ``lookupdHTTPAddrs``)."""

    def __init__(
        self,
        addresses: Iterable[str],
        identity: Identity,
        registrations: RegistrationsFunc,
        log: LogFunc,
        *,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        dial_timeout: float = DIAL_TIMEOUT,
        io_timeout: float = IO_TIMEOUT,
        max_body_size: int = DEFAULT_MAX_BODY_SIZE,
        http_connect_timeout: float = 2.0,
        http_request_timeout: float = 5.0,
    ) -> None:
        self._identity = identity
        self.registrations = registrations
        self.log = log
        self.ping_interval = ping_interval
        self.dial_timeout = dial_timeout
        self.io_timeout = io_timeout
        self.max_body_size = max_body_size
        self.http_connect_timeout = http_connect_timeout
        self.http_request_timeout = http_request_timeout
        self._addresses = list(addresses)
        self._peers: list[LookupPeer] = []
        self._closing: set[asyncio.Task[None]] = set()
        # no DNS cache: lookupd's broadcast address is often a name that can move (#1233)
        self._http = ApiClient(http_connect_timeout, http_request_timeout, dns_cache=False)
        self._started = False
        #: set by leave(): no connection, no reconnect, no registration until stop()
        self._left = False

    def identity(self) -> Mapping[str, Any]:
        identity = self._identity
        return identity() if callable(identity) else identity

    @property
    def peers(self) -> list[LookupPeer]:
        return list(self._peers)

    @property
    def addresses(self) -> list[str]:
        return list(self._addresses)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._started = True
        self._reconcile()

    async def stop(self) -> None:
        self._started = False
        self.log(lg.INFO, "LOOKUP: closing")
        tasks = [task for peer in self._peers if (task := peer.cancel()) is not None]
        tasks.extend(self._closing)
        self._peers = []
        self._closing.clear()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._http.close()

    def leave(self) -> None:
        """Close every lookupd connection and stay away (nsqpy drain, docs/beyond-go.md).

        nsqlookupd drops a peer whose connection closes, with all its registrations, so the
        node leaves ``/nodes`` at once instead of lingering there with no topics. Later
        notifications and address changes are ignored. The peers (and so
        :meth:`lookupd_http_addresses`, for channel pre-creation) stay known; :meth:`stop`
        waits for the closing tasks.
        """
        if self._left:
            return
        self._left = True
        self.log(lg.INFO, "LOOKUP: leaving every nsqlookupd (draining)")
        for peer in self._peers:
            task = peer.cancel()
            if task is not None:
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    def set_addresses(self, addresses: Iterable[str]) -> None:
        """New ``--lookupd-tcp-address`` list: drop peers no longer listed, add new ones."""
        self._addresses = list(addresses)
        if self._started and not self._left:
            self._reconcile()

    def _reconcile(self) -> None:
        kept: list[LookupPeer] = []
        for peer in self._peers:
            if peer.addr in self._addresses:
                kept.append(peer)
                continue
            self.log(lg.INFO, f"LOOKUP({peer.addr}): removing peer")
            task = peer.cancel()
            if task is not None:
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        known = {peer.addr for peer in kept}
        for addr in self._addresses:
            if addr in known:
                continue
            self.log(lg.INFO, f"LOOKUP({addr}): adding peer")
            peer = LookupPeer(addr, self)
            peer.start()
            kept.append(peer)
            known.add(addr)
        self._peers = kept

    # ------------------------------------------------------------------ notifications

    def notify(self, topic: str, channel: str | None, register: bool) -> None:
        """A topic (``channel`` None) or channel was created (``register``) or deleted."""
        if not self._started or self._left:
            return  # the first connect registers whatever exists by then
        encode = register_command if register else unregister_command
        cmd = encode(topic, channel)
        label = "channel " if channel else "topic "
        for peer in self._peers:
            peer.enqueue(cmd, label)

    # ------------------------------------------------------------------ HTTP side

    def lookupd_http_addresses(self) -> list[str]:
        """``<broadcast_address>:<http_port>`` of every peer that has answered IDENTIFY."""
        return [addr for peer in self._peers if (addr := peer.http_address) is not None]

    async def fetch_channels(self, topic: str) -> list[str]:
        """The channels lookupds know for ``topic`` (sorted union), for channel pre-creation.

        Includes ``#ephemeral`` channels: the caller skips those. Errors are logged.
        """
        addresses = self.lookupd_http_addresses()
        if not addresses:
            if self._addresses:
                self.log(
                    lg.ERROR,
                    f"no available nsqlookupd to query for channels to pre-create for topic "
                    f"{topic}",
                )
            return []
        results = await asyncio.gather(
            *(self._get_channels(addr, topic) for addr in addresses), return_exceptions=True
        )
        channels: set[str] = set()
        errors: list[str] = []
        for result in results:
            if isinstance(result, BaseException):
                errors.append(_error_text(result))
            else:
                channels.update(result)
        if errors:
            reason = "; ".join(errors)
            if len(errors) == len(addresses):
                reason = f"failed to query any nsqlookupd: {reason}"
            self.log(
                lg.WARN,
                f"failed to query nsqlookupd for channels to pre-create for topic {topic} - "
                f"{reason}",
            )
        return sorted(channels)

    async def _get_channels(self, addr: str, topic: str) -> list[str]:
        url = api_url(addr, "channels", topic=topic)
        self.log(lg.DEBUG, f"CI: querying nsqlookupd {url}")
        data = await self._http.get_v1(url)
        channels = data.get("channels") if isinstance(data, dict) else None
        return [c for c in channels or () if isinstance(c, str)]
