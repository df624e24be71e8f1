"""The replication runtime of one nsqd (docs/replication.md, "How it works").

:class:`Replication` is ``nsqd.replication`` when ``--replica-peer`` is given (else None, and
nothing here runs). It holds this node's *stream* (the ordered events of what it owns), one
outbound link per peer carrying that stream (:class:`PeerLink`), the inbound links of the
peers' streams (:class:`InboundLink`, handed over by the client port on the ``  R1`` magic),
one :class:`ReplicaStore` per owner incarnation held here, and the takeover of a store whose
owner is judged gone.

The incarnation is new at every start: a restarted node's peers take over what they held for
its previous run at its first HELLO (duplicates of what it still had, never loss).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ...protocol import ProtocolError
from ...protocol import replica as r1
from ...protocol.names import is_ephemeral
from ...protocol.replica import (
    OP_CREATE,
    OP_DELETE,
    OP_EMPTY,
    OP_PAUSE,
    OP_UNPAUSE,
    Attempts,
    ChannelOp,
    Defer,
    Event,
    Fanout,
    Fin,
    Put,
    Puts,
    ReplicaProtocolError,
    Run,
    TopicOp,
)
from ..backend_writes import ack_after, framed_records, framed_run
from ..errors import BackendWriteError
from ..message import Message, MessageRun
from ..options import ReplicaOptionError, parse_replica_peer
from .snapshot import live_events
from .store import ReplicaStore, ReplicaStoreError, SequenceGap, Takeover, list_stores

if TYPE_CHECKING:
    from ..channel import Channel
    from ..nsqd import NSQD
    from ..topic import Topic

#: the most event bytes (bodies, roughly) one EVENTS frame carries
FRAME_BUDGET = 4 * 1024 * 1024
#: the first and the longest wait before a link dials its peer again
RECONNECT_MIN = 0.05
RECONNECT_MAX = 2.0
#: how often a store's unsynced events are checked against --sync-timeout (seconds, at most)
SYNC_POLL = 0.1
#: a segment of an incarnation's stream held after a gap: ``<incarnation>~<first seq - 1>``
SEGMENT_MARK = "~"


class ReplicasShort(Exception):
    """Fewer copies reachable than --replica-acks: ``replicas 1 < 2``."""


def _peer_key(address: str) -> tuple[str, int] | None:
    try:
        return parse_replica_peer(address)
    except ReplicaOptionError:
        return None


@dataclass
class _Held:
    """What this node holds for one owner incarnation (from ``offset + 1`` of its stream)."""

    owner: str
    incarnation: str
    offset: int
    store: ReplicaStore
    last_heard: float
    link: InboundLink | None = None
    acked: int = 0  # the last sequence number ACKed to the owner (the owner's numbering)
    gone: bool = False  # the owner started anew: this incarnation will not speak again
    syncing: bool = False  # an fsync of the store runs in the sync thread


@dataclass
class _Stream:
    """This node's events not yet acknowledged by every peer that counts (numbered from
    ``base``)."""

    base: int = 1
    events: list[Event] = field(default_factory=list)
    #: the kept events' sizes, roughly (bodies and records, 64 bytes of the rest)
    sizes: list[int] = field(default_factory=list)
    size: int = 0

    @property
    def last(self) -> int:
        return self.base + len(self.events) - 1

    def append(self, event: Event) -> None:
        size = _event_size(event)
        self.events.append(event)
        self.sizes.append(size)
        self.size += size

    def size_since(self, seq: int) -> int:
        """Bytes of the events after ``seq``, roughly."""
        start = max(0, seq + 1 - self.base)
        return self.size - sum(self.sizes[:start]) if start else self.size

    def since(self, seq: int) -> list[Event]:
        return self.events[max(0, seq - self.base) :]

    def trim(self, upto: int) -> None:
        """Drop events up to ``upto`` (all peers that count have them)."""
        drop = min(upto - self.base + 1, len(self.events))
        if drop > 0 and (drop >= 1024 or drop * 2 >= len(self.events)):
            self.size -= sum(self.sizes[:drop])
            del self.events[:drop]
            del self.sizes[:drop]
            self.base += drop


def _event_size(event: Event) -> int:
    if isinstance(event, Puts):
        return len(event.records) + 64
    if isinstance(event, Run):
        return len(event.bodies) + 16 * len(event.ids) + 64
    return len(event.body) + 64 if isinstance(event, Put) else 64


class _NamedPuts:
    """A topic's puts whose events named its channels at put time and that its pump has not
    copied yet: their IDs, each put's with the names, in queue order; and how many."""

    __slots__ = ("count", "puts")

    def __init__(self) -> None:
        self.puts: deque[tuple[tuple[bytes, ...], tuple[str, ...]]] = deque()
        self.count = 0

    def add(self, ids: tuple[bytes, ...], names: tuple[str, ...]) -> None:
        self.puts.append((ids, names))
        self.count += len(ids)

    def take(self, ids: tuple[bytes, ...]) -> tuple[str, ...] | None:
        """The names of the first put, if ``ids`` are its first IDs (then taken off it);
        else None, and every put is let go (not expected: a later copy goes as a Fanout)."""
        put_ids, names = self.puts[0]
        count = len(ids)
        if ids != put_ids[:count]:
            self.puts.clear()
            self.count = 0
            return None
        if count < len(put_ids):
            self.puts[0] = (put_ids[count:], names)
        else:
            self.puts.popleft()
        self.count -= count
        return names


@dataclass(slots=True)
class _Waiter:
    """A wait for acks-1 peers to acknowledge ``seq``: ``future`` gets ``response`` then, or
    the failure (in Go's wording for ``name``'s publish when ``name`` is given)."""

    seq: int
    future: asyncio.Future[bytes | None]
    response: bytes | None = None
    name: str | None = None
    #: called once ``future`` is done, in the same loop turn (the publisher's replies go out)
    then: Callable[[], None] | None = None


