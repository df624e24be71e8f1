"""One client of nsqd's TCP protocol: its V2 state, its commands, and to its channel a Consumer.

ClientV2 holds what the protocol knows of a client (Go's clientV2 less its I/O): who it is
(IDENTIFY), the settings it negotiated, its state, its RDY and in-flight counters, its
statistics. It runs the commands its :class:`~nsqpy.nsqd.connection.Connection` parses
through the protocol's handlers and answers them; the connection owns the socket, the output
buffer and its flushing, heartbeats, and the TLS and compression upgrades.

On the delivery path the channel hands messages to the client (:class:`Consumer`), which
counts them and appends their frames to its connection's output buffer; the flush policy
(``after_deliveries``) is the connection's own method, so a delivery costs no extra call.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..protocol import ProtocolError, encode_error, encode_response
from ..protocol.commands import FIN_RUN, Command
from .connection import Connection
from .errors import NeedsReauth

if TYPE_CHECKING:
    from OpenSSL import SSL

    from .auth import AuthState
    from .channel import Channel
    from .connection import Client
    from .consumer import Consumer
    from .message import Message
    from .nsqd import NSQD
    from .tls import TLSSession

STATE_INIT, STATE_DISCONNECTED, STATE_CONNECTED, STATE_SUBSCRIBED, STATE_CLOSING = range(5)
DEFAULT_BUFFER_SIZE = 16 * 1024

#: commands that run while earlier replies wait (QueuedReply): their replies queue behind
#: them. Any other command (IDENTIFY's upgrades, SUB, AUTH, CLS) waits until the replies are out.
PIPELINED = frozenset({b"PUB", b"MPUB", b"DPUB", b"FIN", FIN_RUN, b"REQ", b"TOUCH", b"RDY", b"NOP"})
#: replies a connection may have waiting before it reads no further command
MAX_QUEUED_REPLIES = 1024
#: in the reply queue: close the connection once what is before it is out (a fatal error)
_CLOSE = b""


class QueuedReply:
    """A reply that waits for something the connection need not stop for: a replicated
    publish's acknowledgements by the peers (docs/replication.md). The client's later
    commands run meanwhile and their replies queue behind this one, so replies keep the
    commands' order and one connection's publishes overlap their replication round trips."""

    __slots__ = ("task", "tells_when_done")

    def __init__(self, reply: Awaitable[bytes | None], tells_when_done: bool = False) -> None:
        self.task: asyncio.Future[bytes | None] = asyncio.ensure_future(reply)
        #: whoever completes ``task`` calls :meth:`ClientV2.send_ready_replies` right after, in
        #: its own loop turn: no done-callback turn between a peer's ACK and the OK
        self.tells_when_done = tells_when_done


class ClientV2:
    """One consumer or producer; to its channel, a :class:`Consumer`."""

    #: the connection's flush policy, bound in ``__init__`` (Consumer.after_deliveries)
    after_deliveries: Callable[[], None]

    def __init__(self, nsqd: NSQD, client_id: int) -> None:
        opts = nsqd.options
        self.nsqd = nsqd
        self.id = client_id
        self.loop = nsqd.loop
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.state = STATE_INIT
        self.channel: Channel | None = None
        self.ready_count = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.connect_ts = int(time.time())
        self.sample_rate = 0
        self.msg_timeout = opts.msg_timeout
        self.heartbeat_interval = opts.client_timeout / 2
        self.output_buffer_size = DEFAULT_BUFFER_SIZE
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.auth_state: AuthState | None = None
        self.auth_secret = ""
        self.tls_version = ""
        self.tls_cipher = ""
        self.tls_common_name = ""
        self._task: asyncio.Task[None] | None = None  # awaiting a suspending command's answer
        #: replies in the order owed: QueuedReply until its wait ends, then frames (bytes);
        #: empty unless a QueuedReply is waiting
        self._replies: deque[QueuedReply | bytes] = deque()
        self._replies_out: asyncio.Future[None] | None = None
        self.connection = Connection(self, nsqd)
        self.after_deliveries = self.connection.after_deliveries

    def __repr__(self) -> str:
        return self.connection.remote_address

    # ------------------------------------------------------------------ the connection's

    # The members below pass on to the connection for the modules that reach it through its
    # client: nsqd (byte totals), kick (aborting), auth and the logs (the address), the
    # protocol's handlers (upgrades, timers, closing).

    @property
    def remote_address(self) -> str:
        return self.connection.remote_address

    @property
    def bytes_received(self) -> int:
        return self.connection.bytes_received

    @property
    def bytes_sent(self) -> int:
        return self.connection.bytes_sent

    @property
    def closed(self) -> bool:
        return self.connection.closed

    def flush(self) -> None:
        self.connection.flush()

    def start_upgrades(self, tls_context: SSL.Context | None, compression: str, level: int) -> None:
        self.connection.start_upgrades(tls_context, compression, level)

    def identified(self) -> None:
        """Restart the connection's timers with the settings IDENTIFY negotiated."""
        self.connection.restart_timers()

    def close(self) -> None:
        self.connection.close()

    # ------------------------------------------------------------------ from its connection

    def connected_from(self, host: str) -> None:
        self.client_id = self.hostname = host

    def tls_established(self, session: TLSSession) -> None:
        self.tls = True
        self.tls_version = session.version
        self.tls_cipher = session.cipher
        self.tls_common_name = session.peer_common_name

    def compression_started(self, compression: str) -> None:
        if compression == "snappy":
            self.snappy = True
        else:
            self.deflate = True

    def connection_closed(self) -> None:
        self.state = STATE_CLOSING
        if self._task is not None:
            self._task.cancel()
        if self.channel is not None:
            self.channel.remove_client(self)
        self.nsqd.remove_client(self)

    # ------------------------------------------------------------------ commands

    def run_commands(self, commands: list[Command]) -> None:
        """Each command through its verb's handler, answered in order; a command that waits
        (AUTH's query, a sliced MPUB) holds the rest until it has answered."""
        protocol = self.nsqd.protocol
        handlers = protocol.handlers
        connection = self.connection
        begin_command = connection.begin_command
        send_frame = connection.send_frame
        replies = self._replies
        for index, command in enumerate(commands):
            if replies and command.name not in PIPELINED:
                self._suspend(self._replies_sent(), commands[index:])
                return
            begin_command()
            try:
                handler = handlers.get(command.name)
                if handler is None:
                    protocol.check_tls(self, command.name)
                    raise ProtocolError(
                        "E_INVALID", f"invalid command {command.name.decode(errors='replace')}"
                    )
                response = handler(self, command)
                if isinstance(response, bytes):
                    if replies:
                        replies.append(encode_response(response))
                    else:
                        send_frame(encode_response(response))
                elif isinstance(response, QueuedReply):
                    self._queue_reply(response)
                    if len(replies) >= MAX_QUEUED_REPLIES:
                        self._suspend(self._replies_sent(), commands[index + 1 :])
                        return
                elif response is not None:  # AUTH: wait for the auth server, in order
                    self._suspend(response, commands[index + 1 :])
                    return
            except NeedsReauth:
                self._suspend(self.nsqd.auth.reauthenticate(self), commands[index:])
                return
            except ProtocolError as err:
                self.send_error(err)
                if err.fatal:
                    return
            if connection.closed:
                return

    def _suspend(self, pending: Awaitable[bytes | None], rest: list[Command]) -> None:
        """Hold the rest of the stream until ``pending`` (an auth query, a sliced MPUB) has
        answered."""
        self.connection.suspend_input()
        self._task = self.loop.create_task(self._resume_after(pending, rest))

    async def _resume_after(self, pending: Awaitable[bytes | None], rest: list[Command]) -> None:
        connection = self.connection
        try:
            response = await pending
        except ProtocolError as err:
            response = None
            if connection.closed:
                return
            self.send_error(err)
            if err.fatal:
                return
        if connection.closed:
            return
        if response:
            self.send_response(response)
        connection.resume_input(rest)

    # ------------------------------------------------------------------ queued replies

    def _queue_reply(self, reply: QueuedReply) -> None:
        self._replies.append(reply)
        if not reply.tells_when_done:
            reply.task.add_done_callback(self.send_ready_replies)

    async def _replies_sent(self) -> None:
        """Until every queued reply is out (the next command needs the connection alone)."""
        if self._replies:
            self._replies_out = self.loop.create_future()
            await self._replies_out

    def send_ready_replies(self, _: object = None) -> None:
        """Send the queued replies that are ready, in order, up to the first still waiting
        (in one write)."""
        replies, connection = self._replies, self.connection
        with connection.batch():
            while replies and not connection.closed:
                head = replies[0]
                if isinstance(head, QueuedReply):
                    if not head.task.done():
                        return
                    frame, fatal = self._reply_frame(head.task)
                else:
                    frame, fatal = head, head is _CLOSE
                replies.popleft()
                if frame:
                    connection.send_frame(frame)
                if fatal:
                    connection.flush()
                    connection.close()
        replies.clear()
        if self._replies_out is not None and not self._replies_out.done():
            self._replies_out.set_result(None)

    def _reply_frame(self, task: asyncio.Future[bytes | None]) -> tuple[bytes, bool]:
        """A finished QueuedReply's frame, and whether it ends the connection."""
        if task.cancelled():
            return _CLOSE, True
        err = task.exception()
        if err is None:
            result = task.result()
            return (encode_response(result) if result else b""), False
        if not isinstance(err, ProtocolError):
            self.nsqd.logger.error(f"[{self.remote_address}] reply failed: {err!r}")
            return _CLOSE, True
        self.nsqd.writes.log_client_error(self.remote_address, err)
        return encode_error(err.to_bytes()), err.fatal

    def check_before_body(self, name: bytes, params: list[bytes]) -> None:
        """Report errors Go raises before it reads a body, without waiting for the body."""
        err = self.nsqd.protocol.check_before_body(self, name, params)
        if err is not None:
            self.send_error(err)

    def report_truncated(self, name: bytes, params: list[bytes], partial: bytes | None) -> None:
        """The input ended inside a command: Go's error for the command cut short."""
        err = self.nsqd.protocol.truncated_error(self, name, params, partial)
        if err is not None:
            self.send_error(err)

    def send_response(self, data: bytes) -> None:
        if self._replies:
            self._replies.append(encode_response(data))
            return
        self.connection.send_frame(encode_response(data))

    def send_error(self, err: ProtocolError) -> None:
        self.nsqd.writes.log_client_error(self.remote_address, err)  # a failing disk: summarised
        if self._replies:  # after the replies owed before it
            self._replies.append(encode_error(err.to_bytes()))
            if err.fatal:
                self.connection.suspend_input()
                self._replies.append(_CLOSE)
            return
        connection = self.connection
        connection.send_frame(encode_error(err.to_bytes()))
        if err.fatal:
            connection.flush()
            connection.close()

    # ------------------------------------------------------------------ delivery (Consumer)

    def send_message(self, msg: Message) -> None:
        """Buffer the frame of a message its channel has put in flight to this client."""
        self.in_flight_count += 1
        self.message_count += 1
        frame = msg.frame()
        connection = self.connection
        connection.out.append(frame)
        connection.out_len += len(frame)

    def send_messages(self, frames: list[bytes], count: int, size: int) -> None:
        """Buffer a window of message frames its channel has put in flight to this client
        (the flush's join copies each body once)."""
        connection = self.connection
        connection.out.extend(frames)
        connection.out_len += size
        self.in_flight_count += count
        self.message_count += count

    # ------------------------------------------------------------------ state changes

    def set_ready_count(self, count: int) -> None:
        self.ready_count = count
        if self.channel is not None:
            self.channel.pump(self)

    def finished_message(self) -> None:
        self.finished_messages(1)

    def finished_messages(self, count: int) -> None:
        """``count`` FINs (of one run): one refill for all of them."""
        self.finish_count += count
        self.in_flight_count -= count
        if self.channel is not None:
            self.channel.pump(self)

    def requeued_message(self) -> None:
        self.requeue_count += 1
        self.in_flight_count -= 1
        if self.channel is not None:
            self.channel.pump(self)

    def timed_out_message(self) -> None:
        self.in_flight_count -= 1
        if self.channel is not None and not self.connection.closed:
            self.channel.pump(self)

    def empty_in_flight(self) -> None:
        self.in_flight_count = 0

    def published(self, topic: str, count: int) -> None:
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + count

    def start_close(self) -> None:
        self.ready_count = 0
        self.state = STATE_CLOSING

    def stats(self, topic_filter: str = "") -> dict[str, Any]:
        """Its entry in /stats (Go's clientV2.Stats)."""
        stats: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "version": "V2",
            "remote_address": self.remote_address,
            "state": self.state,
            "ready_count": self.ready_count,
            "in_flight_count": self.in_flight_count,
            "message_count": self.message_count,
            "finish_count": self.finish_count,
            "requeue_count": self.requeue_count,
            "connect_ts": self.connect_ts,
            "sample_rate": self.sample_rate,
            "deflate": self.deflate,
            "snappy": self.snappy,
            "user_agent": self.user_agent,
        }
        auth = self.auth_state
        if auth is not None:
            stats["authed"] = True
            identity = getattr(auth, "identity", "")
            identity_url = getattr(auth, "identity_url", "")
            if identity:
                stats["auth_identity"] = identity
            if identity_url:
                stats["auth_identity_url"] = identity_url
        for topic, count in self.pub_counts.items():  # Go reports at most one (an early break)
            if topic_filter and topic != topic_filter:
                continue
            stats["pub_counts"] = [{"topic": topic, "count": count}]
            break
        stats.update(self.tls_stats())
        return stats

    def tls_stats(self) -> dict[str, Any]:
        return {
            "tls": self.tls,
            "tls_cipher_suite": self.tls_cipher,
            "tls_version": self.tls_version,
            "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": False,
        }

    @property
    def is_ready(self) -> bool:
        channel = self.channel
        return (
            channel is not None
            and not channel.paused
            and self.ready_count > 0
            and self.in_flight_count < self.ready_count
        )


if TYPE_CHECKING:

    def _is_a_consumer(client: ClientV2) -> Consumer:
        return client  # mypy checks here that ClientV2 satisfies the Consumer protocol

    def _is_a_connection_client(client: ClientV2) -> Client:
        return client  # and here that it is what its connection needs
