"""The peer's store of one owner incarnation (nsqpy.nsqd.replica.store), in process: what each
event does to the unfinished copies, sequence numbers, the sync settings, replay after a close,
a drop and a SIGKILL, a torn last record, and compaction keeping the log bounded."""

from __future__ import annotations

import math
import os
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nsqpy.internal.lg import Logger
from nsqpy.nsqd.replica import store as store_module
from nsqpy.nsqd.replica.store import (
    DEFAULT_COMPACT_FLOOR,
    ReplicaStore,
    SequenceGap,
    TakenMessage,
    Takeover,
    list_stores,
)
from nsqpy.protocol.replica import (
    OP_CREATE,
    OP_DELETE,
    OP_EMPTY,
    RECORD_FIXED,
    RECORD_HEAD,
    Attempts,
    ChannelOp,
    Defer,
    Event,
    Fanout,
    Fin,
    Put,
    Puts,
    Run,
    TopicOp,
)

OWNER = "127.0.0.1:4150"
INCARNATION = "a1b2c3"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def mid(n: int) -> bytes:
    return b"%016x" % n


def put(n: int, channels: tuple[str, ...] | None = ("a",), topic: str = "t", **kw: int) -> Put:
    return Put(topic, mid(n), 1_700_000_000_000_000_000 + n, kw.get("attempts", 1),
               b"body-%d" % n, channels, kw.get("defer_ms", 0))  # fmt: skip


class Feeder:
    """A store and the next sequence number, so tests read as the events they send."""

    def __init__(self, store: ReplicaStore) -> None:
        self.store = store
        self.seq = store.applied_seq + 1

    def send(self, *events: Event) -> None:
        self.store.apply(self.seq, events)
        self.seq += len(events)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def quiet() -> Iterator[Logger]:
    with open(os.devnull, "w") as devnull:
        yield Logger("[test] ", stream=devnull)


def open_store(
    directory: Path,
    clock: FakeClock,
    sync_every: int = 1,
    logger: Logger | None = None,
    compact_floor: int = DEFAULT_COMPACT_FLOOR,
) -> ReplicaStore:
    return ReplicaStore(
        directory,
        OWNER,
        INCARNATION,
        sync_every=sync_every,
        sync_timeout=2.0,
        clock=clock,
        logger=logger,
        compact_floor=compact_floor,
    )


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[ReplicaStore]:
    opened = open_store(tmp_path, clock)
    yield opened
    opened.close()


def ids_on(takeover: Takeover, channel: str, topic: str = "t") -> list[bytes]:
    return [m.msg_id for m in takeover.topics[topic].channels[channel].messages]


def held_ids(takeover: Takeover, topic: str = "t") -> list[bytes]:
    return [m.msg_id for m in takeover.topics[topic].held]


def copy_on(takeover: Takeover, channel: str, n: int, topic: str = "t") -> TakenMessage:
    (found,) = [m for m in takeover.topics[topic].channels[channel].messages if m.msg_id == mid(n)]
    return found


# -- what each event does ------------------------------------------------------------------


def test_put_with_channels_makes_a_copy_per_named_channel(store: ReplicaStore) -> None:
    Feeder(store).send(put(1, ("a", "b")), put(2, ("b",)))
    taken = store.takeover()
    assert ids_on(taken, "a") == [mid(1)]
    assert ids_on(taken, "b") == [mid(1), mid(2)]
    assert held_ids(taken) == []
    assert store.live_count() == 3
    copy = copy_on(taken, "a", 1)
    assert (copy.body, copy.timestamp, copy.attempts, copy.defer) == (
        b"body-1",
        1_700_000_000_000_000_001,
        1,
        0.0,
    )


def test_topic_held_put_waits_for_a_fanout(store: ReplicaStore) -> None:
    feed = Feeder(store)
    feed.send(put(1, None), put(2, None))
    taken = store.takeover()
    assert held_ids(taken) == [mid(1), mid(2)]
    assert taken.topics["t"].channels == {}
    assert store.live_count() == 2

    feed.send(Fanout("t", ("a", "b"), (mid(1),)))
    taken = store.takeover()
    assert held_ids(taken) == [mid(2)]
    assert ids_on(taken, "a") == ids_on(taken, "b") == [mid(1)]
    assert store.live_count() == 3


def test_fanout_of_an_unknown_finished_or_assigned_id_is_ignored(store: ReplicaStore) -> None:
    feed = Feeder(store)
    feed.send(put(1, None), Fanout("t", ("a",), (mid(1),)), Fin("t", "a", (mid(1),)))
    assert store.live_count() == 0
    feed.send(
        Fanout("t", ("a",), (mid(1),)),  # finished
        Fanout("t", ("a",), (mid(9),)),  # never put
        Fanout("nope", ("a",), (mid(1),)),  # no such topic
        put(2, ("a",)),
        Fanout("t", ("b",), (mid(2),)),  # on a channel already, not held by the topic
    )
    taken = store.takeover()
    assert ids_on(taken, "a") == [mid(2)]
    assert "b" not in taken.topics["t"].channels
    assert "nope" not in taken.topics
    assert store.live_count() == 1