class Replication:
    def __init__(self, nsqd: NSQD, peers: Sequence[tuple[str, int]], address: str) -> None:
        self.nsqd = nsqd
        opts = nsqd.options
        self.acks = opts.replica_acks
        self.timeout = opts.replica_timeout
        self.max_lag = opts.replica_max_lag
        self.address = address
        self.incarnation = secrets.token_hex(8)
        self.directory = Path(nsqd.data_path) / "replica"
        self.stream = _Stream()
        self.links = [PeerLink(self, host, port) for host, port in peers]
        self.held: dict[tuple[str, str], _Held] = {}
        self.taken_over: dict[str, int] = {}
        self.inbound: set[InboundLink] = set()
        self._waiters: deque[_Waiter] = deque()
        self._short_since: float | None = None
        #: the flush scheduled for the loop turn after the next, while events wait to be sent
        self._flush_handle: asyncio.Handle | None = None
        #: per topic, the Puts or Runs not sent yet whose messages wait for a Fanout: (seq,
        #: their IDs)
        self._unassigned: dict[str, deque[tuple[int, tuple[bytes, ...]]]] = {}
        #: per topic, the puts whose events named its channels at put time (_channels_at_put)
        self._named: dict[str, _NamedPuts] = {}
        self._tasks: list[asyncio.Task[None]] = []
        #: a peer's CHANNEL or TOPIC operation is being applied: not echoed (see _apply_op)
        self._applying = False
        self._same_node_id: set[str] = set()  # peers told they share this node's --node-id
        self.started_at = nsqd.now()
        #: the stores' fsyncs run here, off the loop: a peer's fsync must not stall the
        #: clients this node serves, nor its reading of the next events meanwhile
        self._syncer = ThreadPoolExecutor(max_workers=2, thread_name_prefix="replica-sync")

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        now = self.nsqd.now()
        for owner, key in list_stores(self.directory):
            incarnation, _, offset = key.partition(SEGMENT_MARK)
            try:
                held = self._open_store(owner, incarnation, int(offset or 0), now)
            except (OSError, ReplicaStoreError, ValueError) as exc:
                self.nsqd.logger.error(f"REPLICA: cannot open store of {owner}: {exc}")
                continue
            self.held[(owner, incarnation)] = held
        loop = self.nsqd.loop
        self._tasks = [loop.create_task(link.run()) for link in self.links]
        self._tasks.append(loop.create_task(self._watch()))
        self._tasks.append(loop.create_task(self._sync_stores()))
        self.nsqd.logger.info(
            f"REPLICA: {self.address} incarnation {self.incarnation}, "
            f"{len(self.links)} peers, acks {self.acks}"
        )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for link in list(self.inbound):
            link.close()
        self._syncer.shutdown(wait=True)
        for held in self.held.values():
            with contextlib.suppress(OSError, ReplicaStoreError):
                held.store.close()
        self._fail_waiters(ReplicasShort("exiting"))

    # ------------------------------------------------------------------ the stream

    def _emit(self, event: Event) -> None:
        self.stream.append(event)
        if self._flush_handle is None:
            # one loop turn later: a topic's pump scheduled by the same put runs first, so
            # its Fanout can still join the put's Puts (see fanout)
            self._flush_handle = self.nsqd.loop.call_soon(self._flush_next_turn)

    def _flush_next_turn(self) -> None:
        self._flush_handle = self.nsqd.loop.call_soon(self._flush)

    def flush_settled(self) -> None:
        """Send now what a client's commands emitted; a put whose event did not name its
        channels at put time has its topic pumped first, so that the event leaves naming them
        (one event for the peer, not a Puts and a Fanout).
        The publisher waits for the peers' ACK: the other connections' commands later in
        this loop turn must not hold its events back, or every connection's publishes
        would move in step. Left to the scheduled flush while a pump keeps its time."""
        if self._flush_handle is None:
            return
        for name, unassigned in self._unassigned.items():
            topic = self.nsqd.topics.get(name) if unassigned else None
            if topic is not None and not topic.pump_now():
                return
        if not any(self._unassigned.values()):
            self._flush()

    def _flush(self) -> None:
        """Every connected peer gets the events it has not been sent, in EVENTS frames:
        encoded once for the peers that were sent as much."""
        if self._flush_handle is not None:  # (a flush_settled came first)
            self._flush_handle.cancel()
            self._flush_handle = None
        self._unassigned.clear()
        last = self.stream.last
        frames: dict[int, list[bytes]] = {}
        for link in self.links:
            if link.up and link.sent < last:
                first = link.sent + 1
                if first not in frames:
                    frames[first] = event_frames(first, self.stream.since(first))
                link.write_frames(frames[first])
                link.sent = last
        if not any(link.counts(self.nsqd.now()) for link in self.links):
            self.stream.trim(last)  # no peer to keep them for
        elif self.stream.size > self.max_lag:
            self._cut_loose_laggards()

    def _cut_loose_laggards(self) -> None:
        """Peers that left over --replica-max-lag of the stream unacknowledged and have
        acknowledged nothing for --replica-timeout/2 stop counting (their link is closed),
        so the stream lets go of what they lack: each gets a snapshot when it links again.
        The OK rule goes on with the others. A peer that keeps acknowledging (one taking in a
        snapshot larger than the bound) is not cut loose."""
        now = self.nsqd.now()
        for link in self.links:
            if (
                link.counts(now)
                and now - link.progress_at >= self.timeout / 2
                and self.stream.size_since(link.acked) > self.max_lag
            ):
                self.nsqd.logger.warn(
                    f"REPLICA: {link.address} left over --replica-max-lag "
                    f"({self.max_lag} bytes) unacknowledged: cut loose"
                )
                link.cut_loose()
        counted = [link.acked for link in self.links if link.counts(now)]
        self.stream.trim(min(counted) if counted else self.stream.last)

    def acked(self, link: PeerLink, seq: int) -> None:
        now = self.nsqd.now()
        if seq > link.acked:
            link.acked = seq
            link.progress_at = now
        counted = [other.acked for other in self.links if other.counts(now)]
        self.stream.trim(min(counted) if counted else self.stream.last)
        self._resolve_waiters()

    # ------------------------------------------------------------------ events from the core

    def put(
        self,
        topic: Topic,
        msgs: Sequence[Message] | MessageRun,
        sized_bodies: bytes | memoryview | None = None,
    ) -> None:
        """A topic accepted ``msgs`` (before it copies them anywhere). ``sized_bodies`` are
        the bodies as their MPUB carried them, for an MPUB's new messages (one publish time,
        attempts 0): sent on as they are, in a Run."""
        if topic.ephemeral:
            return
        name = topic.name
        if isinstance(msgs, MessageRun) or not any(msg.deferred for msg in msgs):
            names = self._channels_at_put(topic, len(msgs))
            if sized_bodies is not None:
                if isinstance(msgs, MessageRun):
                    ids, timestamp = msgs.ids, msgs.timestamp
                else:
                    ids, timestamp = tuple(msg.id for msg in msgs), msgs[0].timestamp
                self._put_event(name, Run(name, timestamp, ids, sized_bodies, names), ids, names)
            elif isinstance(msgs, MessageRun):  # an MPUB's, never deferred
                self._put_event(name, Puts(name, framed_run(msgs)[0], names), msgs.ids, names)
            else:
                ids = tuple(msg.id for msg in msgs)
                self._put_event(name, Puts(name, framed_records(msgs), names), ids, names)
            return
        for msg in msgs:
            defer_ms = math.ceil(msg.deferred * 1000) if msg.deferred else 0
            self._emit(Put(name, msg.id, msg.timestamp, msg.attempts, msg.body, None, defer_ms))

    def _channels_at_put(self, topic: Topic, count: int) -> tuple[str, ...] | None:
        """The channels a put's event names: the topic's own, when its pump copies the put's
        messages to those next (Topic.copies_next), so the event leaves without waiting for
        the pump; else None, and the pump's fan-out names them (see fanout)."""
        named = self._named.get(topic.name)
        if not topic.copies_next(count, named.count if named is not None else 0):
            return None
        return tuple(channel.name for channel in topic.channel_list() if not channel.ephemeral)

    def _put_event(
        self,
        topic: str,
        event: Puts | Run,
        ids: tuple[bytes, ...],
        names: tuple[str, ...] | None,
    ) -> None:
        """One Puts or Run event; unless it names its channels, its messages wait to be named
        by the pump's fan-out."""
        self._emit(event)
        if names is None:
            self._unassigned.setdefault(topic, deque()).append((self.stream.last, ids))
        else:
            self._named.setdefault(topic, _NamedPuts()).add(ids, names)

    def named_waiting(self, topic: str) -> bool:
        """Whether messages put to ``topic`` with their channels named wait for its pump."""
        named = self._named.get(topic)
        return named is not None and named.count > 0

    def forget_named(self, topic: str) -> None:
        """The topic will not copy its named puts' messages as they were named (it stops, or
        is deleted): a later copy of any of them goes as a Fanout."""
        self._named.pop(topic, None)

    def fanout(
        self, topic: Topic, channels: Sequence[Channel], msgs: Sequence[Message] | MessageRun
    ) -> None:
        """The topic copied ``msgs`` to ``channels``."""
        if topic.ephemeral or not msgs:
            return
        names = tuple(channel.name for channel in channels if not channel.ephemeral)
        ids = msgs.ids if isinstance(msgs, MessageRun) else tuple(msg.id for msg in msgs)
        done = self._copied_as_named(topic.name, names, msgs, ids)
        assigned = done + self._assign_unsent(topic.name, names, ids[done:])
        if assigned < len(ids):
            self._emit(Fanout(topic.name, names, ids[assigned:]))

    def _copied_as_named(
        self,
        topic: str,
        names: tuple[str, ...],
        msgs: Sequence[Message] | MessageRun,
        ids: tuple[bytes, ...],
    ) -> int:
        """How many of ``ids`` (from the first) were put in events that named their channels.
        Those copied to other channels than named (the topic's channels changed in between
        without Topic.copy_named_puts) are put again naming these: the peers add the copies
        they lack."""
        named = self._named.get(topic)
        done = 0
        while named is not None and named.puts and done < len(ids):
            count = min(len(named.puts[0][0]), len(ids) - done)
            put_names = named.take(ids[done : done + count])
            if put_names is None:
                break
            if put_names != names:
                if isinstance(msgs, MessageRun):
                    copied = msgs.messages(done, done + count)
                else:
                    copied = list(msgs[done : done + count])
                self._emit(Puts(topic, framed_records(copied), names))
            done += count
        return done

    def _assign_unsent(self, topic: str, names: tuple[str, ...], ids: tuple[bytes, ...]) -> int:
        """How many of ``ids`` (from the first) were the messages of Puts or Run events not
        sent to any peer yet, which now name ``names`` instead of waiting for a Fanout: a
        publish to a flowing topic is one event for the peer, not two."""
        unassigned = self._unassigned.get(topic)
        stream = self.stream
        sent = max((link.sent for link in self.links), default=0)
        done = 0
        while unassigned and done < len(ids):
            seq, put_ids = unassigned[0]
            if seq <= sent or seq < stream.base or ids[done : done + len(put_ids)] != put_ids:
                break
            unassigned.popleft()
            index = seq - stream.base
            event = stream.events[index]
            if isinstance(event, Run):
                stream.events[index] = Run(topic, event.timestamp, put_ids, event.bodies, names)
            elif isinstance(event, Puts):
                stream.events[index] = Puts(topic, event.records, names)
            else:  # never: seq was a Puts or a Run of this stream
                break
            done += len(put_ids)
        return done

    def fin(self, channel: Channel, ids: Sequence[bytes]) -> None:
        """``channel`` is done with these messages (finished, dead-lettered, sampled out)."""
        if ids and not channel.ephemeral and not is_ephemeral(channel.topic.name):
            self._emit(Fin(channel.topic.name, channel.name, tuple(ids)))

    def requeued(self, channel: Channel, msg: Message, delay: float = 0.0) -> None:
        """A message back from flight (REQ, a timeout): its attempts, and a REQ's delay."""
        if channel.ephemeral or is_ephemeral(channel.topic.name):
            return
        topic = channel.topic.name
        self._emit(Attempts(topic, channel.name, msg.id, min(msg.attempts, 0xFFFF)))
        if delay > 0:
            self._emit(Defer(topic, channel.name, msg.id, math.ceil(delay * 1000)))

    def send_snapshot(self) -> int:
        """What this node owns, as PUTs into the stream (snapshot.py); how many."""
        # the snapshot has a topic's queued messages held by it: its pump's copy of them
        # goes as a Fanout
        self._named.clear()
        count = 0
        for event in live_events(self.nsqd):
            self._emit(event)
            count += 1
        return count

    def channel_op(self, topic: str, channel: str, op: str) -> None:
        if not self._applying and not is_ephemeral(topic) and not is_ephemeral(channel):
            self._emit(ChannelOp(topic, channel, op))

    def topic_op(self, topic: str, op: str) -> None:
        if op == OP_DELETE:
            self.forget_named(topic)
        if not self._applying and not is_ephemeral(topic):
            self._emit(TopicOp(topic, op))

    # ------------------------------------------------------------------ the OK rule

    def reachable_copies(self) -> int:
        """This node and its reachable peers."""
        now = self.nsqd.now()
        return 1 + sum(1 for link in self.links if link.reachable(now))

    def shortage(self) -> str | None:
        """``replicas 1 < 2`` when fewer copies than --replica-acks are reachable, else None."""
        if self.acks <= 1:
            return None
        copies = self.reachable_copies()
        return f"replicas {copies} < {self.acks}" if copies < self.acks else None

    def refuse_if_short(self, name: str) -> None:
        """Go's wording: ``E_PUB_FAILED PUB failed replicas 1 < 2`` (MPUB, DPUB alike)."""
        short = self.shortage()
        if short is not None:
            raise ProtocolError(f"E_{name}_FAILED", f"{name} failed {short}")

    def ack_after(
        self, waits: tuple[asyncio.Task[None], ...], response: bytes, name: str
    ) -> bytes | Awaitable[bytes | None]:
        """``response`` once ``waits`` are done and acks-1 peers stored what was put so far.
        Without ``waits``, a future the peers' ACK completes with the response as it
        arrives: the reply leaves in the loop turn after the ACK, not after a task's."""
        if self.acks <= 1:
            return ack_after(waits, response)
        if waits:
            return self._answer_when_acked(waits, response, name, self.stream.last)
        return self.ack_when_stored(response, name)

    def ack_when_stored(
        self, response: bytes, name: str, then: Callable[[], None] | None = None
    ) -> bytes | asyncio.Future[bytes | None]:
        """``response`` if acks-1 peers stored what was put so far, else a future the peers'
        ACK completes with it (or Go's failure for ``name``'s publish); ``then`` is called
        right after, in the ACK's own loop turn."""
        seq = self.stream.last
        if self._enough_acked(seq):
            return response
        future: asyncio.Future[bytes | None] = self.nsqd.loop.create_future()
        self._waiters.append(_Waiter(seq, future, response, name, then))
        return future

    async def _answer_when_acked(
        self, waits: tuple[asyncio.Task[None], ...], response: bytes, name: str, seq: int
    ) -> bytes:
        if waits:
            await asyncio.wait(waits)
        await self.replicated(name, seq)
        return response

    async def replicated(self, name: str, seq: int | None = None) -> None:
        """:meth:`wait_acked` (by default for all put so far), its failure in Go's wording."""
        try:
            await self.wait_acked(self.stream.last if seq is None else seq)
        except ReplicasShort as exc:
            raise ProtocolError(f"E_{name}_FAILED", f"{name} failed {exc}") from None

    async def wait_acked(self, seq: int) -> None:
        """Until acks-1 peers acknowledged ``seq``; ReplicasShort if too few stay reachable
        for --replica-timeout meanwhile."""
        if self.acks <= 1 or self._enough_acked(seq):
            return
        future: asyncio.Future[bytes | None] = self.nsqd.loop.create_future()
        self._waiters.append(_Waiter(seq, future))
        await future

    def _enough_acked(self, seq: int) -> bool:
        return sum(1 for link in self.links if link.acked >= seq) >= self.acks - 1

    def _resolve_waiters(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters[0]
            if not waiter.future.done():
                if not self._enough_acked(waiter.seq):
                    return
                waiter.future.set_result(waiter.response)
            waiters.popleft()
            if waiter.then is not None:
                waiter.then()

    def _fail_waiters(self, error: ReplicasShort) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if waiter.future.done():
                continue
            name = waiter.name
            if name is None:
                waiter.future.set_exception(error)
            else:
                failed = ProtocolError(f"E_{name}_FAILED", f"{name} failed {error}")
                waiter.future.set_exception(failed)
            if waiter.then is not None:
                waiter.then()

    # ------------------------------------------------------------------ the peers' streams

    def accept(self, transport: asyncio.Transport, rest: bytes) -> None:
        """A peer's link arrived on the client port (after the ``  R1`` magic)."""
        link = InboundLink(self, transport)
        self.inbound.add(link)
        transport.set_protocol(link)
        with contextlib.suppress(RuntimeError, AttributeError):
            transport.resume_reading()
        if rest:
            link.data_received(rest)

    def _open_store(self, owner: str, incarnation: str, offset: int, now: float) -> _Held:
        key = f"{incarnation}{SEGMENT_MARK}{offset}" if offset else incarnation
        opts = self.nsqd.options
        store = ReplicaStore(
            self.directory,
            owner,
            key,
            sync_every=opts.sync_every,
            sync_timeout=opts.sync_timeout,
            clock=self.nsqd.now,
            logger=self.nsqd.logger,
        )
        return _Held(owner, incarnation, offset, store, now)

    def hello(self, link: InboundLink, info: dict[str, Any]) -> None:
        owner, incarnation = info.get("node"), info.get("incarnation")
        if not isinstance(owner, str) or not isinstance(incarnation, str) or not incarnation:
            raise ReplicaProtocolError("HELLO without node and incarnation")
        if info.get("node_id") == self.nsqd.options.node_id:
            # message IDs are (time, --node-id, sequence): two nodes with one --node-id can
            # make the same ID, and a taken-over message may then shadow one of this node's.
            # Refused, so the group's publishes fail loudly rather than risk that.
            if owner not in self._same_node_id:
                self._same_node_id.add(owner)
                self.nsqd.logger.error(
                    f"REPLICA: peer {owner} has this node's --node-id "
                    f"{self.nsqd.options.node_id}: refused; give each node of the group its own"
                )
            link.close()
            return
        now = self.nsqd.now()
        for other in [h for h in self.held.values() if h.owner == owner]:
            if other.incarnation != incarnation:
                # the owner restarted: its old run is gone, as if silent for --replica-timeout
                # (_watch takes it over in this node's turn among the survivors)
                other.last_heard = min(other.last_heard, now - self.timeout)
                other.gone = True
        held = self.held.get((owner, incarnation))
        if held is None:
            held = self.held[(owner, incarnation)] = self._open_store(owner, incarnation, 0, now)
        if held.link is not None and held.link is not link:
            held.link.close()
        held.link = link
        held.last_heard = now
        link.held = held
        stored = held.offset + held.store.stored_seq
        held.acked = stored
        link.write(r1.welcome({"incarnation": self.incarnation, "stored": stored}))

    def events(
        self, link: InboundLink, first_seq: int, events: list[Event], encoded: memoryview | bytes
    ) -> None:
        held = link.held
        if held is None:
            raise ReplicaProtocolError("EVENTS before HELLO")
        held.last_heard = self.nsqd.now()
        local = first_seq - held.offset
        applied = held.store.applied_seq
        if local > applied + 1:  # events this node never got: hold the stream anew from here
            held = self._new_segment(held, link, first_seq)
            local, applied = 1, 0
        fresh = events[max(0, applied + 1 - local) :]
        try:
            written = partial(self._written, held)
            if local >= 1:
                held.store.apply(local, events, encoded, written, sync=False)
            else:
                held.store.apply(1, events[1 - local :], stored=written, sync=False)
        except SequenceGap as exc:
            raise ReplicaProtocolError(str(exc)) from None
        taken: dict[tuple[str, str], list[bytes]] = {}
        for event in fresh:
            if isinstance(event, (ChannelOp, TopicOp)):
                self._applying = True
                try:
                    self._apply_op(event)
                finally:
                    self._applying = False
            elif isinstance(event, Put) and event.channels:  # a takeover's, or a snapshot's
                for channel in event.channels:
                    taken.setdefault((event.topic, channel), []).append(event.msg_id)
        if taken:
            self._forget_owned_elsewhere(held, taken)

    def _forget_owned_elsewhere(
        self, owner: _Held, taken: dict[tuple[str, str], list[bytes]]
    ) -> None:
        """Copies this node holds for other owners that ``owner`` now streams as its own
        (it took them over first): they are dropped here, so this node does not take them
        over too when it judges their first owner gone. ``owner`` keeps them replicated."""
        for other in self.held.values():
            if other is owner or other.owner == owner.owner:
                continue
            for (topic, channel), ids in taken.items():
                other.store.forget_copies(topic, channel, ids)

    def _new_segment(self, held: _Held, link: InboundLink, first_seq: int) -> _Held:
        held.link = None
        if held.store.live_count() == 0:  # nothing to take over (a blank store, say)
            self.held.pop((held.owner, held.incarnation), None)
            held.store.delete()
        else:
            self.nsqd.logger.warn(
                f"REPLICA: {held.owner} resumes at {first_seq}, after "
                f"{held.offset + held.store.applied_seq}: its copies in between are taken over"
            )
            self.take_over(held, "gap")
        fresh = self._open_store(held.owner, held.incarnation, first_seq - 1, self.nsqd.now())
        fresh.link = link
        link.held = fresh
        self.held[(held.owner, held.incarnation)] = fresh
        return fresh

    def _written(self, held: _Held) -> None:
        """Events are in ``held``'s log, not yet in its index: the fsync the sync settings
        make due starts (in the sync thread, while the index takes them in and the next
        events come), and the ACK goes now, or with --sync-every=1 once that fsync is done."""
        if held.store.sync_wanted():
            self._start_sync(held)
        if not held.store.acks_after_sync:
            self._ack(held)

    def _ack(self, held: _Held) -> None:
        """ACK what the store holds under the sync settings: fsynced with --sync-every=1, else
        in the page cache with its fsync to follow them, the same promise as this node's own
        OK."""
        stored = held.offset + held.store.acknowledgeable_seq
        if stored > held.acked and held.link is not None:
            held.acked = stored
            held.link.write(r1.ack(stored))

    def _start_sync(self, held: _Held) -> None:
        """An fsync of ``held``'s store in the sync thread, unless one runs (its end starts
        the next): the events logged meanwhile go with one fsync, not one each."""
        if held.syncing:
            return
        job = held.store.begin_sync()
        if job is None:
            return
        fd, seq = job
        held.syncing = True
        future = self.nsqd.loop.run_in_executor(self._syncer, _fsync_and_close, fd)
        future.add_done_callback(partial(self._synced, held, seq))

    def _synced(self, held: _Held, seq: int, future: asyncio.Future[None]) -> None:
        held.syncing = False
        if future.cancelled():  # the node is exiting: its stores' close() syncs
            held.store.end_sync(seq, ok=False)
            return
        error = future.exception()
        held.store.end_sync(seq, ok=error is None)
        if error is not None:
            # as a failed write: the owner gets no ACK and links again (a resend follows)
            self.nsqd.logger.error(f"REPLICA: sync failed for {held.owner}: {error}")
            if held.link is not None:
                held.link.close()
            return
        self._ack(held)
        if held.store.sync_wanted():
            self._start_sync(held)

    async def _sync_stores(self) -> None:
        """Sync what --sync-timeout makes due when --sync-every has not yet."""
        interval = min(SYNC_POLL, max(self.nsqd.options.sync_timeout, 0.01))
        while True:
            await asyncio.sleep(interval)
            for held in list(self.held.values()):
                if held.store.sync_due():
                    self._start_sync(held)

    def inbound_lost(self, link: InboundLink) -> None:
        self.inbound.discard(link)
        held = link.held
        if held is not None and held.link is link:
            held.link = None

    # ------------------------------------------------------------------ group-wide state

    def _apply_op(self, event: ChannelOp | TopicOp) -> None:
        """An owner's CHANNEL or TOPIC operation, applied here when it changes something,
        and not put into this node's own stream: "only a change is sent on" would not end
        for a sequence of changes (a pause then an unpause would bounce between two nodes
        for ever, each undoing the other's last one); every node hears the owner itself."""
        nsqd = self.nsqd
        topic = nsqd.get_existing_topic(event.topic)
        if event.op == OP_CREATE or (isinstance(event, ChannelOp) and topic is None):
            if event.op in (OP_EMPTY, OP_DELETE):
                return
            if not nsqd.valid_name(event.topic):
                return
            topic = nsqd.get_topic(event.topic)
        if topic is None:
            return
        if isinstance(event, TopicOp):
            self._apply_topic_op(topic, event.op)
            return
        channel = topic.get_existing_channel(event.channel)
        if channel is None:
            if event.op in (OP_EMPTY, OP_DELETE) or not nsqd.valid_name(event.channel):
                return
            channel = topic.get_channel(event.channel)
        if event.op == OP_PAUSE and not channel.paused:
            channel.pause()
            nsqd.persistence.persist_metadata()
        elif event.op == OP_UNPAUSE and channel.paused:
            channel.unpause()
            nsqd.persistence.persist_metadata()
        elif event.op == OP_EMPTY:
            channel.empty()
        elif event.op == OP_DELETE:
            topic.delete_existing_channel(channel.name)

    def _apply_topic_op(self, topic: Topic, op: str) -> None:
        if op == OP_PAUSE and not topic.paused:
            topic.pause()
            self.nsqd.persistence.persist_metadata()
        elif op == OP_UNPAUSE and topic.paused:
            topic.unpause()
            self.nsqd.persistence.persist_metadata()
        elif op == OP_EMPTY:
            topic.empty()
        elif op == OP_DELETE:
            self.nsqd.delete_existing_topic(topic.name)

    def announce_state(self) -> None:
        """This node's topics and channels, each created and paused or unpaused, into the
        stream: a restarted peer missed the operations made while it was down once the
        stream no longer keeps them. Applied only where they change something."""
        for topic in list(self.nsqd.topics.values()):
            if topic.ephemeral:
                continue
            self._emit(TopicOp(topic.name, OP_CREATE))
            self._emit(TopicOp(topic.name, OP_PAUSE if topic.paused else OP_UNPAUSE))
            for channel in list(topic.channels.values()):
                if channel.ephemeral:
                    continue
                self._emit(ChannelOp(topic.name, channel.name, OP_CREATE))
                pause = OP_PAUSE if channel.paused else OP_UNPAUSE
                self._emit(ChannelOp(topic.name, channel.name, pause))

    # ------------------------------------------------------------------ takeover

    async def _watch(self) -> None:
        """Every --replica-timeout/4: take over what gone owners left here, and fail the
        publishes that waited --replica-timeout for too few reachable peers."""
        tick = self.nsqd.now()
        while True:
            await asyncio.sleep(self.timeout / 4)
            now, last_tick = self.nsqd.now(), tick
            tick = now
            if now - last_tick >= self.timeout / 2:
                # this node stood still (SIGSTOP, swapping, a blocked loop): the silence it
                # sees is its own, and its peers get a fresh --replica-timeout to speak
                self._forgive_silence(now)
                continue
            for held in list(self.held.values()):
                if now - held.last_heard >= self._takeover_delay(held.owner, now):
                    if held.link is not None:
                        held.link.close()
                    self.take_over(held, "restarted" if held.gone else "unreachable")
            for link in list(self.inbound):
                if now - link.last_heard >= self.timeout:
                    link.close()
            if self._reached_short(now):
                self._fail_waiters(ReplicasShort(self.shortage() or "replicas short"))
            if self.stream.size > self.max_lag:  # a peer that stopped acknowledging
                self._cut_loose_laggards()

    def _takeover_delay(self, owner: str, now: float) -> float:
        """How long ``owner`` must be silent before this node takes over its copies:
        --replica-timeout times one plus this node's rank among the nodes it can reach
        (by address). The first in that order takes over; the others see its takeover in
        its stream and forget their copies (_forget_owned_elsewhere) before their own turn,
        so a lost node's messages are delivered once, not once per survivor. A survivor
        that cannot reach the first waits less: it may duplicate, it never loses."""
        gone = _peer_key(owner)
        survivors = {_peer_key(self.address)}
        survivors.update(
            _peer_key(link.address)
            for link in self.links
            if link.reachable(now) and _peer_key(link.address) != gone
        )
        order = sorted(key for key in survivors if key is not None)
        mine = _peer_key(self.address)
        rank = order.index(mine) if mine in order else 0
        return self.timeout * (1 + rank)

    def _forgive_silence(self, now: float) -> None:
        for held in self.held.values():
            if not held.gone:
                held.last_heard = max(held.last_heard, now)
        for link in self.inbound:
            link.last_heard = max(link.last_heard, now)
        self.nsqd.logger.warn(
            "REPLICA: this node was held up for over --replica-timeout/2; its peers' "
            "silence meanwhile is not judged"
        )

    def _reached_short(self, now: float) -> bool:
        """Whether too few peers have been reachable for --replica-timeout."""
        if self.shortage() is None:
            self._short_since = None
            return False
        if self._short_since is None:
            self._short_since = now
        return now - self._short_since >= self.timeout

    def take_over(self, held: _Held, why: str) -> None:
        """The owner incarnation's unfinished copies become this node's own messages."""
        self.held.pop((held.owner, held.incarnation), None)
        if held.link is not None:
            held.link.close()
        try:
            taken = held.store.takeover()
        except ReplicaStoreError:
            return
        count = self._put_taken(taken)
        held.store.delete()
        self.taken_over[held.owner] = self.taken_over.get(held.owner, 0) + count
        self.nsqd.logger.info(
            f"REPLICA: took over {count} messages of {held.owner} ({held.incarnation}, {why})"
        )

    def _put_taken(self, taken: Takeover) -> int:
        count = 0
        nsqd = self.nsqd
        for name, topic_taken in taken.topics.items():
            if is_ephemeral(name) or not nsqd.valid_name(name):
                continue
            topic = nsqd.get_topic(name)
            if topic_taken.paused and not topic.paused:
                self._pause_as_applied(topic)
            for channel_taken in topic_taken.channels.values():
                if is_ephemeral(channel_taken.name):
                    continue
                channel = topic.get_channel(channel_taken.name)
                if channel_taken.paused and not channel.paused:
                    self._pause_as_applied(channel)
                for taken_msg in channel_taken.messages:
                    msg = Message(
                        taken_msg.msg_id, taken_msg.body, taken_msg.timestamp, taken_msg.attempts
                    )
                    defer_ms = math.ceil(taken_msg.defer * 1000)
                    self._emit(
                        Put(
                            name,
                            msg.id,
                            msg.timestamp,
                            msg.attempts,
                            msg.body,
                            (channel.name,),
                            defer_ms,
                        )
                    )
                    self._put_copy(channel, msg, taken_msg.defer)
                    count += 1
            for taken_msg in topic_taken.held:
                msg = Message(
                    taken_msg.msg_id, taken_msg.body, taken_msg.timestamp, taken_msg.attempts
                )
                msg.deferred = taken_msg.defer
                try:
                    topic.put_message(msg)  # its Put and Fanout come from the topic's hooks
                except Exception as exc:
                    nsqd.logger.error(f"REPLICA: TOPIC({name}) refused a taken message: {exc}")
                    continue
                count += 1
        nsqd.persistence.persist_metadata()
        return count

    def _pause_as_applied(self, target: Topic | Channel) -> None:
        """The owner's pause, as its store last knew it: applied like the owner's own event,
        not sent on (the owner sent it to every node; a stale one must not spread)."""
        self._applying = True
        try:
            target.pause()
        finally:
            self._applying = False

    @staticmethod
    def _put_copy(channel: Channel, msg: Message, defer: float) -> None:
        if defer > 0:
            channel.put_message_deferred(msg, defer)
            return
        try:
            channel.put_message(msg)
        except BackendWriteError:
            channel.memory_queue.append(msg)  # accepted already: kept in memory, never lost

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        now = self.nsqd.now()
        last = self.stream.last
        peers = []
        for link in self.links:
            key = (link.host, link.port)
            held = [h for h in self.held.values() if _peer_key(h.owner) == key]
            taken = sum(n for owner, n in self.taken_over.items() if _peer_key(owner) == key)
            peers.append(
                {
                    "address": link.address,
                    "state": "connected" if link.reachable(now) else "unreachable",
                    "acked_seq": link.acked,
                    "lag": max(0, last - link.acked),
                    "held_copies": sum(h.store.live_count() for h in held),
                    "taken_over": taken,
                }
            )
        return {
            "address": self.address,
            "incarnation": self.incarnation,
            "acks": self.acks,
            "last_seq": last,
            "peers": peers,
        }


def _fsync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def event_frames(first: int, events: list[Event]) -> list[bytes]:
    """EVENTS frames of ``events`` (numbered from ``first``), each up to about FRAME_BUDGET."""
    frames = []
    start, size = 0, 0
    for index, event in enumerate(events):
        size += _event_size(event)
        if size >= FRAME_BUDGET and index > start:
            frames.append(r1.events(first + start, events[start:index]))
            start, size = index, 0
    if start < len(events):
        frames.append(r1.events(first + start, events[start:]))
    return frames


class PeerLink:
    """This node's stream to one peer: dial, HELLO, resend from the peer's WELCOME, PING."""

    def __init__(self, replication: Replication, host: str, port: int) -> None:
        self.replication = replication
        self.host = host
        self.port = port
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.up = False  # welcomed
        self.sent = 0
        self.acked = 0
        self.progress_at = 0.0  # when the peer last acknowledged more, or was welcomed
        self.last_heard = 0.0
        self.down_since = replication.nsqd.now()
        self.up_since = 0.0
        self.peer_incarnation: str | None = None  # the peer's run this link last linked to
        self._parser = r1.FrameParser()
        self._writer: asyncio.Transport | None = None

    def reachable(self, now: float) -> bool:
        return self.up and now - self.last_heard < self.replication.timeout

    def counts(self, now: float) -> bool:
        """Whether the stream keeps events for this peer: up, or down for less than
        --replica-timeout (then it resends them)."""
        return self.up or now - self.down_since < self.replication.timeout

    async def run(self) -> None:
        delay = RECONNECT_MIN
        logger = self.replication.nsqd.logger
        said = ""  # a failure is logged when it differs from the last one, not every retry
        while True:
            try:
                await self._session()
            except (OSError, TimeoutError, ReplicaProtocolError, ValueError) as exc:
                failure = f"{type(exc).__name__}: {exc}"
                if failure != said or self._lasted():
                    logger.warn(f"REPLICA: link to {self.address} failed: {failure}")
                said = failure
            finally:
                if self._lasted():  # a link the peer drops at once (a full disk) backs off
                    delay = RECONNECT_MIN
                self._down()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX, self.replication.timeout / 2)

    def cut_loose(self) -> None:
        """Close the link and stop counting it (see Replication._cut_loose_laggards)."""
        self.down_since = self.replication.nsqd.now() - self.replication.timeout
        self.up = False
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _lasted(self) -> bool:
        """Whether the link is up and has been for RECONNECT_MAX."""
        return self.up and self.replication.nsqd.now() - self.up_since >= RECONNECT_MAX

    def _down(self) -> None:
        if self.up:
            self.down_since = self.replication.nsqd.now()
        self.up = False
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    async def _session(self) -> None:
        replication = self.replication
        timeout = replication.timeout
        loop = replication.nsqd.loop
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancel that
        # comes as the connect fails, and stop() would then wait for this loop forever
        async with asyncio.timeout(timeout):
            transport, protocol = await loop.create_connection(
                partial(_OutboundProtocol, self), self.host, self.port
            )
        self._writer = transport
        info = {
            "node": replication.address,
            "incarnation": replication.incarnation,
            "node_id": replication.nsqd.options.node_id,
        }
        transport.write(r1.MAGIC_R1 + r1.hello(info))
        self.last_heard = replication.nsqd.now()
        # the link's frames are handled as they arrive (_OutboundProtocol): an ACK completes
        # the publishes it covers in that loop turn. This task pings, and watches for silence.
        while not protocol.ended.done():
            await asyncio.wait((protocol.ended,), timeout=timeout / 4)
            if protocol.ended.done():
                break
            if replication.nsqd.now() - self.last_heard >= timeout:
                raise TimeoutError(f"nothing heard for {timeout:g}s")
            transport.write(r1.ping())
        if protocol.error is not None:
            raise protocol.error

    def _received(self, data: bytes) -> None:
        """Bytes from the peer: its frames handled at once. Raises what ends the link."""
        self.last_heard = self.replication.nsqd.now()
        try:
            frames = self._parser.feed(data)
        except ReplicaProtocolError as exc:
            if self.up:
                raise
            # Go nsqd, or nsqpy without --replica-peer, answers E_BAD_PROTOCOL
            hint = "E_BAD_PROTOCOL" if b"E_BAD_PROTOCOL" in data else str(exc)
            raise ReplicaProtocolError(f"not a replicating nsqd ({hint})") from None
        for frame in frames:
            self._frame(frame)

    def _closed_error(self) -> Exception:
        if self.up:
            return ConnectionResetError("closed by the peer")
        return ReplicaProtocolError("closed before WELCOME (not a replicating nsqd?)")

    def _frame(self, frame: r1.Frame) -> None:
        replication = self.replication
        if isinstance(frame, r1.Ack):
            replication.acked(self, frame.seq)
        elif isinstance(frame, r1.Ping):
            self.write(r1.pong())
        elif isinstance(frame, r1.Welcome):
            self._welcomed(frame.info)
        elif not isinstance(frame, r1.Pong):
            raise ReplicaProtocolError(f"unexpected {type(frame).__name__} on an outbound link")

    def _welcomed(self, info: dict[str, Any]) -> None:
        stored = info.get("stored")
        if not isinstance(stored, int) or stored < 0:
            raise ReplicaProtocolError("WELCOME without stored")
        incarnation = info.get("incarnation")
        replication = self.replication
        # a peer run this link has not linked to yet may have missed operations the stream
        # no longer keeps; but a node in its first --replica-timeout is itself the one
        # joining: its state may be stale, its peers announce theirs to it
        joining = replication.nsqd.now() - replication.started_at < replication.timeout
        announce = incarnation != self.peer_incarnation and (
            self.peer_incarnation is not None or not joining
        )
        self.peer_incarnation = incarnation if isinstance(incarnation, str) else None
        stream = self.replication.stream
        # resend what the peer lacks if the stream still keeps it; else (a blank disk, or it
        # fell behind) it gets a snapshot of what this node owns, then what is new
        lacks_dropped = stored < stream.base - 1
        self.sent = stream.last if lacks_dropped else stored
        self.acked = stored
        self.progress_at = replication.nsqd.now()
        self.up = True
        self.up_since = replication.nsqd.now()
        self.replication.nsqd.logger.info(
            f"REPLICA: linked to {self.address} (stored {stored}, sending from {self.sent + 1})"
        )
        if self.sent < stream.last:
            self.send_events(self.sent + 1, stream.since(self.sent + 1))
            self.sent = stream.last
        if announce or lacks_dropped:
            replication.announce_state()
            replication.nsqd.logger.info(
                f"REPLICA: topics and channels announced for {self.address} ({incarnation})"
            )
        if lacks_dropped:
            count = replication.send_snapshot()
            replication.nsqd.logger.info(
                f"REPLICA: snapshot of {count} copies for {self.address}, which lacks "
                f"{stored + 1}..{stream.base - 1}"
            )
        self.replication._resolve_waiters()

    def write(self, data: bytes) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)

    def send_events(self, first: int, events: list[Event]) -> None:
        self.write_frames(event_frames(first, events))

    def write_frames(self, frames: list[bytes]) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.writelines(frames)


