"""The V2 command handlers, one method per wire verb (Go: nsqd/protocol_v2.go).

Each handler takes the client and the parsed command, returns response bytes (or None) and
raises :class:`ProtocolError` with Go's exact code and text. Checks run in Go's order.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..internal import lg
from ..protocol import (
    CLOSE_WAIT,
    MSG_ID_LENGTH,
    OK,
    ProtocolError,
    as_int64,
    go_quote,
    is_valid_channel_name,
    is_valid_topic_name,
    parse_base10,
    parse_mpub_body,
)
from ..protocol.commands import FIN_RUN, Command
from .backend_writes import ack_after
from .channel import Channel, ChannelError
from .client_v2 import STATE_CLOSING, STATE_INIT, STATE_SUBSCRIBED, QueuedReply
from .connection import TURN_BUDGET
from .errors import BackendWriteError, NeedsReauth
from .options import max_defer_ms
from .topic import TopicError

if TYPE_CHECKING:
    from .client_v2 import ClientV2
    from .nsqd import NSQD
    from .replica.group import Replication
    from .topic import Topic

#: A handler answers with bytes, nothing, (AUTH) an awaitable the connection waits for, or (a
#: replicated publish) a QueuedReply the connection does not wait for.
Handler = Callable[["ClientV2", Command], "bytes | Awaitable[bytes | None] | QueuedReply | None"]

#: An MPUB of more messages is published in slices of this many, a turn's budget of them per
#: loop turn: one client's huge MPUB of tiny messages must not stall the other clients.
MPUB_PUBLISH_SLICE = 1000

_IDENTIFY_INT_FIELDS = (
    "heartbeat_interval",
    "output_buffer_size",
    "output_buffer_timeout",
    "sample_rate",
    "msg_timeout",
    "deflate_level",
)
_IDENTIFY_STR_FIELDS = ("client_id", "hostname", "user_agent")
_IDENTIFY_BOOL_FIELDS = ("feature_negotiation", "tls_v1", "snappy", "deflate")


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="surrogateescape")


def _duration_ns(milliseconds: int) -> int:
    """Go's ``time.Duration(ms) * time.Millisecond`` for a parsed uint64: int64 wrap-around."""
    return as_int64(as_int64(milliseconds) * 1_000_000)


def _message_id(raw: bytes) -> bytes:
    if len(raw) != MSG_ID_LENGTH:
        raise ProtocolError("E_INVALID", "invalid message ID")
    return raw


