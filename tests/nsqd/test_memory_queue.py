"""RunQueue, a topic's or channel's memory queue, against the deque it stands in for: any
sequence of appends, extends (shared tuples, lists and MessageRuns), poplefts, takes and clears
leaves both with the same messages in the same order; a shared tuple or a MessageRun is queued
as it is and never changed."""

from __future__ import annotations

import gc
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.nsqd.memory_queue import RUN_LIMIT, RunQueue
from nsqpy.nsqd.message import Message, MessageRun

Op = tuple[str, int]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.just(1)),
        st.tuples(
            st.sampled_from(["extend_tuple", "extend_list", "extend_run"]), st.integers(0, 300)
        ),
        st.tuples(st.just("popleft"), st.just(1)),
        st.tuples(st.sampled_from(["take", "take_runs"]), st.integers(0, 600)),
        st.tuples(st.just("clear"), st.just(0)),
    ),
    max_size=60,
)


def message(n: int) -> Message:
    return Message(b"%016d" % n, b"body %d" % n, 7)


def run_of(msgs: list[Message]) -> MessageRun:
    return MessageRun([m.id for m in msgs], [m.body for m in msgs], 7)


def same(taken: list[Message], expected: list[Message]) -> bool:
    """The same messages: the very objects, or ones a MessageRun built anew (unshared, never
    handed out before)."""
    if len(taken) != len(expected):
        return False
    for got, want in zip(taken, expected, strict=True):
        if got is want:
            continue
        fields = (got.id, got.body, got.timestamp, got.attempts, got.shared, got.client)
        if fields != (want.id, want.body, want.timestamp, 0, False, None):
            return False
    return True


@settings(max_examples=300, deadline=None)
@given(ops)
def test_a_run_queue_behaves_as_a_deque(operations: list[Op]) -> None:
    queue = RunQueue()
    reference: deque[Message] = deque()
    from_runs: set[bytes] = set()  # IDs queued in a MessageRun: built anew when taken
    made = 0
    for name, size in operations:
        if name == "append":
            msg = message(made)
            made += 1
            queue.append(msg)
            reference.append(msg)
        elif name.startswith("extend"):
            batch = [message(made + i) for i in range(size)]
            made += size
            if name == "extend_run":
                queue.extend(run_of(batch))
                from_runs.update(m.id for m in batch)
            else:
                queue.extend(tuple(batch) if name == "extend_tuple" else batch)
            reference.extend(batch)
        elif name == "popleft":
            if reference:
                want = reference.popleft()
                got = queue.popleft()
                assert same([got], [want])
                assert (got is want) == (want.id not in from_runs)
            else:
                with pytest.raises(IndexError):
                    queue.popleft()
        elif name.startswith("take"):
            expected = [reference.popleft() for _ in range(min(size, len(reference)))]
            if name == "take":
                taken = queue.take(size)
            else:
                runs = queue.take_runs(size)
                assert all(len(run) > 0 for run in runs)
                taken = [msg for run in runs for msg in run]
            assert same(taken, expected)
        else:
            queue.clear()
            reference.clear()
        assert len(queue) == len(reference)
        assert bool(queue) == bool(reference)
        assert same(list(queue), list(reference))


def test_channels_share_a_tuple_without_changing_it() -> None:
    batch = tuple(message(n) for n in range(200))
    channels = [RunQueue() for _ in range(100)]
    for channel in channels:
        channel.extend(batch)
    # the queues refer to the batch, not to each message: one reference per channel
    referrers = [r for r in gc.get_referrers(batch[0]) if r is not batch]
    assert not referrers
    assert channels[0].take(150) == list(batch[:150])
    assert channels[0].popleft() is batch[150]
    channels[0].append(message(999))
    assert len(channels[0]) == 50
    assert len(channels[1]) == 200
    assert all(channel._runs[0] is batch for channel in channels)  # queued as it is


def test_single_appends_are_kept_in_bounded_runs() -> None:
    queue = RunQueue()
    msgs = [message(n) for n in range(3 * RUN_LIMIT + 1)]
    for msg in msgs:
        queue.append(msg)
    assert len(queue._runs) == 4
    for msg in msgs[:RUN_LIMIT]:
        assert queue.popleft() is msg
    assert len(queue._runs) == 3  # a run taken whole is let go


def test_a_long_list_is_kept_in_bounded_runs() -> None:
    queue = RunQueue([message(n) for n in range(2 * RUN_LIMIT + 1)])
    assert [len(run) for run in queue._runs] == [RUN_LIMIT, RUN_LIMIT, 1]


def test_a_message_run_is_built_anew_for_each_channel() -> None:
    run = run_of([message(n) for n in range(5)])
    first, second = RunQueue(), RunQueue()
    first.extend(run)
    second.extend(run)
    assert first._runs[0] is run and second._runs[0] is run  # queued as it is, unbuilt
    mine, theirs = first.take(3), second.take(3)
    assert [m.body for m in mine] == [b"body 0", b"body 1", b"body 2"]
    assert all(a is not b for a, b in zip(mine, theirs, strict=True))
    mine[0].attempts = 5  # one channel's delivery state is its own
    assert theirs[0].attempts == 0
    assert [len(r) for r in second.take_runs(10)] == [2]
    assert len(run) == 5  # the shared run itself is never changed


def test_a_queued_message_run_gives_the_collector_nothing_to_walk_per_message() -> None:
    # A million messages queued on 100 channels stay through many collections: their IDs
    # and bodies must leave the collector's lists after the first young collection, so later
    # collections (full ones walk everything tracked) cost one object per run, not per message.
    queue = RunQueue()
    ids, bodies = [b"%016d" % n for n in range(200)], [b"x%d" % n for n in range(200)]
    queue.extend(MessageRun(ids, bodies, 7))  # as an MPUB's parser hands them over: lists
    queue.extend(run_of([message(n) for n in range(3)]).slice(1))  # a run's slice alike
    gc.collect(0)
    for run in queue._runs:
        assert isinstance(run, MessageRun)
        assert not gc.is_tracked(run.ids)
        assert not gc.is_tracked(run.bodies)
