"""A topic: accepts published messages and gives every channel its own copy (nsqd/topic.go).

As in Go, a publish is acknowledged once the topic holds the message, and the topic's pump
moves messages to the channels afterwards (see "publishing" below for the exceptions).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from ..protocol.names import is_ephemeral
from ..protocol.replica import OP_PAUSE, OP_UNPAUSE
from .backend import Backend, read_messages
from .beyond.topic_held import HeldCopies
from .channel import Channel
from .guid import GUIDFactory
from .memory_queue import RUN_LIMIT, ChannelMemory, Run, RunQueue, cut
from .message import Message, MessageRun, decode_records, message_from_bytes

if TYPE_CHECKING:
    from .diskqueue.holds import Hold
    from .nsqd import NSQD

#: The most channel copies the topic's pump makes per event-loop turn (messages x channels);
#: between turns the loop reads and answers publishers, so fan-out cannot hold their OKs back.
PUMP_BUDGET = 10000
#: ... but at least this many messages per turn, however many channels.
PUMP_MIN_BATCH = 50
#: Once a message's copies cost more than this (seconds, all its channels together: many
#: channels whose memory is full, so every copy is a disk write), the pump works in slices
#: of PUMP_SLICE per turn instead, at least PUMP_MIN_SLICED messages: publishers are answered
#: between slices and the topic's backlog grows, as Go's pump (one goroutine, a write round
#: trip per channel's disk queue) lags its publishers. Below it the pump keeps up while the
#: topic's memory queue is full: a backlog overflows to the topic's own disk queue, and
#: writing and reading that back costs more than the copies it postpones.
PUMP_DEFER_COST = 4e-6
#: ... but while that memory queue has room, the pump slices above this lower cost already:
#: the backlog waits in memory, at no disk write, while publishers go first. Go's pump falls
#: behind the same way once the channels' memory is full: with bench_writer on 10 channels
#: and --mem-queue-size=1000000 it had copied under half of what was published when the
#: writer stopped.
PUMP_DEFER_COST_WITH_ROOM = 1e-6
PUMP_SLICE = 0.0002
PUMP_MIN_SLICED = 10
#: ... and at least one message per PUMP_WRITES_PER_MESSAGE channels: each channel whose memory
#: is full writes a turn's messages to its disk queue in one write(2), so a slice costs at most
#: this many writes per message, whatever the channel count. With fewer messages a slice, the
#: write calls would take most of the pump's share of the loop, and readers who emptied their
#: channels would wait on a pump that moves little.
PUMP_WRITES_PER_MESSAGE = 2
#: ... and while publishers keep coming, a slice is followed by a pause of PUMP_YIELD times its
#: own length, so publishes get at least three quarters of the loop: the smallest slice at 100
#: channels is 100 write(2) calls, and without the pause the pump took two thirds of the loop
#: (Go's publishers outrun its pump further: at 100 channels it had copied 14% when
#: bench_writer stopped). Once publishers pause, the pump runs every turn.
PUMP_YIELD = 3.0
#: A slice spreads each full channel's write(2) over few messages, so a sliced pump measures
#: its copies dearer than a full turn's and stays sliced. Once no publish has come for
#: PUMP_QUIET seconds, it moves full turns again whatever it measured: the backlog left by a
#: burst is copied at a full turn's cost, not a slice's. (Longer than the pauses within a
#: steady stream of publishes, which would otherwise turn it to full turns at every pause.)
PUMP_QUIET = 0.25
#: A turn longer than this (seconds) once publishers have gone quiet (PUMP_QUIET) and while
#: every channel's memory is full -- each channel's disk write then makes the turn's cost,
#: and each consumer has --mem-queue-size messages in memory to read meanwhile -- is followed
#: by a pause as long as itself: the pump takes at most half the loop, and the other clients
#: are served between its turns instead of after each (Go's pump is one goroutine among the
#: connections'). Otherwise turns follow each other at once.
PUMP_LONG_TURN = 0.002
#: With --mem-queue-size=0, a publish to a topic with up to this many channels writes their
#: queues before its OK (as many writes and fsyncs to wait for as channels); with more, the
#: topic's held queue takes it (one write) and the pump copies later (beyond/topic_held.py). The
#: crossover, measured with bench_writer: PUB to 1-3 channels is faster direct, to 5 about
#: even, to 7 and more faster through the topic.
DIRECT_CHANNELS = 4
#: Seconds of a sliced publish's work (:meth:`Topic.put_sliced`) per event-loop turn before
#: the other clients are served.
SLICED_PUT_TURN = 0.002
#: The share of a sliced publish's first turn given to its puts, before it is measured: the
#: turn's disk writes come after its puts, and writing a message to a disk queue costs about
#: three times its put.
FIRST_PUT_SHARE = 0.25


class TopicError(Exception):
    pass


class Topic:
    __slots__ = (
        "_channel_list",
        "_copy_cost",
        "_deferred_waiting",
        "_publish_seen_at",
        "_published",
        "_pump_handle",
        "backend",
        "channels",
        "ephemeral",
        "exiting",
        "guid",
        "held_copies",
        "mem_capacity",
        "memory_queue",
        "message_bytes",
        "message_count",
        "name",
        "nsqd",
        "paused",
        "skip_ids",
        "started",
        "writes",
    )

    def __init__(self, name: str, nsqd: NSQD, backend: Backend) -> None:
        self.name = name
        self.nsqd = nsqd
        self.writes = nsqd.writes  # the disk-write side (backend_writes.py)
        self.ephemeral = is_ephemeral(name)
        self.mem_capacity = nsqd.options.mem_queue_size
        self.memory_queue: ChannelMemory = RunQueue()
        self.backend = backend
        self.channels: dict[str, Channel] = {}
        self._channel_list: list[Channel] = []
        self.guid = GUIDFactory(nsqd.options.node_id)
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        #: the pump's next turn, when one is scheduled
        self._pump_handle: asyncio.Handle | None = None
        self._published = False  # a publish since the pump's last sliced turn
        self._publish_seen_at = 0.0  # when the pump last found _published set (nsqd.now())
        self._copy_cost = 0.0  # seconds per channel copy, measured by the pump
        self._deferred_waiting = 0  # DPUB messages in the topic's queue (paused, no channels)
        self.skip_ids: set[bytes] = set()
        # --mem-queue-size=0 with --sync-every above 1: Go's route (beyond/topic_held.py)
        self.held_copies: HeldCopies | None = None
        held = self.mem_capacity <= 0 and nsqd.options.sync_every > 1
        disk_queue = backend.disk_queue()
        if held and disk_queue is not None:
            self.held_copies = HeldCopies(disk_queue)
        # Go's Topic.Start(): until then messages wait in the topic even if channels exist,
        # so channels pre-created from nsqlookupd get the first messages too.
        self.started = True

    # ------------------------------------------------------------------ channels

    def get_channel(self, name: str) -> Channel:
        channel = self.channels.get(name)
        if channel is None:
            self.copy_named_puts()
            channel = self.nsqd.new_channel(self, name)
            self.channels[name] = channel
            self._channel_list = list(self.channels.values())
            self.nsqd.channel_created(self, channel)
            self._schedule_pump()
        return channel

    def get_existing_channel(self, name: str) -> Channel | None:
        return self.channels.get(name)

    def channel_list(self) -> list[Channel]:
        """The channels, as the pump copies to them."""
        return self._channel_list

    def delete_existing_channel(self, name: str) -> None:
        if name in self.channels:
            self.copy_named_puts()
        channel = self.channels.pop(name, None)
        if channel is None:
            raise TopicError("channel does not exist")
        self._channel_list = list(self.channels.values())
        self.nsqd.channel_deleted(self, channel)
        channel.delete()
        if not self.channels and self.ephemeral:
            self.nsqd.loop.call_soon(self.nsqd.delete_ephemeral_topic, self)

    def delete_channel_if_unused(self, channel: Channel) -> None:
        """Ephemeral channels go when their last consumer does."""
        if self.channels.get(channel.name) is channel and not channel.clients:
            self.delete_existing_channel(channel.name)

    # ------------------------------------------------------------------ publishing
    #
    # As Go's topic: a publish is acknowledged once the message is in the topic (its memory
    # queue, or its disk queue when that is full or --mem-queue-size=0 asks for disk), and
    # the topic's pump copies it to the channels on a later turn of the event loop, a bounded
    # batch per turn, so publishers and fan-out share the loop as Go's goroutines share CPUs.
    # Two publishes skip the topic queue when nothing waits in it: a DPUB goes straight to the
    # channels' deferred queues (keeping its deferral, which a disk queue cannot hold), and
    # with --mem-queue-size=0 a message goes straight to the channels' disk queues, so the
    # publish is acknowledged after the very writes (and syncs) that deliver it: always with
    # --sync-every=1 or on an ephemeral topic, otherwise up to DIRECT_CHANNELS channels. With
    # more channels (and --sync-every above 1) the publish is acknowledged in the topic's disk
    # queue, as in Go, and its records are held until every channel has settled its copy
    # (beyond/topic_held.py).

    def new_message(self, body: bytes) -> Message:
        return Message(self.guid.new_id(), body, self.nsqd.wall_ns())

    def new_messages(self, bodies: list[bytes], timestamp: int | None = None) -> list[Message]:
        """An MPUB's messages: consecutive IDs and one publish timestamp."""
        if timestamp is None:
            timestamp = self.nsqd.wall_ns()
        ids = self.guid.new_ids(len(bodies))
        return [Message(msg_id, body, timestamp) for msg_id, body in zip(ids, bodies, strict=True)]

    def new_run(self, bodies: list[bytes], timestamp: int | None = None) -> MessageRun:
        """An MPUB's messages as one run, not yet built (see :meth:`put_run`)."""
        if timestamp is None:
            timestamp = self.nsqd.wall_ns()
        return MessageRun(self.guid.new_ids(len(bodies)), bodies, timestamp)

    def put_message(self, msg: Message) -> None:
        if self.exiting:
            raise TopicError("exiting")
        if self.nsqd.queue_limits.active:  # nsqpy --max-queue-bytes (beyond/queue_limits.py)
            self.nsqd.queue_limits.admit(self, (msg,))
        if self.nsqd.replication is not None:  # docs/replication.md: before any copy is made
            self.nsqd.replication.put(self, (msg,))
        self._put(msg)
        self._published = True
        self.message_count += 1
        self.message_bytes += len(msg.body)

    def put_messages(
        self, msgs: list[Message], sized_bodies: bytes | memoryview | None = None
    ) -> None:
        """An MPUB's messages (never deferred). Callers hold ``nsqd.writes.batched_writes()``, so a
        refused disk write surfaces after this returns. ``sized_bodies`` as for
        :meth:`put_batch`."""
        if self.exiting:
            raise TopicError("exiting")
        if not msgs:
            return
        if self.nsqd.queue_limits.active:  # nsqpy --max-queue-bytes (beyond/queue_limits.py)
            self.nsqd.queue_limits.admit(self, msgs)
        if self.nsqd.replication is not None:  # docs/replication.md: before any copy is made
            self.nsqd.replication.put(self, msgs, sized_bodies)
        if self._direct_to_channels():
            self._fan_out(msgs)
        else:
            self._enqueue(msgs)
        self._published = True
        self.message_count += len(msgs)
        self.message_bytes += sum([len(msg.body) for msg in msgs])

    def put_batch(
        self,
        bodies: list[bytes],
        timestamp: int | None = None,
        sized_bodies: bytes | memoryview | None = None,
    ) -> tuple[asyncio.Task[None], ...]:
        """One MPUB's messages put with one batch of disk writes; the fsyncs its OK waits
        for (those under way before it, as for a single put). Raises as :meth:`put_messages`
        and ``batched_writes()`` do. ``sized_bodies``: the bodies as the MPUB carried them
        (each ``BE32 size`` then the body), if the caller has them, for replication to send on
        as they are."""
        syncs = self.writes.running_syncs(self)
        with self.writes.batched_writes():
            if self._queues_runs():
                self.put_run(self.new_run(bodies, timestamp), sized_bodies)
            else:
                self.put_messages(self.new_messages(bodies, timestamp), sized_bodies)
        return syncs

    def _queues_runs(self) -> bool:
        """Whether an MPUB's messages may wait unbuilt (:meth:`put_run`): in a memory
        queue, with no queue cap that needs them as messages on the way."""
        return self.mem_capacity > 0 and not self.nsqd.queue_limits.active

    def put_run(self, run: MessageRun, sized_bodies: bytes | memoryview | None = None) -> None:
        """:meth:`put_messages` for a run: the topic queues it, and the pump hands the same
        run to every channel, which builds its own messages as it takes them. Callers hold
        ``nsqd.writes.batched_writes()``, as for :meth:`put_messages`. ``sized_bodies`` as
        for :meth:`put_batch`."""
        if self.exiting:
            raise TopicError("exiting")
        if not run:
            return
        if self.nsqd.replication is not None:  # docs/replication.md: before any copy is made
            self.nsqd.replication.put(self, run, sized_bodies)
        self._enqueue(run)
        self._published = True
        self.message_count += len(run)
        self.message_bytes += run.body_bytes()

    async def put_sliced(
        self,
        slices: Iterator[list[bytes]],
        before_put: Callable[[], None] | None = None,
        after_puts: Callable[[int], None] | None = None,
    ) -> tuple[asyncio.Task[None], ...]:
        """A huge MPUB put a slice of bodies at a time, about SLICED_PUT_TURN of work per
        loop turn, so one publisher cannot stall the other clients; the fsyncs its OK waits
        for (those under way before each turn, which include any a previous turn's writes
        started). All messages get one publish time, as one put gives them.

        ``before_put()`` runs before each slice is put and may raise to stop the publish;
        ``after_puts(count)`` is told the messages of each turn once they are written. The
        first failure (``before_put``, :meth:`put_messages`, a refused write) ends it and is
        raised: the slices put before it stay published, as Go's ``Topic.PutMessages`` keeps
        the messages before the one that failed. Other publishers' messages may land between
        turns, as between Go's concurrent puts."""
        writes = self.writes
        timestamp = self.nsqd.wall_ns()
        syncs: dict[asyncio.Task[None], None] = {}
        put_share = FIRST_PUT_SHARE
        bodies = next(slices, None)
        while bodies is not None:
            syncs.update(dict.fromkeys(writes.running_syncs(self)))
            started = time.perf_counter()
            budget = SLICED_PUT_TURN * put_share
            failure: Exception | None = None
            count = 0
            # A turn's disk writes happen when batched_writes() ends, after its puts: the puts
            # get the share of the turn they took in the previous one.
            with writes.batched_writes():
                try:
                    while bodies is not None:
                        if before_put is not None:
                            before_put()
                        self.put_messages(self.new_messages(bodies, timestamp))
                        count += len(bodies)
                        bodies = next(slices, None)
                        if time.perf_counter() - started >= budget:
                            break
                except Exception as exc:  # raised once the slices put before it are written
                    failure = exc
                puts = time.perf_counter() - started
            if count and after_puts is not None:
                after_puts(count)
            if failure is not None:
                raise failure
            put_share = puts / max(time.perf_counter() - started, 1e-9)
            if bodies is not None:
                await asyncio.sleep(0)
        return tuple(syncs)

    def start(self) -> None:
        self.started = True
        self._schedule_pump()

    def flowing(self) -> bool:
        """True while the pump may move messages to the channels."""
        return bool(self._channel_list) and self.started and not self.paused and not self.exiting

    def _direct_to_channels(self) -> bool:
        """Nothing waits in the topic and a publish must reach the channels before its OK:
        see :meth:`publish_writes_channels`."""
        return (
            self.publish_writes_channels()
            and self.flowing()
            and not self.memory_queue
            and self.backend.depth() == 0
        )

    def publish_writes_channels(self) -> bool:
        """Whether a publish now may write the channels' queues before its OK (so its OK
        waits for their running fsyncs too, ``BackendWrites.running_syncs``): while
        --max-queue-bytes caps are set (a publish is admitted against the channels' bytes, so
        it must reach them at once), and with --mem-queue-size=0 unless the topic's queue is
        held (see "publishing" above) and has more than DIRECT_CHANNELS to copy to."""
        if self.nsqd.queue_limits.active:
            return True
        if self.mem_capacity > 0:
            return False
        return self.held_copies is None or len(self._channel_list) <= DIRECT_CHANNELS

    def _put(self, msg: Message) -> None:
        if msg.deferred and self.flowing():
            self._fan_out_deferred([msg])
        elif self._direct_to_channels():
            with self.writes.batched_writes():  # each channel's write of one shared encoding
                self._fan_out([msg])
        else:
            self._enqueue([msg])

    def _enqueue(self, msgs: list[Message] | MessageRun) -> None:
        """Into the topic's memory queue while it has room and nothing waits on disk (so the
        pump, reading memory first, keeps publish order), else its disk queue; then wake the
        pump. An ephemeral topic has no disk: its overflow is dropped, as Go's."""
        memory_queue = self.memory_queue
        room = self.mem_capacity - len(memory_queue)
        # only a DPUB (one message) waits in the topic deferred
        deferred = type(msgs) is list and msgs[0].deferred > 0
        if room > 0 and not deferred and not self.ephemeral and self.backend.depth() > 0:
            room = 0  # (a deferred message has no place in the order: memory keeps its delay)
        if room >= len(msgs):
            memory_queue.extend(msgs)
            if deferred:
                self._deferred_waiting += 1
        else:
            room = max(room, 0)
            if room > 0:
                memory_queue.extend(cut(msgs, 0, room))
            if not self.ephemeral:
                rest = cut(msgs, room, None)
                self.writes.write_many_to_backend(
                    self.backend, rest, f"TOPIC({self.name})", memory_queue
                )
        # (a publish's disk writes may still be pending in nsqd.writes.batched_writes(), so
        # the topic can look empty now: the pump runs anyway and finds them)
        self._schedule_pump(pending_writes=True)

    def _fan_out_runs(self, runs: list[Run]) -> None:
        """:meth:`_fan_out` for runs of the topic's queue, in order: a MessageRun goes to
        every channel as it is (each builds its own messages from it), and the messages
        between them go as one batch."""
        msgs: list[Message] = []
        for run in runs:
            if not isinstance(run, MessageRun):
                msgs += run
                continue
            if msgs:
                self._fan_out(msgs)
                msgs = []
            channels = self._channel_list
            if self.nsqd.replication is not None:
                self.nsqd.replication.fanout(self, channels, run)
            for channel in channels:
                channel.put_messages(run)
        if msgs:
            self._fan_out(msgs)

    def _fan_out(self, msgs: list[Message]) -> None:
        """Every channel gets the batch: one channel the messages themselves, several the
        same objects marked shared (each copies a message only when it delivers it)."""
        channels = self._channel_list
        if self._deferred_waiting:
            deferred = [msg for msg in msgs if msg.deferred]
            self._deferred_waiting = max(0, self._deferred_waiting - len(deferred))
            if deferred:
                self._fan_out_deferred(deferred)
                msgs = [msg for msg in msgs if not msg.deferred]
        if not msgs:
            return
        if self.nsqd.replication is not None:
            self.nsqd.replication.fanout(self, channels, msgs)
        if len(channels) > 1:
            for msg in msgs:
                msg.shared = True
        for start in range(0, len(msgs), RUN_LIMIT):
            run = tuple(msgs[start : start + RUN_LIMIT])  # kept as it is by every channel
            for channel in channels:
                channel.put_messages(run)

    def _fan_out_deferred(self, msgs: list[Message]) -> None:
        if self.nsqd.replication is not None:
            self.nsqd.replication.fanout(self, self._channel_list, msgs)
        first = True
        for channel in self._channel_list:
            for msg in msgs:
                copy = msg if first else msg.copy()
                channel.put_message_deferred(copy, copy.deferred)
            first = False

    # ------------------------------------------------------------------ the pump

    def _schedule_pump(self, pending_writes: bool = False) -> None:
        if self._pump_handle is not None or not self.flowing():
            return
        if not pending_writes and not self.memory_queue and self.backend.depth() == 0:
            return
        self._pump_handle = self.nsqd.loop.call_soon(self._pump)

    def copies_next(self, count: int, named: int) -> bool:
        """Whether ``count`` messages put now wait in memory behind only the ``named`` ones
        (whose replication events named the channels, Replication.put) and the pump copies
        them all to the channels it has now, unless :meth:`copy_named_puts` runs first: so
        their events may name those channels before the pump has run."""
        return (
            self.flowing()
            and self.held_copies is None
            and not self.publish_writes_channels()
            and len(self.memory_queue) == named
            and named + count <= self.mem_capacity
            and self.backend.depth() == 0
            and not isinstance(self._pump_handle, asyncio.TimerHandle)
        )

    def copy_named_puts(self) -> None:
        """Copy now to the channels the messages whose replication events named them at
        put time (see :meth:`copies_next`), before the channels change, the topic pauses or
        a queue is emptied: here as in the peers' copies, those messages came before it."""
        replication = self.nsqd.replication
        if replication is None or not replication.named_waiting(self.name):
            return
        while replication.named_waiting(self.name) and self.memory_queue and self.flowing():
            if self._pump_handle is not None:
                self._pump_handle.cancel()
                self._pump_handle = None
            self._pump()
        replication.forget_named(self.name)
        self._schedule_pump()

    def pump_now(self) -> bool:
        """Run now the pump scheduled for the next loop turn; whether it ran (a pump put
        off to let publishers go first keeps its time). The replication flush calls it, so
        a publish's events leave naming the channels its messages were copied to."""
        handle = self._pump_handle
        if handle is None or isinstance(handle, asyncio.TimerHandle):
            return False
        handle.cancel()
        self._pump()
        return True

    def _pump(self) -> None:
        """Move one batch from the topic to its channels; again next turn if more wait. The
        batch is PUMP_BUDGET channel copies, or a PUMP_SLICE's worth when copies are dear
        (PUMP_DEFER_COST): fewer messages per turn the more channels."""
        self._pump_handle = None
        if not self.flowing():
            return
        channels = len(self._channel_list)
        if self._published:
            self._publish_seen_at = self.nsqd.now()
        limit = self._pump_batch(channels)
        started = time.perf_counter()
        held = self.held_copies
        refused: list[tuple[Backend, list[Message]]] | None = [] if held is not None else None
        # lenient: messages a full disk refuses stay in the channel's memory, never lost (and
        # a held topic keeps their records until the channels have settled them)
        with self.writes.batched_writes(lenient=True, refused=refused):
            runs = self._take(limit)
            self._fan_out_runs(runs)
        if held is not None:
            held.settle(refused or [], self._channel_list)
        elapsed = time.perf_counter() - started
        taken = sum([len(run) for run in runs])
        if taken:
            self._copy_cost = (self._copy_cost + elapsed / (taken * channels)) / 2
        if taken >= limit or self.memory_queue:
            if self._published and self._sliced(channels):
                self._published = False
                self._pump_handle = self.nsqd.loop.call_later(elapsed * PUMP_YIELD, self._pump)
            elif elapsed > PUMP_LONG_TURN and self._quiet() and self._channels_stocked():
                self._pump_handle = self.nsqd.loop.call_later(elapsed, self._pump)
            else:
                self._schedule_pump()

    def _pump_batch(self, channels: int) -> int:
        """Messages for the next pump turn (see PUMP_DEFER_COST). A held topic always slices:
        its backlog is on disk already, where the publish put it, so keeping up would save
        nothing, and publishers go first, as in Go."""
        by_budget = max(PUMP_MIN_BATCH, PUMP_BUDGET // channels)
        per_message = self._copy_cost * channels
        if not self._sliced(channels) or self._quiet():
            return by_budget
        least = max(PUMP_MIN_SLICED, channels // PUMP_WRITES_PER_MESSAGE)
        if per_message <= 0:
            return least  # (not measured yet)
        return max(least, min(by_budget, int(PUMP_SLICE / per_message)))

    def _channels_stocked(self) -> bool:
        """Whether every channel's memory queue is full (see PUMP_LONG_TURN)."""
        return all(
            0 < channel.mem_capacity <= len(channel.memory_queue) for channel in self._channel_list
        )

    def _quiet(self) -> bool:
        """Whether no publish has come for PUMP_QUIET seconds (a held topic never is: its
        pump always slices, see :meth:`_pump_batch`)."""
        return (
            self.held_copies is None
            and not self._published
            and self.nsqd.now() - self._publish_seen_at >= PUMP_QUIET
        )

    def _sliced(self, channels: int) -> bool:
        """Whether the pump works in slices (see PUMP_DEFER_COST and :meth:`_pump_batch`)."""
        per_message = self._copy_cost * channels
        if per_message > PUMP_DEFER_COST or self.held_copies is not None:
            return True
        return (
            per_message > PUMP_DEFER_COST_WITH_ROOM and len(self.memory_queue) < self.mem_capacity
        )

    def _take(self, limit: int) -> list[Run]:
        """Up to ``limit`` messages, in the runs they are kept in: the memory queue first,
        then the disk queue."""
        memory_queue = self.memory_queue
        if len(memory_queue) >= limit:
            return memory_queue.take_runs(limit)
        limit -= len(memory_queue)
        runs = memory_queue.take_runs(len(memory_queue))
        msgs: list[Message] = []
        if self.held_copies is not None:
            self._take_held(self.held_copies, msgs, limit)
        else:
            read_messages(self.backend, msgs, limit, self.skip_ids, self.nsqd.logger.error)
        if msgs:
            runs.append(msgs)
        return runs

    def _take_held(self, held: HeldCopies, msgs: list[Message], limit: int) -> None:
        """:meth:`_take` from a held queue, a read buffer's records at a time: each record's
        hold goes to ``held``, with its message, or as skipped (a bad record, or the disk
        copy of a restored deferred message)."""
        while len(msgs) < limit:
            records, holds = held.read_many(limit - len(msgs))
            if not records:
                return
            had = len(msgs)
            if self.skip_ids or decode_records(records, msgs):
                del msgs[had:]  # record by record: which record made which message
                self._take_each(held, records, holds, msgs)
                continue
            for msg, hold in zip(msgs[had:], holds, strict=True):
                held.taken(msg.id, hold)

    def _take_each(
        self, held: HeldCopies, records: list[bytes], holds: list[Hold], msgs: list[Message]
    ) -> None:
        for data, hold in zip(records, holds, strict=True):
            msg = self._decoded(data)
            if msg is None:
                held.skipped(hold)
                continue
            held.taken(msg.id, hold)
            msgs.append(msg)

    def _decoded(self, data: bytes) -> Message | None:
        """The message of a disk record; None for a bad record or one to skip."""
        try:
            msg = message_from_bytes(data)
        except ValueError as exc:
            self.nsqd.logger.error(f"failed to decode message - {exc}")
            return None
        if self.skip_ids and msg.id in self.skip_ids:
            self.skip_ids.discard(msg.id)
            return None
        return msg

    # ------------------------------------------------------------------ state

    def restore_deferred(self, msg: Message, remaining: float) -> None:
        """A DPUB message that waited in the topic at shutdown (its deferral not yet begun)."""
        msg.deferred = remaining
        self._put(msg)

    @staticmethod
    def uncapped_memory_queue(msgs: Iterable[Message]) -> ChannelMemory:
        """The memory queue of a topic with no ``--max-queue-bytes`` cap."""
        return RunQueue(msgs)

    def depth(self) -> int:
        # restored deferred messages still have a disk copy that will be skipped
        return len(self.memory_queue) + self.backend.depth() - len(self.skip_ids)

    def pause(self) -> None:
        if self.nsqd.replication is not None and not self.paused:  # group-wide, on a change
            self.copy_named_puts()
            self.nsqd.replication.topic_op(self.name, OP_PAUSE)
        self.paused = True

    def unpause(self) -> None:
        if self.nsqd.replication is not None and self.paused:
            self.nsqd.replication.topic_op(self.name, OP_UNPAUSE)
        self.paused = False
        self._schedule_pump()

    def empty(self) -> None:
        self.copy_named_puts()
        if self.held_copies is not None:
            self.held_copies.clear()
        self.memory_queue.clear()
        self.backend.empty()

    def delete(self) -> None:
        self.exiting = True
        for name in list(self.channels):
            channel = self.channels.pop(name)
            self.nsqd.channel_deleted(self, channel)
            channel.delete()
        self._channel_list = []
        self.empty()
        self.backend.delete()

    def close(self) -> None:
        """Clean shutdown: channels persist their messages, then the topic persists its own."""
        self.exiting = True
        for channel in self._channel_list:
            channel.close()
        self.flush()
        self.writes.close_backend(self.backend, f"TOPIC({self.name})")

    def flush(self) -> None:
        """Shutdown: the memory queue to disk; deferred messages are remembered."""
        msgs = list(self.memory_queue)
        self.memory_queue.clear()
        if msgs and not self.ephemeral:
            context = f"TOPIC({self.name})"
            self.nsqd.logger.info(f"{context}: flushing {len(msgs)} memory messages to backend")
            self.writes.put_many_logged(self.backend, msgs, context)
        deferred = [(m, m.deferred) for m in msgs if m.deferred]
        self.nsqd.persistence.remember_deferred(self.backend, deferred)