class ProtocolV2:
    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self.writes = nsqd.writes  # the disk-write side (backend_writes.py)
        self.handlers: dict[bytes, Handler] = {
            b"IDENTIFY": self.IDENTIFY,
            b"FIN": self.FIN,
            b"RDY": self.RDY,
            b"REQ": self.REQ,
            b"PUB": self.PUB,
            b"MPUB": self.MPUB,
            b"DPUB": self.DPUB,
            b"NOP": self.NOP,
            b"TOUCH": self.TOUCH,
            b"SUB": self.SUB,
            b"CLS": self.CLS,
            b"AUTH": self.AUTH,
        }
        opts = nsqd.options
        self._tls_required = opts.tls_required != 0
        if self._tls_required:  # wrapped only when required: the plain path pays nothing
            for name, handler in list(self.handlers.items()):
                if name != b"IDENTIFY":
                    self.handlers[name] = self._with_tls_check(name, handler)
        self.handlers[FIN_RUN] = self.FIN_RUN  # checks TLS itself, under FIN's name

    # ------------------------------------------------------------------ policies

    def _with_tls_check(self, name: bytes, handler: Handler) -> Handler:
        def checked(
            client: ClientV2, command: Command
        ) -> bytes | Awaitable[bytes | None] | QueuedReply | None:
            self.check_tls(client, name)
            return handler(client, command)

        return checked

    def check_tls(self, client: ClientV2, name: bytes) -> None:
        if self._tls_required and not client.tls:
            raise ProtocolError(
                "E_INVALID", f"cannot {_text(name)} in current state (TLS required)"
            )

    def check_before_body(
        self, client: ClientV2, name: bytes, params: list[bytes]
    ) -> ProtocolError | None:
        """The checks Go makes before reading a command's body (for a body still in transit)."""
        try:
            if name != b"IDENTIFY":
                self.check_tls(client, name)
            if name == b"IDENTIFY" and client.state != STATE_INIT:
                raise ProtocolError("E_INVALID", "cannot IDENTIFY in current state")
            if name == b"AUTH":
                self._auth_preconditions(client, params)
            elif name in (b"PUB", b"DPUB"):
                self._publish_preconditions(_text(name), params)
            elif name == b"MPUB":
                self._mpub_preconditions(client, params)
        except ProtocolError as err:
            return err
        except NeedsReauth:
            return None  # checked again, after re-auth, when the whole command has arrived
        return None

    def truncated_error(
        self, client: ClientV2, name: bytes, params: list[bytes], partial: bytes | None
    ) -> ProtocolError | None:
        """The error Go sends when the stream ends inside a command's body."""
        early = self.check_before_body(client, name, params)
        if early is not None:
            return early
        verb = _text(name)
        if name in (b"PUB", b"DPUB"):
            what = "message body size" if partial is None else "message body"
            return ProtocolError("E_BAD_MESSAGE", f"{verb} failed to read {what}")
        if name == b"MPUB":
            if partial is None:
                return ProtocolError("E_BAD_BODY", "MPUB failed to read body size")
            opts = self.nsqd.options
            try:
                parse_mpub_body(partial, opts.max_msg_size, opts.max_body_size)
            except ProtocolError as err:
                return err
            return None
        what = "body size" if partial is None else "body"
        return ProtocolError("E_BAD_BODY", f"{verb} failed to read {what}")

    # ------------------------------------------------------------------ IDENTIFY / AUTH

    def IDENTIFY(
        self, client: ClientV2, command: Command
    ) -> bytes | Awaitable[bytes | None] | None:
        if client.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot IDENTIFY in current state")
        body = self._body(command, "E_BAD_BODY", "IDENTIFY", self.nsqd.options.max_body_size)
        data = self._decode_identify(body)
        if self.nsqd.logger.enabled(lg.DEBUG):
            self.nsqd.logger.debug(f"PROTOCOL(V2): [{client.remote_address}] {data}")
        try:
            self.nsqd.identify(client, data)
        except ValueError as exc:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY {exc}") from None
        client.identified()
        if not data.get("feature_negotiation"):
            return OK
        response, tls_context, compression, level = self.nsqd.identify_response(client, data)
        client.send_response(response)
        client.start_upgrades(tls_context, compression, level)
        return None

    @staticmethod
    def _decode_identify(body: bytes) -> dict[str, Any]:
        try:
            data = json.loads(body)
            if not isinstance(data, dict):
                raise ValueError
            for key in _IDENTIFY_INT_FIELDS:
                if key in data and data[key] is not None:
                    value = data[key]
                    if isinstance(value, bool) or not isinstance(value, int | float):
                        raise ValueError
                    if isinstance(value, float) and not value.is_integer():
                        raise ValueError
                    data[key] = int(value)
            for key in _IDENTIFY_STR_FIELDS:
                if key in data and data[key] is not None and not isinstance(data[key], str):
                    raise ValueError
            for key in _IDENTIFY_BOOL_FIELDS:
                if key in data and data[key] is not None and not isinstance(data[key], bool):
                    raise ValueError
        except (ValueError, RecursionError):
            raise ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        return data

    def _auth_preconditions(self, client: ClientV2, params: list[bytes]) -> None:
        if client.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot AUTH in current state")
        if params:
            raise ProtocolError("E_INVALID", "AUTH invalid number of parameters")

    def AUTH(self, client: ClientV2, command: Command) -> bytes | Awaitable[bytes | None] | None:
        self._auth_preconditions(client, command.params)
        body = self._body(command, "E_BAD_BODY", "AUTH", self.nsqd.options.max_body_size)
        if client.auth_state is not None and client.auth_state.authorizations:
            raise ProtocolError("E_INVALID", "AUTH already set")
        if not self.nsqd.auth.enabled:
            raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")
        return self.nsqd.auth.authenticate(client, body)

    # ------------------------------------------------------------------ consuming

    def SUB(self, client: ClientV2, command: Command) -> bytes | Awaitable[bytes | None] | None:
        if client.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot SUB in current state")
        if client.heartbeat_interval <= 0:
            raise ProtocolError("E_INVALID", "cannot SUB with heartbeats disabled")
        params = command.params
        if len(params) < 2:
            raise ProtocolError("E_INVALID", "SUB insufficient number of parameters")
        topic_name = _text(params[0])
        if not is_valid_topic_name(topic_name):
            raise ProtocolError(
                "E_BAD_TOPIC", f"SUB topic name {go_quote(topic_name)} is not valid"
            )
        channel_name = _text(params[1])
        if not is_valid_channel_name(channel_name):
            raise ProtocolError(
                "E_BAD_CHANNEL", f"SUB channel name {go_quote(channel_name)} is not valid"
            )
        self.nsqd.auth.check(client, "SUB", topic_name, channel_name)
        topic = self.nsqd.get_topic(topic_name)
        channel = topic.get_channel(channel_name)
        try:
            channel.add_client(client)
        except ChannelError as exc:
            raise ProtocolError("E_SUB_FAILED", f"SUB failed {exc}") from None
        if (channel.ephemeral and channel.exiting) or (topic.ephemeral and topic.exiting):
            channel.remove_client(client)
            raise ProtocolError("E_SUB_FAILED", "SUB failed to deleted topic/channel")
        client.state = STATE_SUBSCRIBED
        client.channel = channel
        return ack_after(self.nsqd.topic_starting(topic), OK)

    def RDY(self, client: ClientV2, command: Command) -> bytes | None:
        if client.state == STATE_CLOSING:
            return None
        if client.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot RDY in current state")
        count = 1
        if command.params:
            parsed = parse_base10(command.params[0])
            if parsed is None:
                raise ProtocolError(
                    "E_INVALID", f"RDY could not parse count {_text(command.params[0])}"
                )
            count = as_int64(parsed)
        max_rdy = self.nsqd.options.max_rdy_count
        if count < 0 or count > max_rdy:
            raise ProtocolError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        client.set_ready_count(count)
        return None

    def _in_flight_command(
        self, client: ClientV2, command: Command, name: str, nparams: int
    ) -> bytes:
        if client.state != STATE_SUBSCRIBED and client.state != STATE_CLOSING:
            raise ProtocolError("E_INVALID", f"cannot {name} in current state")
        if len(command.params) < nparams:
            raise ProtocolError("E_INVALID", f"{name} insufficient number of params")
        return _message_id(command.params[0])

    def FIN(self, client: ClientV2, command: Command) -> bytes | None:
        msg_id = self._in_flight_command(client, command, "FIN", 1)
        channel = client.channel
        assert channel is not None
        try:
            channel.finish_message(client, msg_id)
        except ChannelError as exc:
            raise ProtocolError("E_FIN_FAILED", f"FIN {_text(msg_id)} failed {exc}") from None
        client.finished_message()
        return None

    def FIN_RUN(self, client: ClientV2, command: Command) -> Awaitable[None] | None:
        """A run of FIN lines (``CommandParser(fin_runs=True)``): the IDs are finished in one
        pass and the client refilled once; an ID that fails goes through :meth:`FIN` for
        Go's error, after the messages the FINs before it made room for."""
        ids = command.params
        channel = client.channel
        state = client.state
        if (
            channel is None
            or (state != STATE_SUBSCRIBED and state != STATE_CLOSING)
            or (self._tls_required and not client.tls)
        ):
            self._fin_each(client, ids)
            return None
        start = self._finish_until_turn_ends(client, channel, ids, 0)
        if start < len(ids):
            return self._finish_on_later_turns(client, channel, ids, start)
        return None

    def _finish_until_turn_ends(
        self, client: ClientV2, channel: Channel, ids: list[bytes], start: int
    ) -> int:
        """FIN ``ids`` from ``start`` until all are done or, after a failing one (an error
        sent and logged: the costly case), the client's turn is over; where it stopped."""
        end = len(ids)
        while start < end:
            stop = channel.finish_many(client, ids, start)
            if stop > start:
                client.finished_messages(stop - start)
            if stop == end:
                return end
            self._fin_each(client, ids[stop : stop + 1])
            start = stop + 1
            if time.perf_counter() >= client.connection.turn_deadline or client.closed:
                break
        return start

    async def _finish_on_later_turns(
        self, client: ClientV2, channel: Channel, ids: list[bytes], start: int
    ) -> None:
        """The rest of a run whose failures outlasted the turn (the client's later commands
        wait): a stream of failing FINs takes its turns like any other input."""
        while start < len(ids):
            await asyncio.sleep(0)
            if client.closed:
                return None
            connection = client.connection
            connection.turn_deadline = time.perf_counter() + TURN_BUDGET
            with connection.batch():
                start = self._finish_until_turn_ends(client, channel, ids, start)
        return None

    def _fin_each(self, client: ClientV2, ids: list[bytes]) -> None:
        """FIN one ID at a time, as separate commands would be: a non-fatal error is sent and
        the run goes on; a fatal one ends it (the connection closes)."""
        fin = self.handlers[b"FIN"]
        begin_command = client.connection.begin_command
        for msg_id in ids:
            begin_command()  # its error goes after the refills of earlier FINs
            try:
                fin(client, Command(b"FIN", [msg_id]))
            except ProtocolError as err:
                if err.fatal:
                    raise
                client.send_error(err)

    def REQ(self, client: ClientV2, command: Command) -> bytes | None:
        msg_id = self._in_flight_command(client, command, "REQ", 2)
        raw = command.params[1]
        timeout_ms = parse_base10(raw)
        if timeout_ms is None:
            raise ProtocolError("E_INVALID", f"REQ could not parse timeout {_text(raw)}")
        timeout_ns = _duration_ns(timeout_ms)
        max_ns = round(self.nsqd.options.max_req_timeout * 1e9)
        clamped = min(max(timeout_ns, 0), max_ns)
        if clamped != timeout_ns:
            self.nsqd.logger.info(
                f"PROTOCOL(V2): [{client.remote_address}] REQ timeout {timeout_ns} out of "
                f"range 0-{max_ns}. Setting to {clamped}"
            )
        delay = clamped / 1e9
        channel = client.channel
        assert channel is not None
        try:
            channel.requeue_message(client, msg_id, delay)
        except ChannelError as exc:
            raise ProtocolError("E_REQ_FAILED", f"REQ {_text(msg_id)} failed {exc}") from None
        client.requeued_message()
        return None

    def TOUCH(self, client: ClientV2, command: Command) -> bytes | None:
        msg_id = self._in_flight_command(client, command, "TOUCH", 1)
        channel = client.channel
        assert channel is not None
        try:
            channel.touch_message(client, msg_id, self.nsqd.now())
        except ChannelError as exc:
            raise ProtocolError("E_TOUCH_FAILED", f"TOUCH {_text(msg_id)} failed {exc}") from None
        return None

    def CLS(self, client: ClientV2, command: Command) -> bytes | None:
        if client.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot CLS in current state")
        client.start_close()
        return CLOSE_WAIT

    def NOP(self, client: ClientV2, command: Command) -> bytes | None:
        return None

    # ------------------------------------------------------------------ publishing

    def _publish_preconditions(self, name: str, params: list[bytes]) -> tuple[str, float]:
        needed = 2 if name == "DPUB" else 1
        if len(params) < needed:
            raise ProtocolError("E_INVALID", f"{name} insufficient number of parameters")
        topic_name = _text(params[0])
        if not is_valid_topic_name(topic_name):
            raise ProtocolError(
                "E_BAD_TOPIC", f"{name} topic name {go_quote(topic_name)} is not valid"
            )
        delay = 0.0
        if name == "DPUB":
            timeout_ms = parse_base10(params[1])
            if timeout_ms is None:
                raise ProtocolError("E_INVALID", f"DPUB could not parse timeout {_text(params[1])}")
            max_ms = max_defer_ms(self.nsqd.options)  # nsqpy --max-defer-timeout, else Go's
            timeout_ns = _duration_ns(timeout_ms)
            if timeout_ns < 0 or timeout_ns > max_ms * 1_000_000:
                raise ProtocolError(
                    "E_INVALID", f"DPUB timeout {timeout_ms} out of range 0-{max_ms}"
                )
            delay = timeout_ms / 1000.0
        return topic_name, delay

    def _publish_one(
        self, client: ClientV2, command: Command, name: str
    ) -> bytes | Awaitable[bytes | None] | QueuedReply:
        topic_name, delay = self._publish_preconditions(name, command.params)
        body = self._body(command, "E_BAD_MESSAGE", name, self.nsqd.options.max_msg_size)
        self.nsqd.auth.check(client, name, topic_name, "")
        topic = self.nsqd.get_topic(topic_name)
        msg = topic.new_message(body)
        msg.deferred = delay
        if self.nsqd.draining:  # nsqpy --drain-timeout (nsqd/beyond/drain.py)
            raise ProtocolError(f"E_{name}_FAILED", f"{name} failed draining")
        replication = self.nsqd.replication
        if replication is not None:  # too few peers reachable: Go's E_PUB_FAILED wording
            replication.refuse_if_short(name)
        syncs = self.writes.running_syncs(topic)
        try:
            topic.put_message(msg)
        except (TopicError, BackendWriteError) as exc:
            raise ProtocolError(f"E_{name}_FAILED", f"{name} failed {exc}") from None
        client.published(topic_name, 1)
        if replication is not None:  # the OK once acks-1 peers stored it
            return self._replicated_ok(
                client, replication, syncs + self.nsqd.topic_starting(topic), name
            )
        return ack_after(syncs + self.nsqd.topic_starting(topic), OK)

    @staticmethod
    def _replicated_ok(
        client: ClientV2,
        replication: Replication,
        waits: tuple[asyncio.Task[None], ...],
        name: str,
    ) -> bytes | Awaitable[bytes | None] | QueuedReply:
        """The OK once acks-1 peers stored what was put; while it waits for them, the
        client's later commands run (their replies queue behind it)."""
        if waits or replication.acks <= 1:
            return replication.ack_after(waits, OK, name)
        reply = replication.ack_when_stored(OK, name, client.send_ready_replies)
        return reply if isinstance(reply, bytes) else QueuedReply(reply, tells_when_done=True)

    def PUB(
        self, client: ClientV2, command: Command
    ) -> bytes | Awaitable[bytes | None] | QueuedReply | None:
        return self._publish_one(client, command, "PUB")

    def DPUB(
        self, client: ClientV2, command: Command
    ) -> bytes | Awaitable[bytes | None] | QueuedReply | None:
        return self._publish_one(client, command, "DPUB")

    def _mpub_preconditions(self, client: ClientV2, params: list[bytes]) -> str:
        if not params:
            raise ProtocolError("E_INVALID", "MPUB insufficient number of parameters")
        topic_name = _text(params[0])
        if not is_valid_topic_name(topic_name):
            raise ProtocolError(
                "E_BAD_TOPIC", f"E_BAD_TOPIC MPUB topic name {go_quote(topic_name)} is not valid"
            )
        self.nsqd.auth.check(client, "MPUB", topic_name, "")
        return topic_name

    def MPUB(
        self, client: ClientV2, command: Command
    ) -> bytes | Awaitable[bytes | None] | QueuedReply | None:
        topic_name = self._mpub_preconditions(client, command.params)
        topic = self.nsqd.get_topic(topic_name)
        opts = self.nsqd.options
        if command.bad_body_size is not None:
            size = command.bad_body_size
            if size <= 0:
                raise ProtocolError("E_BAD_BODY", f"MPUB invalid body size {size}")
            raise ProtocolError("E_BAD_BODY", f"MPUB body too big {size} > {opts.max_body_size}")
        bodies = command.messages
        if bodies is None:  # the body stopped at a bad count or size: Go's error for it
            assert command.body is not None
            bodies = parse_mpub_body(command.body, opts.max_msg_size, opts.max_body_size)
        replication = self.nsqd.replication
        sized_bodies = None
        if replication is not None:  # too few peers reachable: Go's E_MPUB_FAILED wording
            replication.refuse_if_short("MPUB")
            if command.messages is not None and command.body is not None:
                # the count, then exactly the messages split: sent on to the peers as is
                sized_bodies = memoryview(command.body)[4:]
        if len(bodies) > MPUB_PUBLISH_SLICE and not self.nsqd.queue_limits.active:
            # (under --max-queue-bytes one put admits or refuses the MPUB as a whole)
            # shielded: like Go, a closing client does not stop the publish of a read MPUB
            return asyncio.shield(self._publish_slices(client, topic, bodies))
        syncs = self._put_slice(client, topic, bodies, self.nsqd.wall_ns(), sized_bodies)
        if replication is not None:  # the OK once acks-1 peers stored them
            waits = syncs + self.nsqd.topic_starting(topic)
            return self._replicated_ok(client, replication, waits, "MPUB")
        return ack_after(syncs + self.nsqd.topic_starting(topic), OK)

    def _put_slice(
        self,
        client: ClientV2,
        topic: Topic,
        bodies: list[bytes],
        timestamp: int,
        sized_bodies: memoryview | None = None,
    ) -> tuple[asyncio.Task[None], ...]:
        """Publish ``bodies`` in one batch of disk writes; the syncs the OK waits for."""
        self._refuse_mpub_if_draining()
        try:
            syncs = topic.put_batch(bodies, timestamp, sized_bodies)
        except (TopicError, BackendWriteError) as exc:
            raise ProtocolError("E_MPUB_FAILED", f"MPUB failed {exc}") from None
        client.published(topic.name, len(bodies))
        return syncs

    def _refuse_mpub_if_draining(self) -> None:
        if self.nsqd.draining:  # nsqpy --drain-timeout (nsqd/beyond/drain.py)
            raise ProtocolError("E_MPUB_FAILED", "MPUB failed draining")

    async def _publish_slices(self, client: ClientV2, topic: Topic, bodies: list[bytes]) -> bytes:
        """A huge MPUB, MPUB_PUBLISH_SLICE messages at a time (``Topic.put_sliced``): the
        client's later commands wait for its OK; a failing slice ends it with Go's error, the
        slices before it published."""
        waits = set(self.nsqd.topic_starting(topic))
        slices = (
            bodies[start : start + MPUB_PUBLISH_SLICE]
            for start in range(0, len(bodies), MPUB_PUBLISH_SLICE)
        )

        def published(count: int) -> None:
            client.published(topic.name, count)

        try:
            syncs = await topic.put_sliced(slices, self._refuse_mpub_if_draining, published)
        except (TopicError, BackendWriteError) as exc:
            raise ProtocolError("E_MPUB_FAILED", f"MPUB failed {exc}") from None
        waits.update(syncs)
        if waits:
            await asyncio.wait(waits)
        if self.nsqd.replication is not None:
            await self.nsqd.replication.replicated("MPUB")
        return OK

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _body(command: Command, code: str, name: str, limit: int) -> bytes:
        """The command's body, or Go's error for an out-of-bounds size."""
        size = command.bad_body_size
        if size is not None:
            if code == "E_BAD_MESSAGE":  # PUB/DPUB check <= 0 first, then the limit
                if size <= 0:
                    raise ProtocolError(code, f"{name} invalid message body size {size}")
                raise ProtocolError(code, f"{name} message too big {size} > {limit}")
            if size > limit:  # IDENTIFY/AUTH check the limit first
                raise ProtocolError(code, f"{name} body too big {size} > {limit}")
            raise ProtocolError(code, f"{name} invalid body size {size}")
        assert command.body is not None
        return command.body