def test_fin_drops_the_copy_on_that_channel_and_the_message_with_its_last(
    store: ReplicaStore,
) -> None:
    feed = Feeder(store)
    feed.send(put(1, ("a", "b")), put(2, None))
    feed.send(Fin("t", "a", (mid(1),)), Fin("t", "a", (mid(2),)))  # mid(2) is not on "a"
    taken = store.takeover()
    assert ids_on(taken, "a") == []
    assert ids_on(taken, "b") == [mid(1)]
    assert held_ids(taken) == [mid(2)]  # a FIN on a channel leaves the topic's hold alone
    feed.send(Fin("t", "b", (mid(1),)), Fin("t", "b", (mid(1),)), Fin("x", "b", (mid(1),)))
    taken = store.takeover()
    assert ids_on(taken, "b") == []
    assert store.live_count() == 1
    # the message is gone, not only its copies: a later Fanout cannot bring it back
    feed.send(Fanout("t", ("a",), (mid(1),)))
    assert ids_on(store.takeover(), "a") == []


def test_attempts_raises_and_never_lowers(store: ReplicaStore) -> None:
    feed = Feeder(store)
    feed.send(put(1, ("a", "b"), attempts=2))
    feed.send(Attempts("t", "a", mid(1), 5), Attempts("t", "a", mid(1), 3))
    feed.send(Attempts("t", "b", mid(1), 1))  # below the put's own count
    feed.send(Attempts("t", "c", mid(1), 9), Attempts("t", "a", mid(7), 9))  # no such copy
    taken = store.takeover()
    assert copy_on(taken, "a", 1).attempts == 5
    assert copy_on(taken, "b", 1).attempts == 2
    assert "c" not in taken.topics["t"].channels


def test_defer_sets_the_due_time_and_the_takeover_gives_what_remains(
    store: ReplicaStore, clock: FakeClock
) -> None:
    feed = Feeder(store)
    feed.send(put(1, ("a", "b")), put(2, ("a",), defer_ms=4000), put(3, None, defer_ms=6000))
    feed.send(Defer("t", "a", mid(1), 10_000))
    clock.now += 3.0
    taken = store.takeover()
    assert copy_on(taken, "a", 1).defer == pytest.approx(7.0)
    assert copy_on(taken, "b", 1).defer == 0.0  # deferred on "a" only
    assert copy_on(taken, "a", 2).defer == pytest.approx(1.0)
    assert taken.topics["t"].held[0].defer == pytest.approx(3.0)
    # a topic-held DPUB keeps its due time through the Fanout
    feed.send(Fanout("t", ("a",), (mid(3),)))
    clock.now += 2.0
    taken = store.takeover()
    assert copy_on(taken, "a", 3).defer == pytest.approx(1.0)
    assert copy_on(taken, "a", 2).defer == 0.0  # past due
    feed.send(Defer("t", "a", mid(1), 0))  # a REQ without delay ends the deferral
    assert copy_on(store.takeover(), "a", 1).defer == 0.0


def test_channel_ops(store: ReplicaStore) -> None:
    feed = Feeder(store)
    feed.send(ChannelOp("t", "idle", "create"), ChannelOp("t", "p", "pause"))
    feed.send(put(1, ("a", "b", "p")), put(2, ("a", "b")), put(3, None))
    feed.send(ChannelOp("t", "a", "empty"), ChannelOp("t", "b", "delete"))
    taken = store.takeover()
    channels = taken.topics["t"].channels
    assert sorted(channels) == ["a", "idle", "p"]  # emptied "a" stays, deleted "b" is gone
    assert ids_on(taken, "a") == [] and ids_on(taken, "idle") == []
    assert ids_on(taken, "p") == [mid(1)]
    assert channels["p"].paused and not channels["a"].paused
    assert held_ids(taken) == [mid(3)]
    assert store.live_count() == 2  # mid(2) had copies on a and b only: gone
    feed.send(ChannelOp("t", "p", "unpause"), ChannelOp("t", "gone", "delete"))
    assert not store.takeover().topics["t"].channels["p"].paused


def test_topic_empty_drops_the_topic_held_copies_only(store: ReplicaStore) -> None:
    # Go's topic.Empty() empties the topic's own queue; the channels keep their messages, so
    # the owner still delivers them and this node must keep their copies
    feed = Feeder(store)
    feed.send(put(1, ("a",)), put(2, None), put(3, None, topic="u"))
    feed.send(TopicOp("t", "empty"))
    taken = store.takeover()
    assert held_ids(taken) == []
    assert ids_on(taken, "a") == [mid(1)]
    assert held_ids(taken, "u") == [mid(3)]
    assert store.live_count() == 2


