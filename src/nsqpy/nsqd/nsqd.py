"""NSQD: owns topics, clients and listeners; a library object with a thin command line."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import socket
import struct
import time
from collections import deque
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
from . import deferred_store, metadata
from .auth import AuthClient, Authenticator
from .backend import Backend, NullBackend
from .channel import Channel
from .client_v2 import ClientV2
from .dead_letter import DeadLetters, validate_beyond_options
from .deferred_store import DeferredRecord
from .diskqueue import DiskQueue, DiskQueueError, queue_names
from .errors import BackendWriteError
from .identify import apply_identify, negotiate
from .lookup import LookupPeers, nsqd_identity
from .options import HOSTNAME, Options
from .protocol_v2 import ProtocolV2
from .queue_limits import QueueLimits, validate_queue_options
from .stats import E2EStream
from .statsd import StatsdPusher
from .tls import build_server_context, tls_protocol_factory
from .topic import Topic, TopicError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from aiohttp import web
    from OpenSSL import SSL

    from ..protocol.errors import ProtocolError
    from .message import Message
    from .read_holds import Hold


_RECORD_SIZE = struct.Struct(">I")


class _SharedEncodings:
    """One flush of ``batched_writes``: a message shared by several channels is encoded once,
    and a run of shared messages overflowing to many channels' disk queues is framed into one
    buffer once, which each queue then writes whole (``DiskQueue.put_framed``)."""

    __slots__ = ("frames", "records")

    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self.frames: dict[tuple[int, int], tuple[list[Message], bytes]] = {}

    def framed(self, msgs: list[Message]) -> bytes | None:
        """The framed records of ``msgs`` if they are all shared, else None."""
        if not (msgs[0].shared and msgs[-1].shared):
            return None
        key = (id(msgs[0]), len(msgs))
        cached = self.frames.get(key)
        if cached is not None and cached[0] == msgs:  # list ==: identity per element, in C
            return cached[1]
        if not all(msg.shared for msg in msgs):
            return None
        pack = _RECORD_SIZE.pack
        pieces = []
        for data in _encode_all(msgs, self.records):
            pieces.append(pack(len(data)))
            pieces.append(data)
        framed = b"".join(pieces)
        self.frames[key] = (msgs, framed)
        return framed


def _encode_all(msgs: list[Message], encoded: dict[int, bytes]) -> list[bytes]:
    """The disk records of ``msgs``; a message shared by several channels is encoded once
    per batch (``encoded``, keyed by the object while the batch keeps it alive)."""
    out = []
    for msg in msgs:
        if not msg.shared:
            out.append(msg.encode())
            continue
        data = encoded.get(id(msg))
        if data is None:
            data = encoded[id(msg)] = msg.encode()
        out.append(data)
    return out


class NSQDError(Exception):
    """A start-up failure; the command prints it and exits 1."""


INSTANTIATE = "failed to instantiate nsqd - "


# faults (issue 14): the client errors a failing backend causes, summarised under one key
_WRITE_FAILURE_CODES = frozenset({"E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED"})
_REFUSED_WRITES = "refused-writes"


class NSQD:
    def __init__(self, options: Options, logger: lg.Logger | None = None) -> None:
        self.options = options
        self.logger = logger or lg.Logger(options.log_prefix, options.log_level)
        self.loop: asyncio.AbstractEventLoop = asyncio.get_event_loop_policy().get_event_loop()
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, ClientV2] = {}
        self.closed_bytes_received = 0  # wire bytes of connections that have gone (/metrics)
        self.closed_bytes_sent = 0
        self.protocol = ProtocolV2(self)
        self.start_time = int(time.time())
        self.health_error: str | None = None
        # faults (issue 14): repeating failures said once then summarised; descriptor reserve
        self.fault_log = lg.RepeatSummary(self.logger)
        self._admission: Admission | None = None
        self._metadata_retry = 0.0  # seconds before retrying a failed nsqd.dat write
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
        self._loading = False
        self._persist_scheduled = False
        # One worker keeps metadata writes (and their fsync) ordered and off the event loop.
        self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nsqd-io")
        self._persisting: asyncio.Future[OSError | None] | None = None
        self._deferred_records: dict[str, DeferredRecord] = {}
        self._syncing: dict[DiskQueue, asyncio.Task[None]] = {}
        self._write_batch: dict[Backend, tuple[deque[Message], list[Message]]] | None = None
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
        self.queue_limits = QueueLimits(self)  # nsqpy --max-queue-bytes (queue_limits.py)

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

    # ------------------------------------------------------------------ clocks

    @staticmethod
    def now() -> float:
        """Monotonic seconds: deadlines for in-flight and deferred messages, heartbeats."""
        return time.monotonic()

    @staticmethod
    def wall_ns() -> int:
        return time.time_ns()

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
        log_open_files_limit(self.logger)  # faults (issue 14): as Go's runtime, soft = hard
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
            self.load_metadata()
        except ValueError as exc:
            raise NSQDError(f"failed to load metadata - {exc}") from None
        self._write_metadata_now()
        self.restore_deferred()
        self.tcp_listen = format_address(tcp_sock.getsockname())
        self._admission = Admission(self.logger)  # faults (issue 14): descriptor reserve
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
        self._tasks.append(self.loop.create_task(self._sync_loop()))
        await self._start_lookup()
        if opts.statsd_address:
            self._tasks.append(self.loop.create_task(StatsdPusher(self).run()))

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

    def _new_client(self) -> ClientV2 | RefusedConnection:
        if self._admission is not None and not self._admission.admit():
            return RefusedConnection()  # faults (issue 14): keep descriptors for HTTP and files
        self._client_seq += 1
        client = ClientV2(self, self._client_seq)
        self.clients[client.id] = client
        return client

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
        if self._persisting is not None:
            await self._persisting
        self._write_metadata_now()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for topic in list(self.topics.values()):
            topic.close()
        self._save_deferred()
        self.dead_letters.close()
        self.queue_limits.shutdown()
        self._io.shutdown(wait=True)
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
            if not self._loading and self.lookup is not None and self.lookup.addresses:
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
        if isinstance(backend, DiskQueue) and opts.mem_queue_size == 0 and opts.sync_every == 1:
            channel.hold_messages(backend)  # issue 22: nothing acknowledged lost to a SIGKILL
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
        )

    def backends(self) -> list[Backend]:
        queues: list[Backend] = []
        for topic in self.topics.values():
            queues.append(topic.backend)
            queues.extend(channel.backend for channel in topic.channels.values())
        return queues

    async def _sync_loop(self) -> None:
        """fsync disk queues when --sync-timeout has passed with activity (in worker threads);
        every sync is tracked, so publishes are acknowledged after the ones under way."""
        interval = max(0.001, min(self.options.sync_timeout, 0.1))
        while True:
            await asyncio.sleep(interval)
            for queue in self.backends():
                if not isinstance(queue, DiskQueue) or queue in self._syncing:
                    continue
                if queue.sync_due():
                    self._start_sync(queue)

    # ------------------------------------------------------------------ notifications

    def topic_created(self, topic: Topic) -> None:
        self._notify_lookupd(topic.name, None, register=True)
        if not topic.ephemeral:
            self.persist_metadata()

    def topic_deleted(self, topic: Topic) -> None:
        self._notify_lookupd(topic.name, None, register=False)
        if self.dead_letters.overrides:
            self.dead_letters.forget(topic.name)
        self.queue_limits.forget(topic.name)
        if not topic.ephemeral:
            self.persist_metadata()

    def channel_created(self, topic: Topic, channel: Channel) -> None:
        self._notify_lookupd(topic.name, channel.name, register=True)
        if not channel.ephemeral and not topic.ephemeral:
            self.persist_metadata()

    def channel_deleted(self, topic: Topic, channel: Channel) -> None:
        self._notify_lookupd(topic.name, channel.name, register=False)
        if self.dead_letters.overrides:
            self.dead_letters.forget(topic.name, channel.name)
        self.queue_limits.forget(topic.name, channel.name)
        if not channel.ephemeral and not topic.ephemeral:
            self.persist_metadata()

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

    # ------------------------------------------------------------------ metadata

    @property
    def metadata_path(self) -> str:
        return os.path.join(self.data_path, metadata.METADATA_FILE)

    def load_metadata(self) -> None:
        """Recreate topics, channels and pause state from ``nsqd.dat``."""
        self._loading = True
        try:
            for entry in metadata.load(self.metadata_path):
                if not is_valid_name(entry.name):
                    self.logger.warn(f"skipping creation of invalid topic {entry.name}")
                    continue
                topic = self.get_topic(entry.name)
                if entry.paused:
                    topic.pause()
                for meta in entry.channels:
                    if not is_valid_name(meta.name):
                        self.logger.warn(f"skipping creation of invalid channel {meta.name}")
                        continue
                    channel = topic.get_channel(meta.name)
                    if meta.paused:
                        channel.pause()
            self._restore_unlisted_queues()
        finally:
            self._loading = False

    def _restore_unlisted_queues(self) -> None:
        """Bring back topics and channels whose disk queue exists but ``nsqd.dat`` misses.

        ``nsqd.dat`` is written a moment after a topic is created, so a crash in between leaves
        acknowledged messages in a queue that Go opens only once the topic is used again.
        Deleting a topic or channel removes its queue files first, so a queue on disk is one
        that still exists.
        """
        for queue in sorted(queue_names(self.data_path)):  # a topic before its channels
            topic_name, _, channel_name = queue.partition(":")  # new_channel's queue name
            names = [topic_name, channel_name] if channel_name else [topic_name]
            if not all(is_valid_name(name) for name in names):
                continue
            topic = self.topics.get(topic_name)
            if topic is not None and (not channel_name or channel_name in topic.channels):
                continue
            what = f"TOPIC({topic_name})"
            if channel_name:
                what += f": CHANNEL({channel_name})"
            self.logger.warn(f"{what}: found on disk but not in {metadata.METADATA_FILE}, restored")
            topic = self.get_topic(topic_name)
            if channel_name:
                topic.get_channel(channel_name)

    def persist_metadata(self) -> None:
        """Schedule one write of ``nsqd.dat`` for this event-loop turn (off the loop)."""
        if self._loading or self.exiting or self._persist_scheduled:
            return
        self._persist_scheduled = True
        self.loop.call_soon(self._persist_soon)

    def _persist_soon(self) -> None:
        self._persist_scheduled = False
        data = metadata.snapshot(list(self.topics.values()))
        future = self.loop.run_in_executor(self._io, self._write_metadata, data)
        self._persisting = asyncio.ensure_future(future)
        self._persisting.add_done_callback(self._metadata_written)

    def _write_metadata(self, data: bytes) -> OSError | None:
        try:
            metadata.write_atomically(self.metadata_path, data)
        except OSError as exc:
            return exc
        return None

    def _metadata_written(self, done: asyncio.Future[OSError | None]) -> None:
        """faults (issue 14): a failed write of nsqd.dat is said once and retried with a
        backoff, so a topic or channel created on a full disk is recorded once space is back."""
        error = None if done.cancelled() else done.result()
        if error is None:
            self._metadata_retry = 0.0
            self.fault_log.recovered(metadata.METADATA_FILE, "NSQ: persisted metadata again")
            return
        self.fault_log.failed(metadata.METADATA_FILE, f"failed to persist metadata - {error}")
        self._metadata_retry = min(5.0, max(0.1, self._metadata_retry * 2))
        if not self.exiting:
            self.loop.call_later(self._metadata_retry, self.persist_metadata)

    def _write_metadata_now(self) -> None:
        self.logger.info(f"NSQ: persisting topic/channel metadata to {self.metadata_path}")
        error = self._write_metadata(metadata.snapshot(list(self.topics.values())))
        if error is not None:
            self.fault_log.failed(metadata.METADATA_FILE, f"failed to persist metadata - {error}")

    # ------------------------------------------------------------------ backends and health

    def write_to_backend(
        self, backend: Backend, msg: Message, context: str, owner: deque[Message]
    ) -> None:
        """Overflow to disk; BackendWriteError (and unhealthy) if the write fails.

        ``owner`` is the memory queue of the topic or channel the backend belongs to."""
        batch = self._write_batch
        if batch is not None:  # inside batched_writes(): one write(2) per queue at the end
            pending = batch.get(backend)
            if pending is None:
                pending = batch[backend] = (owner, [])
            pending[1].append(msg)
            return
        try:
            backend.put(msg.encode())
        except (DiskQueueError, OSError) as exc:
            self.set_health(str(exc))
            self.fault_log.failed(
                backend.name, f"{context} ERROR: failed to write message to backend - {exc}"
            )
            raise BackendWriteError(str(exc)) from None
        if self.health_error is not None or self.fault_log.active:
            self._backend_writable(backend)
        if isinstance(backend, DiskQueue) and backend not in self._syncing and backend.sync_due():
            self._start_sync(backend)

    def write_many_to_backend(
        self, backend: Backend, msgs: list[Message], context: str, owner: deque[Message]
    ) -> None:
        """:meth:`write_to_backend` for several messages (one list extend inside a batch)."""
        batch = self._write_batch
        if batch is None:
            for msg in msgs:
                self.write_to_backend(backend, msg, context, owner)
            return
        pending = batch.get(backend)
        if pending is None:
            pending = batch[backend] = (owner, [])
        pending[1].extend(msgs)

    def write_held(self, queue: DiskQueue, msg: Message, context: str) -> Hold | None:
        """A held channel's write (channel.py, issue 22), never batched, as the caller may
        deliver or pump at once: handed out and held when nothing waits before it (the Hold),
        otherwise stored as waiting (None). BackendWriteError as :meth:`write_to_backend`."""
        try:
            data = msg.encode()
            hold = queue.put_held(data)
            if hold is None:
                queue.put(data)
        except (DiskQueueError, OSError) as exc:
            self.set_health(str(exc))
            self.fault_log.failed(
                queue.name, f"{context} ERROR: failed to write message to backend - {exc}"
            )
            raise BackendWriteError(str(exc)) from None
        if self.health_error is not None or self.fault_log.active:
            self._backend_writable(queue)
        if queue not in self._syncing and queue.sync_due():
            self._start_sync(queue)
        return hold

    @contextlib.contextmanager
    def batched_writes(self, lenient: bool = False) -> Iterator[None]:
        """Collect the disk writes of one MPUB (or drain turn) and write each queue's share
        with one write(2). A refused write raises BackendWriteError (the publish fails), or
        with ``lenient`` keeps the unwritten messages in their owner's memory queue."""
        if self._write_batch is not None:
            yield
            return
        batch: dict[Backend, tuple[deque[Message], list[Message]]] = {}
        self._write_batch = batch
        try:
            yield
        finally:
            self._write_batch = None
            failure: BackendWriteError | None = None
            encoded = _SharedEncodings()
            for backend, (owner, msgs) in batch.items():
                try:
                    self._put_many(backend, msgs, owner if lenient else None, encoded)
                except BackendWriteError as exc:
                    failure = exc
            if failure is not None:
                raise failure

    def _put_many(
        self,
        backend: Backend,
        msgs: list[Message],
        keep_in: deque[Message] | None,
        encoded: _SharedEncodings,
    ) -> None:
        try:
            written = False
            if isinstance(backend, DiskQueue):
                framed = encoded.framed(msgs)
                written = framed is not None and backend.put_framed(framed, len(msgs))
            if not written:
                backend.put_many(_encode_all(msgs, encoded.records))
        except (DiskQueueError, OSError) as exc:
            self.set_health(str(exc))
            self.fault_log.failed(
                backend.name, f"DISKQUEUE({backend.name}) ERROR: failed to write messages - {exc}"
            )
            if keep_in is None:
                raise BackendWriteError(str(exc)) from None
            stored = exc.stored if isinstance(exc, DiskQueueError) else 0
            keep_in.extend(msgs[stored:])
            return
        if self.health_error is not None or self.fault_log.active:
            self._backend_writable(backend)
        if isinstance(backend, DiskQueue) and backend not in self._syncing and backend.sync_due():
            self._start_sync(backend)

    # --sync-every as go-diskqueue: the write that makes a sync due is acknowledged, and the
    # next write waits until that fsync is done. Here the next write is performed while the
    # fsync runs (in a thread) but is acknowledged only after it: at most sync_every
    # acknowledged messages are ever unsynced, and the fsync overlaps with work.

    def _start_sync(self, queue: DiskQueue) -> None:
        task = self.loop.create_task(queue.sync())
        self._syncing[queue] = task
        task.add_done_callback(lambda done: self._sync_finished(queue, done))

    def _sync_finished(self, queue: DiskQueue, task: asyncio.Task[None]) -> None:
        self._syncing.pop(queue, None)
        if not task.cancelled() and task.exception() is not None:
            self.logger.error(f"failed to sync disk queue - {task.exception()}")
        elif not self.exiting and queue.sync_due():  # writes made meanwhile are due already
            self._start_sync(queue)

    def running_syncs(self, topic: Topic | None = None) -> tuple[asyncio.Task[None], ...]:
        """Syncs under way now: a publish arriving now is acknowledged after them. Only the
        queues a publish to ``topic`` can write count: with --mem-queue-size > 0 the topic's
        own (its pump writes the channels' later), else the topic's and its channels' (named
        ``topic:channel``), whose writes precede the OK."""
        if not self._syncing:
            return ()
        if topic is None:
            return tuple(self._syncing.values())
        if not topic.publish_writes_channels():
            task = self._syncing.get(topic.backend)  # type: ignore[call-overload]
            return (task,) if task is not None else ()
        name = topic.name
        return tuple(
            task for queue, task in self._syncing.items() if queue.name.partition(":")[0] == name
        )

    def topic_starting(self, topic: Topic) -> tuple[asyncio.Task[None], ...]:
        """The channel pre-creation a new topic's first command must wait for, if any."""
        task = self._starting.get(topic.name) if self._starting else None
        return (task,) if task is not None else ()

    def ack_after(
        self, syncs: tuple[asyncio.Task[None], ...], response: bytes
    ) -> bytes | Awaitable[bytes | None]:
        if not syncs:
            return response
        return self._ack_after(syncs, response)

    @staticmethod
    async def _ack_after(syncs: tuple[asyncio.Task[None], ...], response: bytes) -> bytes:
        await asyncio.wait(syncs)
        return response

    def _backend_writable(self, backend: Backend) -> None:
        """A write succeeded after failures: healthy again (as Go), and say the fault ended."""
        self.set_health(None)
        self.fault_log.recovered(backend.name, f"DISKQUEUE({backend.name}): writing again")
        self.fault_log.recovered(_REFUSED_WRITES, "clients' publishes succeed again")

    def log_client_error(self, remote_address: str, err: ProtocolError) -> None:
        """Go logs every error sent to a client; the refusals of a failing disk are said once
        and then summarised, as one refused PUB per client attempt would flood the log."""
        line = f"[{remote_address}] - {err}"
        if err.code in _WRITE_FAILURE_CODES:
            self.fault_log.failed(_REFUSED_WRITES, line)
        else:
            self.logger.error(line)

    def set_health(self, error: str | None) -> None:
        self.health_error = error

    @property
    def health(self) -> str:
        return "OK" if self.health_error is None else f"NOK - {self.health_error}"

    def flush_channel_to_backend(self, channel: Channel) -> bool:
        """Shutdown: memory, in-flight, then deferred messages to disk, in Go's order; False
        if the disk refused them."""
        now = self.now()
        deferred = [(m, max(0.0, m.pri - now)) for m in channel.deferred.values()]
        msgs = channel.messages_to_persist()
        stored = True
        if msgs and not channel.ephemeral:
            count = len(msgs)
            self.logger.info(
                f"CHANNEL({channel.name}): flushing {count} memory messages to backend"
            )
            stored = self._put_many_logged(channel.backend, msgs, f"CHANNEL({channel.name})")
        self._remember_deferred(channel.backend, deferred)
        return stored

    def flush_topic_to_backend(self, topic: Topic) -> None:
        msgs = list(topic.memory_queue)
        topic.memory_queue.clear()
        if msgs and not topic.ephemeral:
            count = len(msgs)
            self.logger.info(f"TOPIC({topic.name}): flushing {count} memory messages to backend")
            self._put_many_logged(topic.backend, msgs, f"TOPIC({topic.name})")
        self._remember_deferred(topic.backend, [(m, m.deferred) for m in msgs if m.deferred])

    def _put_many_logged(self, backend: Backend, msgs: list[Message], context: str) -> bool:
        try:
            backend.put_many([m.encode() for m in msgs])
        except (DiskQueueError, OSError) as exc:
            self.logger.error(f"{context} ERROR: failed to write messages to backend - {exc}")
            return False
        return True

    def close_backend(self, backend: Backend, context: str) -> None:
        try:
            backend.close()
        except (DiskQueueError, OSError) as exc:
            self.logger.error(f"{context} ERROR: failed to close backend - {exc}")

    # ------------------------------------------------------------------ deferred across restarts

    def _remember_deferred(self, backend: Backend, deferred: list[tuple[Message, float]]) -> None:
        if deferred and isinstance(backend, DiskQueue):
            self._deferred_records[backend.name] = DeferredRecord([], deferred)

    def _save_deferred(self) -> None:
        """After every queue is closed: record where each queue stands, then write the file."""
        queues = {q.name: q for q in self.backends() if isinstance(q, DiskQueue)}
        records = {}
        for name, record in self._deferred_records.items():
            queue = queues.get(name)
            if queue is not None:
                record.positions = list(queue.positions())
                records[name] = record
        try:
            deferred_store.save(self.data_path, records)
        except OSError as exc:
            self.logger.error(f"failed to persist deferred messages - {exc}")

    def restore_deferred(self) -> None:
        try:
            records = deferred_store.load(self.data_path)
        except ValueError as exc:
            self.logger.error(f"ignoring deferred messages: {exc}")
            records = {}
        for topic in self.topics.values():
            self._restore_queue(records, topic.backend, topic.skip_ids, topic.restore_deferred)
            for channel in topic.channels.values():
                self._restore_queue(
                    records, channel.backend, channel.skip_ids, channel.restore_deferred
                )
        deferred_store.remove(self.data_path)

    def _restore_queue(
        self,
        records: dict[str, DeferredRecord],
        backend: Backend,
        skip_ids: set[bytes],
        restore: Callable[[Message, float], None],
    ) -> None:
        if not isinstance(backend, DiskQueue) or backend.name not in records:
            return
        record = records[backend.name]
        if record.positions != list(backend.positions()):
            self.logger.warn(
                f"DISKQUEUE({backend.name}): changed since shutdown; deferred messages "
                "will be delivered when read, as Go does"
            )
            return
        for msg, remaining in record.messages:
            skip_ids.add(msg.id)
            restore(msg, remaining)
        self.logger.info(
            f"DISKQUEUE({backend.name}): restored {len(record.messages)} deferred messages"
        )

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
