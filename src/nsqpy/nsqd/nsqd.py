"""NSQD: owns topics, clients and listeners; a library object with a thin command line.

Its disk-write side (overflow writes, fsyncs, health) is ``BackendWrites`` (backend_writes.py)
and what it keeps in the data path besides the queues is ``Persistence`` (persistence.py).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from .. import version_line
from ..internal import lg
from ..internal.flags import TLS_NOT_REQUIRED, TLS_REQUIRED_ALL
from ..internal.net import (
    Admission,
    ListenError,
    RefusedConnection,
    format_address,
    listen_socket,
    log_open_files_limit,
)
from ..protocol import MESSAGE_HEADER_LENGTH, is_valid_name
from ..protocol.replica import OP_CREATE, OP_DELETE
from . import metadata
from .auth import AuthClient, Authenticator
from .backend import Backend, NullBackend
from .backend_writes import BackendWrites
from .beyond.dead_letter import DeadLetters, validate_beyond_options
from .beyond.queue_limits import QueueLimits, validate_queue_options
from .channel import Channel
from .client_v2 import ClientV2
from .diskqueue import DiskQueue
from .identify import apply_identify, negotiate
from .lookup import LookupPeers, nsqd_identity
from .options import HOSTNAME, Options, validate_replica_options
from .persistence import Persistence
from .protocol_v2 import ProtocolV2
from .replica.group import Replication
from .stats import E2EStream
from .statsd import StatsdPusher
from .tls import build_server_context, tls_protocol_factory
from .topic import Topic, TopicError

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiohttp import web
    from OpenSSL import SSL

    from .connection import Connection


class NSQDError(Exception):
    """A start-up failure; the command prints it and exits 1."""


INSTANTIATE = "failed to instantiate nsqd - "


class NSQD:
    def __init__(
        self,
        options: Options,
        logger: lg.Logger | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.options = options
        # Time is read through these two, so a test can drive it. ``now``: monotonic seconds,
        # for in-flight and deferred deadlines and heartbeats. ``wall_ns``: nanoseconds since
        # the epoch, for publish timestamps and end-to-end latency. Plain attributes holding
        # the functions: reading the clock is one C call, no wrapper.
        self.now = clock
        self.wall_ns = wall_clock_ns
        self.logger = logger or lg.Logger(options.log_prefix, options.log_level)
        self.loop: asyncio.AbstractEventLoop = asyncio.get_event_loop_policy().get_event_loop()
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, ClientV2] = {}
        self.closed_bytes_received = 0  # wire bytes of connections that have gone (/metrics)
        self.closed_bytes_sent = 0
        self.start_time = int(time.time())
        # repeating failures (full disk, refused writes, descriptors) are said once, then summarised
        self.fault_log = lg.RepeatSummary(self.logger)
        self.writes = BackendWrites(self)  # overflow writes, fsyncs, health (backend_writes.py)
        self.protocol = ProtocolV2(self)
        self._admission: Admission | None = None
        self.exiting = False
        self.tcp_port = 0
        self.http_port = 0
        self.https_port = 0
        self.tcp_listen = ""
        self.http_listen = ""
        self._client_seq = 0
        self._tcp_server: asyncio.AbstractServer | None = None
        self._http_runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self.data_path = options.data_path or os.getcwd()
        self._dir_lock = metadata.DirLock(self.data_path)
        self.persistence = Persistence(self)  # nsqd.dat, deferred messages (persistence.py)
        self.lookup: LookupPeers | None = None
        self.tls_context: SSL.Context | None = None
        self.auth = Authenticator(None, self.logger)
        self.https_listen = ""
        self._https_server: asyncio.AbstractServer | None = None
        self._https_runner: web.AppRunner | None = None
        # topics still pre-creating channels from nsqlookupd; Go answers the command that
        # created the topic only after that, so we acknowledge after it too
        self._starting: dict[str, asyncio.Task[None]] = {}
        # nsqpy beyond Go (docs/beyond-go.md): set by drain.start_draining on SIGTERM
        self.draining = False
        self.dead_letters = DeadLetters(self)
        self.queue_limits = QueueLimits(self)  # nsqpy --max-queue-bytes (beyond/queue_limits.py)
        # nsqpy --replica-peer (replica/group.py, docs/replication.md); None: no replication
        self.replication: Replication | None = None

    def _validate(self) -> None:
        """Go's New(): option checks, in its order (after the data-path lock)."""
        opts = self.options
        if not 1 <= opts.max_deflate_level <= 9:
            raise ValueError("--max-deflate-level must be [1,9]")
        if not 0 <= opts.node_id < 1024:
            raise ValueError("--node-id must be [0,1024)")
        if opts.tls_client_auth_policy and opts.tls_required == TLS_NOT_REQUIRED:
            opts.tls_required = TLS_REQUIRED_ALL
        self.setup_tls()
        if not self.tls_enabled and opts.tls_required != TLS_NOT_REQUIRED:
            raise ValueError("cannot require TLS client connections without TLS key and cert")
        if opts.auth_http_request_method not in ("get", "post"):
            raise ValueError("--auth-http-request-method must be post or get")
        for pct in opts.e2e_processing_latency_percentiles:
            if not 0 < pct <= 1:
                raise ValueError(f"invalid E2E processing latency percentile: {pct:g}")
        validate_beyond_options(opts)  # nsqpy additions (docs/beyond-go.md)
        validate_queue_options(opts)
        validate_replica_options(opts)

    def setup_tls(self) -> None:
        """Build the TLS server context from --tls-cert/--tls-key and the client policy."""
        self.tls_context = build_server_context(self.options)
        opts = self.options
        if opts.auth_http_addresses:
            client = AuthClient(
                opts.auth_http_addresses,
                opts.auth_http_request_method,
                opts.http_client_connect_timeout,
                opts.http_client_request_timeout,
                opts.tls_root_ca_file,
            )
            self.auth = Authenticator(client, self.logger)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Go's New + LoadMetadata + PersistMetadata + Main: lock, load, listen."""
        self.loop = asyncio.get_running_loop()
        opts = self.options
        try:
            self._dir_lock.lock()
        except OSError as exc:
            raise NSQDError(
                f"failed to instantiate nsqd - failed to lock data-path: {exc}"
            ) from None
        try:
            self._validate()
        except ValueError as exc:
            raise NSQDError(INSTANTIATE + str(exc)) from None
        self.protocol = ProtocolV2(self)  # after _validate, which may force TLS-required
        self.logger.info(version_line("nsqd"))
        self.logger.info(f"ID: {opts.node_id}")
        log_open_files_limit(self.logger)  # as Go's runtime: the soft limit raised to the hard
        removed = metadata.remove_stale_temp_files(self.data_path)
        if removed:
            self.logger.info(f"NSQ: removed {len(removed)} stale temporary files")
        try:
            tcp_sock = listen_socket(opts.tcp_address, allow_unix=True)
        except ListenError as exc:
            raise NSQDError(INSTANTIATE + str(exc)) from None
        self.dead_letters.load()  # nsqpy: per-channel settings before channels exist
        self.queue_limits.load()
        try:
            self.persistence.load_metadata()
        except ValueError as exc:
            raise NSQDError(f"failed to load metadata - {exc}") from None
        self.persistence.write_metadata_now()
        self.persistence.restore_deferred()
        self.tcp_listen = format_address(tcp_sock.getsockname())
        await self._start_replication()
        self._admission = Admission(self.logger)  # keeps a descriptor reserve for HTTP and files
        if tcp_sock.family == socket.AF_UNIX:
            self.tcp_port = -1
            self._tcp_server = await self.loop.create_unix_server(
                self._new_client, sock=tcp_sock, backlog=socket.SOMAXCONN
            )
        else:
            self.tcp_port = tcp_sock.getsockname()[1]
            # the loop re-listens with its own backlog (100 by default): keep Go's somaxconn,
            # or a burst of connects (1000 consumers starting) loses SYNs and dials time out
            self._tcp_server = await self.loop.create_server(
                self._new_client, sock=tcp_sock, backlog=socket.SOMAXCONN
            )
        self.logger.info(f"TCP: listening on {self.tcp_listen}")
        if opts.http_address:
            await self._start_http(opts.http_address)
        if self.tls_context is not None and opts.https_address:
            await self._start_https(opts.https_address)
        self._tasks.append(self.loop.create_task(self._queue_scan_loop()))
        self._tasks.append(self.loop.create_task(self.writes.sync_loop()))
        await self._start_lookup()
        if opts.statsd_address:
            self._tasks.append(self.loop.create_task(StatsdPusher(self).run()))

    async def _start_replication(self) -> None:
        """With --replica-peer: replication runs before a peer can reach the client port."""
        peers = validate_replica_options(self.options)
        if not peers or ":" not in self.tcp_listen:  # (a unix socket has no peers)
            return
        host = self.tcp_listen.rpartition(":")[0].strip("[]")
        if host in ("0.0.0.0", "::", ""):
            host = self.options.broadcast_address
        port = int(self.tcp_listen.rpartition(":")[2])
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.replication = Replication(self, peers, address)
        await self.replication.start()

    async def _start_http(self, address: str) -> None:
        from ..internal.http_server import start_app
        from .http import build_app

        sock = self._listen(address, allow_unix=True)
        self.http_listen = format_address(sock.getsockname())
        self.http_port = -1 if sock.family == socket.AF_UNIX else sock.getsockname()[1]
        self._http_runner = await start_app(build_app(self), sock)
        self.logger.info(f"HTTP: listening on {self.http_listen}")

    async def _start_https(self, address: str) -> None:
        from aiohttp import web

        from .http import build_app

        assert self.tls_context is not None
        sock = self._listen(address, allow_unix=False)  # HTTPS is always TCP
        self.https_listen = format_address(sock.getsockname())
        self.https_port = sock.getsockname()[1]
        runner = web.AppRunner(build_app(self, tls_listener=True), access_log=None)
        await runner.setup()
        assert runner.server is not None
        factory = tls_protocol_factory(self.tls_context, runner.server)
        self._https_server = await self.loop.create_server(factory, sock=sock)
        self._https_runner = runner
        self.logger.info(f"HTTPS: listening on {self.https_listen}")

    @staticmethod
    def _listen(address: str, allow_unix: bool) -> socket.socket:
        try:
            return listen_socket(address, allow_unix=allow_unix)
        except ListenError as exc:
            raise NSQDError(INSTANTIATE + str(exc)) from None

    def _new_client(self) -> Connection | RefusedConnection:
        """The protocol of an accepted socket: a new client's connection."""
        if self._admission is not None and not self._admission.admit():
            return RefusedConnection()  # the reserve's descriptors stay for HTTP and queue files
        self._client_seq += 1
        client = ClientV2(self, self._client_seq)
        self.clients[client.id] = client
        return client.connection

    def remove_client(self, client: ClientV2) -> None:
        if self.clients.pop(client.id, None) is not None:
            self.closed_bytes_received += client.bytes_received
            self.closed_bytes_sent += client.bytes_sent

    def tcp_bytes(self) -> tuple[int, int]:
        """Bytes received from and sent to TCP clients since start, closed connections too."""
        clients = self.clients.values()
        received = self.closed_bytes_received + sum(c.bytes_received for c in clients)
        return received, self.closed_bytes_sent + sum(c.bytes_sent for c in clients)

    async def stop(self) -> None:
        """Go's Exit: listeners, clients, HTTP, metadata, topics, background loops."""
        if self.exiting:
            return
        self.exiting = True
        if self._tcp_server is not None:
            self.logger.info(f"TCP: closing {self.tcp_listen}")
            self._tcp_server.close()
        if self.lookup is not None:
            await self.lookup.stop()
        for client in list(self.clients.values()):
            client.close()
        if self._http_runner is not None:
            self.logger.info(f"HTTP: closing {self.http_listen}")
            await self._http_runner.cleanup()
        if self._https_server is not None and self._https_runner is not None:
            self.logger.info(f"HTTPS: closing {self.https_listen}")
            self._https_server.close()
            await self._https_runner.cleanup()
        await self.auth.close()
        await self.persistence.write_metadata_last()
        if self.replication is not None:
            await self.replication.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for topic in list(self.topics.values()):
            topic.close()
        self.persistence.save_deferred()
        self.dead_letters.close()
        self.queue_limits.shutdown()
        self.persistence.close()
        self._dir_lock.unlock()
        if self._admission is not None:
            self._admission.close()
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # ------------------------------------------------------------------ topics

    def get_topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            topic = Topic(name, self, self.new_backend(name, ephemeral=name.endswith("#ephemeral")))
            self.queue_limits.apply(topic)
            self.topics[name] = topic
            self.logger.info(f"TOPIC({name}): created")
            self.topic_created(topic)
            if not self.persistence.loading and self.lookup is not None and self.lookup.addresses:
                topic.started = False
                task = self.loop.create_task(self._precreate_channels(topic))
                self._starting[name] = task
                task.add_done_callback(lambda _: self._starting.pop(name, None))
        return topic

    async def _precreate_channels(self, topic: Topic) -> None:
        """Go's GetTopic: channels nsqlookupd knows (but #ephemeral) exist before delivery."""
        try:
            assert self.lookup is not None
            for name in await self.lookup.fetch_channels(topic.name):
                if not name.endswith("#ephemeral") and not topic.exiting:
                    topic.get_channel(name)
        finally:
            topic.start()

    def topic_starting(self, topic: Topic) -> tuple[asyncio.Task[None], ...]:
        """The channel pre-creation a new topic's first command must wait for, if any."""
        task = self._starting.get(topic.name) if self._starting else None
        return (task,) if task is not None else ()

    def get_existing_topic(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def delete_existing_topic(self, name: str) -> None:
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError("topic does not exist")
        self.logger.info(f"TOPIC({name}): deleting")
        topic.delete()
        self.topics.pop(name, None)
        self.topic_deleted(topic)

    def delete_ephemeral_topic(self, topic: Topic) -> None:
        if self.topics.get(topic.name) is topic and not topic.channels:
            self.delete_existing_topic(topic.name)

    def new_channel(self, topic: Topic, name: str) -> Channel:
        backend = self.new_backend(f"{topic.name}:{name}", ephemeral=name.endswith("#ephemeral"))
        channel = Channel(topic, name, self, backend)
        opts = self.options
        disk_queue = backend.disk_queue()
        if disk_queue is not None and opts.mem_queue_size == 0 and opts.sync_every == 1:
            channel.hold_messages(disk_queue)  # nothing acknowledged is lost to a SIGKILL
        self.dead_letters.apply(channel)
        self.queue_limits.apply(channel)
        self.logger.info(f"TOPIC({topic.name}): new channel({name})")
        return channel

    def new_backend(self, queue_name: str, ephemeral: bool) -> Backend:
        if ephemeral:
            return NullBackend()
        opts = self.options
        return DiskQueue(
            queue_name,
            self.data_path,
            opts.max_bytes_per_file,
            MESSAGE_HEADER_LENGTH,
            opts.max_msg_size + MESSAGE_HEADER_LENGTH,
            opts.sync_every,
            opts.sync_timeout,
            self.logger,
            clock=self.now,
        )

    def backends(self) -> list[Backend]:
        queues: list[Backend] = []
        for topic in self.topics.values():
            queues.append(topic.backend)
            queues.extend(channel.backend for channel in topic.channels.values())
        return queues

    # ------------------------------------------------------------------ notifications

    def topic_created(self, topic: Topic) -> None:
        self._notify_lookupd(topic.name, None, register=True)
        if self.replication is not None:
            self.replication.topic_op(topic.name, OP_CREATE)
        if not topic.ephemeral:
            self.persistence.persist_metadata()

    def topic_deleted(self, topic: Topic) -> None:
        self._notify_lookupd(topic.name, None, register=False)
        if self.replication is not None:
            self.replication.topic_op(topic.name, OP_DELETE)
        if self.dead_letters.overrides:
            self.dead_letters.forget(topic.name)
        self.queue_limits.forget(topic.name)
        if not topic.ephemeral:
            self.persistence.persist_metadata()

    def channel_created(self, topic: Topic, channel: Channel) -> None:
        self._notify_lookupd(topic.name, channel.name, register=True)
        if self.replication is not None:
            self.replication.channel_op(topic.name, channel.name, OP_CREATE)
        if not channel.ephemeral and not topic.ephemeral:
            self.persistence.persist_metadata()

    def channel_deleted(self, topic: Topic, channel: Channel) -> None:
        self._notify_lookupd(topic.name, channel.name, register=False)
        if self.replication is not None:
            self.replication.channel_op(topic.name, channel.name, OP_DELETE)
        if self.dead_letters.overrides:
            self.dead_letters.forget(topic.name, channel.name)
        self.queue_limits.forget(topic.name, channel.name)
        if not channel.ephemeral and not topic.ephemeral:
            self.persistence.persist_metadata()

    # ------------------------------------------------------------------ nsqlookupd

    async def _start_lookup(self) -> None:
        opts = self.options
        self.lookup = LookupPeers(
            opts.nsqlookupd_tcp_addresses,
            self._lookup_identity,
            self._registrations,
            self.logger,
            max_body_size=opts.max_body_size,
            http_connect_timeout=opts.http_client_connect_timeout,
            http_request_timeout=opts.http_client_request_timeout,
        )
        await self.lookup.start()

    def _lookup_identity(self) -> dict[str, Any]:
        opts = self.options
        return nsqd_identity(
            opts.broadcast_address,
            opts.broadcast_tcp_port or self.tcp_port,
            opts.broadcast_http_port or self.http_port,
        )

    def _registrations(self) -> list[tuple[str, str | None]]:
        """What every (re)connect to a lookupd registers: each channel, or a bare topic."""
        out: list[tuple[str, str | None]] = []
        if self.draining:  # nsqpy drain: stay unregistered across reconnects
            return out
        for topic in self.topics.values():
            if topic.channels:
                out.extend((topic.name, name) for name in topic.channels)
            else:
                out.append((topic.name, None))
        return out

    def _notify_lookupd(self, topic: str, channel: str | None, register: bool) -> None:
        if self.lookup is not None and not self.draining:
            self.lookup.notify(topic, channel, register)

    def lookupd_addresses_changed(self) -> None:
        if self.lookup is not None:
            self.lookup.set_addresses(self.options.nsqlookupd_tcp_addresses)

    # ------------------------------------------------------------------ queue scanning

    async def _queue_scan_loop(self) -> None:
        """Requeue timed-out in-flight and due deferred messages (Go's queueScanLoop).

        Every channel's heaps are peeked each tick: cheaper here than Go's random sampling and
        it never misses a channel created since the last refresh.
        """
        interval = self.options.queue_scan_interval
        while True:
            await asyncio.sleep(interval)
            self.scan_queues()

    def scan_queues(self) -> None:
        now = self.now()
        for topic in list(self.topics.values()):
            for channel in list(topic.channels.values()):
                if channel.exiting:
                    continue
                channel.process_in_flight_queue(now)
                channel.process_deferred_queue(now)

    # ------------------------------------------------------------------ IDENTIFY and AUTH

    def identify(self, client: ClientV2, data: dict[str, Any]) -> None:
        apply_identify(client, data, self.options)

    def identify_response(
        self, client: ClientV2, data: dict[str, Any]
    ) -> tuple[bytes, SSL.Context | None, str, int]:
        return negotiate(client, data, self.options, self.tls_context, self.auth.enabled)

    @property
    def tls_enabled(self) -> bool:
        return self.tls_context is not None

    # ------------------------------------------------------------------ stats support

    def new_e2e_stream(self) -> E2EStream | None:
        opts = self.options
        if not opts.e2e_processing_latency_percentiles:
            return None
        return E2EStream(
            opts.e2e_processing_latency_window_time, opts.e2e_processing_latency_percentiles
        )

    def valid_name(self, name: str) -> bool:
        return is_valid_name(name)

    @property
    def hostname(self) -> str:
        return HOSTNAME