def test_topic_delete_drops_everything_of_the_topic(store: ReplicaStore) -> None:
    feed = Feeder(store)
    feed.send(TopicOp("t", "pause"), ChannelOp("t", "x", "create"))
    feed.send(put(1, ("a",)), put(2, None), put(3, ("a",), topic="u"))
    assert store.takeover().topics["t"].paused
    feed.send(TopicOp("t", "delete"))
    taken = store.takeover()
    assert list(taken.topics) == ["u"]
    assert store.live_count() == 1
    feed.send(TopicOp("t", "create"))
    taken = store.takeover()
    assert taken.topics["t"].channels == {} and not taken.topics["t"].paused


# -- sequence numbers and syncs ------------------------------------------------------------


def test_a_resend_is_skipped_and_a_gap_raises(store: ReplicaStore) -> None:
    store.apply(1, [put(1), put(2)])
    store.apply(1, [put(1), put(2)])  # all seen
    store.apply(2, [put(2), put(3)])  # overlaps: only event 3 is new
    assert store.applied_seq == 3
    store.apply(2, [Fin("t", "a", (mid(2),))])  # seq 2 is applied already: not this FIN
    assert ids_on(store.takeover(), "a") == [mid(1), mid(2), mid(3)]
    with pytest.raises(SequenceGap):
        store.apply(5, [put(5)])
    assert store.applied_seq == 3
    store.apply(4, [put(4)])
    assert store.stored_seq == 4


def test_sync_every_one_stores_before_apply_returns(tmp_path: Path, clock: FakeClock) -> None:
    store = open_store(tmp_path, clock, sync_every=1)
    store.apply(1, [put(1)])
    assert store.stored_seq == 1
    store.close()


def test_sync_every_n_and_the_sync_timeout(tmp_path: Path, clock: FakeClock) -> None:
    store = open_store(tmp_path, clock, sync_every=3)
    store.apply(1, [put(1), put(2)])
    assert (store.applied_seq, store.stored_seq, store.sync_due()) == (2, 0, False)
    store.apply(3, [put(3)])  # the third event since the last fsync
    assert store.stored_seq == 3
    store.apply(4, [put(4)])
    assert store.stored_seq == 3 and not store.sync_due()
    clock.now += 2.0  # --sync-timeout
    assert store.sync_due()
    store.sync()
    assert store.stored_seq == 4 and not store.sync_due()
    clock.now += 5.0
    assert not store.sync_due()  # nothing unsynced
    store.close()


def test_an_fsync_off_the_loop_covers_what_was_logged_before_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The node's runtime fsyncs a store in a thread (begin_sync, end_sync): with
    --sync-every=1 what counts as stored (what an ACK may cover) is what an fsync that began
    after it ended; what is logged meanwhile waits for the next; a failed fsync stores
    nothing and leaves the events unsynced."""
    store = open_store(tmp_path, clock, sync_every=1)
    store.apply(1, [put(1)], sync=False)
    assert store.acks_after_sync and store.sync_wanted() and store.acknowledgeable_seq == 0
    job = store.begin_sync()
    assert job is not None
    fd, seq = job
    store.apply(2, [put(2), put(3)], sync=False)  # logged while the fsync runs
    os.fsync(fd)
    os.close(fd)
    store.end_sync(seq, ok=True)
    assert (seq, store.acknowledgeable_seq, store.sync_wanted()) == (1, 1, True)
    fd, seq = store.begin_sync() or (-1, -1)
    os.close(fd)
    store.end_sync(seq, ok=False)
    assert store.acknowledgeable_seq == 1 and store.sync_wanted()
    fd, seq = store.begin_sync() or (-1, -1)
    os.fsync(fd)
    os.close(fd)
    store.end_sync(seq, ok=True)
    assert store.acknowledgeable_seq == 3 and store.begin_sync() is None
    store.close()
    lazy = open_store(tmp_path / "lazy", clock, sync_every=100)
    lazy.apply(1, [put(1)], sync=False)
    assert not lazy.acks_after_sync and lazy.acknowledgeable_seq == 1  # written is stored
    lazy.close()


# -- durability ----------------------------------------------------------------------------


def rich_history(feed: Feeder) -> None:
    """Events touching every part of the index."""
    feed.send(TopicOp("t", "create"), ChannelOp("t", "idle", "create"), TopicOp("u", "pause"))
    feed.send(ChannelOp("t", "p", "pause"), put(1, ("a", "b", "p"), defer_ms=5000))
    feed.send(put(2, None, defer_ms=3000), put(3, None), put(4, ("a",), attempts=3))
    feed.send(Fanout("t", ("a", "b"), (mid(3),)), Attempts("t", "b", mid(1), 7))
    feed.send(Defer("t", "a", mid(4), 9000), Fin("t", "a", (mid(1),)), put(5, ("x",), topic="u"))
    feed.send(put(6, ("a",)), ChannelOp("t", "gone", "create"), ChannelOp("t", "gone", "delete"))


def test_close_and_reopen_give_the_same_takeover(tmp_path: Path, clock: FakeClock) -> None:
    store = open_store(tmp_path, clock, sync_every=100)
    rich_history(Feeder(store))
    before = store.takeover()
    store.close()  # close fsyncs what is pending
    assert before.stored_seq == 0 and store.stored_seq == store.applied_seq
    reopened = open_store(tmp_path, clock, sync_every=100)
    after = reopened.takeover()
    assert after.topics == before.topics
    assert after.stored_seq == store.applied_seq == reopened.applied_seq
    # it goes on from there
    Feeder(reopened).send(Fin("t", "a", (mid(6),)))
    assert mid(6) not in ids_on(reopened.takeover(), "a")
    reopened.close()


def test_a_store_dropped_without_close_replays(tmp_path: Path, clock: FakeClock) -> None:
    store = open_store(tmp_path, clock)
    rich_history(Feeder(store))
    before = store.takeover()
    del store  # no close: as a process that died
    second = open_store(tmp_path, clock)
    assert second.takeover() == before
    assert second.stored_seq == before.stored_seq
    second.close()


_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from nsqpy.nsqd.replica.store import ReplicaStore
    from nsqpy.protocol.replica import Fin, Put
    store = ReplicaStore(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sync_every=1,
                         sync_timeout=2.0)
    seq = 1
    for n in range(1, 1_000_000):
        msg_id = b"%016x" % n
        events = [Put("t", msg_id, n, 1, b"x" * 100, ("a",))]
        if n % 2 == 0:
            events.append(Fin("t", "a", (msg_id,)))
        store.apply(seq, events)
        seq += len(events)
        print(store.stored_seq, flush=True)
    """
)