class _OutboundProtocol(asyncio.Protocol):
    """The socket of a :class:`PeerLink`'s session: ``ended`` is done once it ended, and
    ``error`` says why (kept beside the future, so a session cancelled meanwhile leaves no
    exception unretrieved)."""

    def __init__(self, link: PeerLink) -> None:
        self.link = link
        self.transport: asyncio.Transport | None = None
        self.ended: asyncio.Future[None] = link.replication.nsqd.loop.create_future()
        self.error: Exception | None = None
        link._parser = r1.FrameParser()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.ended.done():
            return
        try:
            self.link._received(data)
        except (OSError, ReplicaProtocolError, ValueError) as exc:
            self._end(exc)

    def eof_received(self) -> bool | None:
        self._end(self.link._closed_error())
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc if exc is not None else self.link._closed_error())

    def _end(self, exc: Exception) -> None:
        if not self.ended.done():
            self.error = exc
            self.ended.set_result(None)
        if self.transport is not None:
            self.transport.close()


class InboundLink(asyncio.Protocol):
    """A peer's stream to this node, on a socket handed over by the client port."""

    def __init__(self, replication: Replication, transport: asyncio.Transport) -> None:
        self.replication = replication
        self.transport = transport
        self.parser = r1.FrameParser()
        self.held: _Held | None = None
        self.last_heard = replication.nsqd.now()
        self.closed = False

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        replication = self.replication
        self.last_heard = replication.nsqd.now()
        try:
            for frame in self.parser.feed(data):
                if isinstance(frame, r1.Events):
                    replication.events(self, frame.first_seq, frame.events, frame.encoded)
                elif isinstance(frame, r1.Ping):
                    self.write(r1.pong())
                    if self.held is not None:
                        self.held.last_heard = self.last_heard
                elif isinstance(frame, r1.Hello):
                    replication.hello(self, frame.info)
                elif not isinstance(frame, r1.Pong):
                    raise ReplicaProtocolError(f"unexpected {type(frame).__name__} inbound")
        except (ReplicaProtocolError, OSError, ReplicaStoreError) as exc:
            replication.nsqd.logger.error(f"REPLICA: inbound link closed: {exc}")
            self.close()

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()
        self.replication.inbound_lost(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.replication.inbound_lost(self)