def test_a_sigkilled_writer_loses_nothing_it_reported_stored(
    tmp_path: Path, clock: FakeClock
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path), OWNER, INCARNATION],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        reported = 0
        deadline = time.monotonic() + 30
        while reported < 300 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            reported = int(line)
        assert reported >= 300, "the writer did not get going"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    store = open_store(tmp_path, clock)
    assert store.stored_seq >= reported
    # every odd message is unfinished (each even one is finished in its own batch), and each
    # message up to the stored sequence number is in
    live = ids_on(store.takeover(), "a")
    assert live == [mid(n) for n in range(1, 2 * len(live), 2)]
    assert len(live) >= reported // 3
    store.apply(store.applied_seq + 1, [put(10**9, ("a",))])  # it appends after the kill
    store.close()


def test_a_torn_last_record_is_ignored(tmp_path: Path, clock: FakeClock, quiet: Logger) -> None:
    store = open_store(tmp_path, clock)
    feed = Feeder(store)
    feed.send(put(1), put(2))
    before = store.takeover()
    feed.send(put(3))
    store.close()
    size = store.path.stat().st_size
    os.truncate(store.path, size - 5)  # the last record cut short
    torn = open_store(tmp_path, clock, logger=quiet)
    assert torn.takeover() == before
    assert torn.stored_seq == 2
    # the next record follows the last good one: seq 3 again, and it survives a reopen
    torn.apply(3, [put(33)])
    torn.close()
    again = open_store(tmp_path, clock, logger=quiet)
    assert ids_on(again.takeover(), "a") == [mid(1), mid(2), mid(33)]
    assert again.stored_seq == 3
    again.close()


@pytest.mark.parametrize("tail", [b"\x00" * 40, b"\x00\x00\x00\x10garbage-garbage-", b"\x01"])
def test_garbage_after_the_last_record_is_ignored(
    tmp_path: Path, clock: FakeClock, quiet: Logger, tail: bytes
) -> None:
    store = open_store(tmp_path, clock)
    Feeder(store).send(put(1), put(2))
    before = store.takeover()
    store.close()
    good_size = store.path.stat().st_size
    with store.path.open("ab") as handle:
        handle.write(tail)  # zeros a crash left, or a record whose checksum fails
    reopened = open_store(tmp_path, clock, logger=quiet)
    assert reopened.takeover() == before
    assert reopened.path.stat().st_size == good_size == reopened.log_size  # the tail is cut
    reopened.close()


def test_a_last_record_that_fails_its_checksum_is_ignored(
    tmp_path: Path, clock: FakeClock, quiet: Logger
) -> None:
    store = open_store(tmp_path, clock)
    feed = Feeder(store)
    feed.send(put(1))
    before = store.takeover()
    feed.send(put(2))
    store.close()
    data = bytearray(store.path.read_bytes())
    at = data.rindex(b"body-2")
    data[at + 3] ^= 0x01  # decodes fine as another body: only the checksum tells
    store.path.write_bytes(bytes(data))
    reopened = open_store(tmp_path, clock, logger=quiet)
    assert reopened.takeover() == before
    reopened.close()


# -- compaction, files ---------------------------------------------------------------------


def test_compaction_keeps_the_log_bounded_under_publish_and_finish(
    tmp_path: Path, clock: FakeClock
) -> None:
    floor = 64 * 1024
    store = open_store(tmp_path, clock, sync_every=50, compact_floor=floor)
    feed = Feeder(store)
    body = b"y" * 200
    largest = 0
    for n in range(20_000):
        feed.send(Put("t", mid(n), n, 1, body, ("a", "b")))
        if n >= 10:  # ten messages stay unfinished on "a" throughout
            feed.send(Fin("t", "a", (mid(n - 10),)), Fin("t", "b", (mid(n),)))
        else:
            feed.send(Fin("t", "b", (mid(n),)))
        largest = max(largest, sum(path.stat().st_size for path in tmp_path.iterdir()))
    # without compaction this would be ~10 MB
    assert largest <= 2 * floor + 4096
    assert ids_on(store.takeover(), "a") == [mid(n) for n in range(19_990, 20_000)]
    store.close()
    reopened = open_store(tmp_path, clock, compact_floor=floor)
    assert ids_on(reopened.takeover(), "a") == [mid(n) for n in range(19_990, 20_000)]
    assert reopened.stored_seq == feed.seq - 1
    reopened.close()


def test_compaction_keeps_every_part_of_the_state(tmp_path: Path, clock: FakeClock) -> None:
    store = open_store(tmp_path, clock, compact_floor=4096)
    feed = Feeder(store)
    rich_history(feed)
    before = store.takeover()
    # finished traffic on another topic until the log is rewritten
    n = 0
    while store.compactions == 0:
        feed.send(put(1000 + n, ("z",), topic="w"), Fin("w", "z", (mid(1000 + n),)))
        n += 1
        assert n < 10_000, "never compacted"
    assert store.log_size < 4096
    after = store.takeover()
    assert {name: after.topics[name] for name in before.topics} == before.topics
    assert after.stored_seq == feed.seq - 1
    store.close()
    reopened = open_store(tmp_path, clock, compact_floor=4096)
    assert reopened.takeover() == after
    reopened.close()


def test_stores_of_two_incarnations_are_apart_and_delete_removes_the_file(
    tmp_path: Path, clock: FakeClock
) -> None:
    old = open_store(tmp_path, clock)
    Feeder(old).send(put(1))
    new = ReplicaStore(tmp_path, OWNER, "new+/.x", sync_every=1, sync_timeout=1.0, clock=clock)
    Feeder(new).send(put(2))
    assert sorted(list_stores(tmp_path)) == [(OWNER, INCARNATION), (OWNER, "new+/.x")]
    assert ids_on(old.takeover(), "a") == [mid(1)]
    old.delete()
    assert list_stores(tmp_path) == [(OWNER, "new+/.x")]
    assert not old.path.exists()
    fresh = open_store(tmp_path, clock)  # the same incarnation again starts empty
    assert fresh.live_count() == 0 and fresh.stored_seq == 0
    fresh.close()
    new.close()


# -- the PUTS fast path beside its plain twin --------------------------------------------

put_batches = st.lists(st.integers(min_value=0, max_value=7), min_size=1, max_size=5)
channel_choices = st.sampled_from([None, (), ("a",), ("a", "b")])
steps = st.lists(
    st.one_of(
        st.tuples(st.just("puts"), put_batches, channel_choices, st.integers(1, 3)),
        st.tuples(st.just("fanout"), put_batches, st.sampled_from([(), ("a",), ("b", "a")])),
        st.tuples(st.just("fin"), put_batches, st.sampled_from(["a", "b"])),
    ),
    max_size=12,
)


def as_events(step: tuple[Any, ...], fast: bool) -> list[Event]:
    kind, numbers = step[0], step[1]
    if kind == "fanout":
        return [Fanout("t", step[2], tuple(mid(n) for n in numbers))]
    if kind == "fin":
        return [Fin("t", step[2], tuple(mid(n) for n in numbers))]
    channels, attempts = step[2], step[3]
    plain = [put(n, channels, attempts=attempts) for n in numbers]
    if not fast:
        return list(plain)
    records = b"".join(
        RECORD_HEAD.pack(RECORD_FIXED + len(p.body), p.timestamp, p.attempts, p.msg_id) + p.body
        for p in plain
    )
    return [Puts("t", records, channels)]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(steps)
def test_puts_leaves_the_store_as_a_put_of_each_record_does(steps: list[Any]) -> None:
    """Puts (records applied in one inlined loop) against the plain Put of each message:
    the same copies, attempts, holds and message bodies, whatever came before."""
    with tempfile.TemporaryDirectory() as tmp:
        stores = [open_store(Path(tmp) / kind, FakeClock()) for kind in ("fast", "plain")]
        for store, fast in zip(stores, (True, False), strict=True):
            feed = Feeder(store)
            for step in steps:
                feed.send(*as_events(step, fast))
        fast_store, plain_store = stores
        assert fast_store.takeover().topics == plain_store.takeover().topics
        assert fast_store.live_count() == plain_store.live_count()
        assert fast_store._live_bytes == plain_store._live_bytes
        for store in stores:
            store.close()


@settings(max_examples=100, deadline=None, derandomize=True)
@given(put_batches, st.sampled_from([(), ("a",), ("a", "b")]), steps)
def test_puts_naming_channels_is_puts_then_its_fanout(
    numbers: list[int], channels: tuple[str, ...], before: list[Any]
) -> None:
    """The owner sends a publish to a flowing topic as one Puts naming the channels the
    topic's pump then copied it to, instead of a Puts and a Fanout: the peer's store ends
    the same, whatever came before (of other messages: the publish's are new)."""
    numbers = [n + 8 for n in numbers]
    ids = tuple(mid(n) for n in numbers)
    with tempfile.TemporaryDirectory() as tmp:
        stores = [open_store(Path(tmp) / kind, FakeClock()) for kind in ("one", "two")]
        for store in stores:
            feed = Feeder(store)
            for step in before:
                feed.send(*as_events(step, fast=True))
        joined, separate = (Feeder(store) for store in stores)
        [held] = as_events(("puts", numbers, None, 1), fast=True)
        assert isinstance(held, Puts)
        joined.send(Puts("t", held.records, channels))
        separate.send(held, Fanout("t", channels, ids))
        one, two = stores
        assert one.takeover().topics == two.takeover().topics
        assert one.live_count() == two.live_count()
        for store in stores:
            store.close()


def test_the_bodies_stay_in_the_log_not_in_memory(tmp_path: Path, clock: FakeClock) -> None:
    """A held message costs the index its place in the log, not its body: 200 copies of 64
    KiB bodies leave no body in the store's memory, and a takeover reads them back whole,
    also after a compaction moved them and after a reopen."""
    store = open_store(tmp_path, clock, compact_floor=4096)
    feed = Feeder(store)
    bodies = {mid(n): bytes([n % 251]) * 65536 for n in range(200)}
    for msg_id, body in bodies.items():
        feed.send(Put("t", msg_id, 1, 1, body, ("a",)))
    index_objects = [item for topic in store._topics.values() for item in topic.messages.values()]
    for item in index_objects:
        assert isinstance(item, tuple) and all(isinstance(field, int) for field in item)

    def taken_bodies(s: ReplicaStore) -> dict[bytes, bytes]:
        return {m.msg_id: m.body for m in s.takeover().topics["t"].channels["a"].messages}

    assert taken_bodies(store) == bodies
    feed.send(Fin("t", "a", tuple(list(bodies)[:150])))  # most of the log is finished
    assert store.compactions == 1
    live = {msg_id: body for msg_id, body in list(bodies.items())[150:]}
    assert taken_bodies(store) == live
    store.close()
    assert taken_bodies(open_store(tmp_path, clock)) == live


# -- the RUN of an MPUB beside its plain twin -----------------------------------------------

RUN_TIMESTAMP = 1_700_000_000_000_000_000


def sized(bodies: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(body)) + body for body in bodies)


def run_of(numbers: list[int], channels: tuple[str, ...] | None, topic: str = "t") -> Run:
    ids = tuple(mid(n) for n in numbers)
    return Run(topic, RUN_TIMESTAMP, ids, sized([b"body-%d" % n for n in numbers]), channels)


def puts_of(run: Run) -> list[Event]:
    """The run as the plain Put of each message: one timestamp, attempts 0."""
    bodies = iter(b"body-%d" % int(msg_id, 16) for msg_id in run.ids)
    return [Put(run.topic, i, run.timestamp, 0, next(bodies), run.channels) for i in run.ids]


channel = st.sampled_from(["a", "b"])
run_steps = st.lists(
    st.one_of(
        # a publish: its count of new messages (the owner mints new IDs for each), and
        # whether one of them comes twice (never from a sound owner)
        st.tuples(st.just("run"), st.integers(1, 6), channel_choices, st.booleans()),
        st.tuples(st.just("fanout"), put_batches, st.sampled_from([(), ("a",), ("b", "a")])),
        st.tuples(st.just("fin"), put_batches, channel),
        st.tuples(st.just("attempts"), st.integers(0, 7), st.integers(1, 5)),
        st.tuples(st.just("defer"), st.integers(0, 7), st.integers(1, 5000)),
        # a message put again (a requeue's higher attempts), taken over by another node
        st.tuples(st.just("put"), st.integers(0, 7), st.integers(1, 5)),
        st.tuples(st.just("forget"), put_batches, channel),
        # a channel emptied, deleted or created; the topic emptied
        st.tuples(st.just("channel"), st.sampled_from([OP_EMPTY, OP_DELETE, OP_CREATE]), channel),
        st.tuples(st.just("topic"), st.just(OP_EMPTY)),
        st.tuples(st.just("compact")),
    ),
    max_size=16,
)


def coarse(takeover: Takeover) -> dict[str, Any]:
    """The takeover's topics with each deferral in whole seconds, rounded up."""
    return {
        name: (
            topic.paused,
            {
                channel.name: (
                    channel.paused,
                    [replace(m, defer=math.ceil(m.defer)) for m in channel.messages],
                )
                for channel in topic.channels.values()
            },
            [replace(m, defer=math.ceil(m.defer)) for m in topic.held],
        )
        for name, topic in takeover.topics.items()
    }


def run_step_events(steps: list[Any]) -> Iterator[tuple[list[Event], list[Event]]]:
    """Each step as (its events with runs, the same with the plain Puts)."""
    fresh = 0
    for step in steps:
        kind = step[0]
        if kind == "run":
            numbers = list(range(fresh, fresh + step[1]))
            fresh += step[1]
            if step[3]:
                numbers.append(numbers[0])
            run = run_of(numbers, step[2])
            yield [run], puts_of(run)
        elif kind in ("fanout", "fin"):
            yield as_events(step, fast=False), as_events(step, fast=False)
        elif kind == "attempts":
            event: Event = Attempts("t", "a", mid(step[1]), step[2])
            yield [event], [event]
        elif kind == "defer":
            event = Defer("t", "a", mid(step[1]), step[2])
            yield [event], [event]
        elif kind == "put" and step[1] < fresh:  # a published message as the owner put it
            n = step[1]
            event = Put("t", mid(n), RUN_TIMESTAMP, step[2], b"body-%d" % n, ("a",))
            yield [event], [event]
        elif kind == "channel":
            event = ChannelOp("t", step[2], step[1])
            yield [event], [event]
        elif kind == "topic":
            event = TopicOp("t", step[1])
            yield [event], [event]
        else:  # forget and compact act on the stores, not through events; no put of a new ID
            yield [], []


#: each kind of event that touches a message, after two runs that nothing touched yet (kept
#: whole, indexed message by message only then): a message of the first and of the second
PENDING_TOUCHES = [
    ("fin", [1, 3], "a"),
    ("fanout", [1, 3], ("a",)),
    ("attempts", 3, 3),
    ("defer", 1, 100),
    ("put", 3, 2),
    ("forget", [1, 3], "a"),
    ("channel", OP_EMPTY, "a"),
    ("channel", OP_DELETE, "a"),
    ("topic", OP_EMPTY),
    ("topic", OP_DELETE),
    ("compact",),
]


#: fan-outs of held runs (of 3 and 2 messages) as the owner's pump sends them: whole runs, and
#: the first part of one (in memory, and read back from its disk queue in batches)
PENDING_FANOUTS = [
    [[0, 1, 2], [3, 4]],
    [[0, 1, 2, 3, 4]],
    [[0, 1], [2, 3], [4]],
    [[0], [1], [2, 3, 4]],
    [[0, 1, 2, 3], [4]],
    [[1, 2], [0, 3, 4]],
]


def with_pending_touches(test: Callable[..., None]) -> Callable[..., None]:
    def runs(channels: tuple[str, ...] | None) -> list[tuple[Any, ...]]:
        return [("run", 3, channels, False), ("run", 2, channels, False)]

    for batches in PENDING_FANOUTS:
        for names in [("a",), ("b", "a"), ()]:
            fanouts = [("fanout", batch, names) for batch in batches]
            finish = [("fin", [1, 3], "a"), ("compact",)]
            test = example(steps=[*runs(None), *fanouts, *finish])(test)
    # the same batches as a consumer's FINs of runs on one channel or two
    for batches in PENDING_FANOUTS:
        for names in [("a",), ("a", "b"), ("a", "a")]:
            fins = [("fin", batch, "a") for batch in batches]
            finish = [("compact",), ("fin", [0, 4], "b")]
            test = example(steps=[*runs(names), *fins, *finish])(test)
    for channels in (None, ("a",), ("a", "b")):
        for touch in PENDING_TOUCHES:
            test = example(steps=[*runs(channels), touch, ("fin", [0, 4], "b")])(test)
    return test


def assert_index_sound(store: ReplicaStore) -> None:
    """No message without a copy; pending runs each with copies, listed by their first IDs in
    order, their IDs' ranges apart."""
    for topic in store._topics.values():
        on_channels = set().union(*(channel.copies for channel in topic.channels.values()))
        assert set(topic.messages) == on_channels | set(topic.held)
        firsts = [min(run.ids()) for run in topic.pending]
        assert topic.pending_firsts == firsts == [run.first() for run in topic.pending]
        assert all(run.channels is None or run.channels for run in topic.pending)
        lasts = [max(run.ids()) for run in topic.pending]
        assert lasts == [run.last() for run in topic.pending]
        for run in topic.pending:
            assert len(set(run.ids())) == run.count() > 0
            assert all(run.holds(msg_id) for msg_id in run.ids())
            straddle = run.id_bytes[8:24]  # across two IDs: held only if it is one of them
            assert run.holds(straddle) == (straddle in run.ids())
        assert all(last < first for last, first in zip(lasts, firsts[1:], strict=False))


@pytest.mark.parametrize("min_split", [1, store_module.MIN_SPLIT])
@settings(max_examples=200, deadline=None, derandomize=True)
@with_pending_touches
@given(steps=run_steps)
def test_a_run_leaves_the_store_as_a_put_of_each_message_does(
    min_split: int, steps: list[Any]
) -> None:
    """A Run (an MPUB's messages kept as one entry until an event touches one of them, their
    bodies split only when read back) against the plain Put of each: the same copies,
    attempts, deferrals, holds, timestamps and bodies, whatever came before; also after a
    close and a replay, and after a compaction rewrote the runs. With ``min_split`` 1 a
    batch that ends inside a run splits it; with the default, these small runs never split."""
    with (
        mock.patch.object(store_module, "MIN_SPLIT", min_split),
        tempfile.TemporaryDirectory() as tmp,
    ):
        stores = [open_store(Path(tmp) / kind, FakeClock()) for kind in ("run", "plain")]
        feeds = [Feeder(store) for store in stores]
        for step, (with_runs, plain) in zip(steps, run_step_events(steps), strict=True):
            if with_runs:
                feeds[0].send(*with_runs)
                feeds[1].send(*plain)
            forgotten = []
            for store in stores:
                if step[0] == "forget":
                    forgotten.append(store.forget_copies("t", step[2], [mid(n) for n in step[1]]))
                elif step[0] == "compact":
                    store._rewrite(store._snapshot(store._topics))
            assert forgotten[:1] == forgotten[1:]
            assert stores[0].live_count() == stores[1].live_count()
            assert_index_sound(stores[0])
        runs, plains = stores
        expected = plains.takeover().topics
        assert runs.takeover().topics == expected
        assert runs.live_count() == plains.live_count()
        # both replayed (a replay brings forgotten copies back: forgetting is not logged);
        # a replay counts a deferral again, and a rewrite rounds it up to the millisecond
        runs.close()
        plains.close()
        replayed, plains = (open_store(Path(tmp) / kind, FakeClock()) for kind in ("run", "plain"))
        assert coarse(replayed.takeover()) == coarse(plains.takeover())
        replayed._rewrite(replayed._snapshot(replayed._topics))
        assert coarse(replayed.takeover()) == coarse(plains.takeover())
        for store in (replayed, plains):
            store.close()


def test_runs_are_compacted_and_their_bodies_read_back_after_a_reopen(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Runs of 64 KiB bodies: the index holds one entry per run, not the bodies; most
    finished, the log is rewritten, and a takeover reads the live bodies back whole, also
    after a reopen."""
    store = open_store(tmp_path, clock, compact_floor=4096)
    feed = Feeder(store)
    bodies = {mid(n): bytes([n % 251]) * 65536 for n in range(200)}
    ids = list(bodies)
    for start in range(0, 200, 20):
        batch = ids[start : start + 20]
        feed.send(Run("t", RUN_TIMESTAMP, tuple(batch), sized([bodies[i] for i in batch]), ("a",)))
    topic = store._topics["t"]
    assert len(topic.pending) == 10 and not topic.messages  # one entry per run, none per message

    def taken(s: ReplicaStore) -> dict[bytes, tuple[int, int, bytes]]:
        messages = s.takeover().topics["t"].channels["a"].messages
        return {m.msg_id: (m.timestamp, m.attempts, m.body) for m in messages}

    assert taken(store) == {i: (RUN_TIMESTAMP, 0, body) for i, body in bodies.items()}
    feed.send(Fin("t", "a", tuple(ids[:150])))
    assert store.compactions == 1
    live = {i: (RUN_TIMESTAMP, 0, bodies[i]) for i in ids[150:]}
    assert taken(store) == live
    store.close()
    assert taken(open_store(tmp_path, clock)) == live


def test_a_run_whose_bodies_do_not_match_its_ids_is_logged_and_the_rest_kept(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A run is split only when read back: one that does not split into its IDs' messages
    (only a broken owner sends one) is reported then, and every other copy is taken over."""
    lines: list[str] = []

    def logger(level: str, line: str) -> None:
        lines.append(line)

    store = ReplicaStore(
        tmp_path, OWNER, INCARNATION, sync_every=1, sync_timeout=2.0, clock=clock, logger=logger
    )
    feed = Feeder(store)
    feed.send(put(1))
    feed.send(Run("t", RUN_TIMESTAMP, (mid(2), mid(3)), sized([b"one", b"two", b"three"]), ("a",)))
    feed.send(run_of([4, 5], ("a",)))
    assert ids_on(store.takeover(), "a") == [mid(1), mid(4), mid(5)]
    assert any("does not read back" in line for line in lines)
    store.close()
