"""RunQueue, a channel's memory queue, against the deque it stands in for: any sequence of
appends, extends (shared tuples and lists), poplefts, takes and clears leaves both with the
same messages in the same order; a shared tuple is queued as it is and never changed."""

from __future__ import annotations

import gc
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.nsqd.memory_queue import RUN_LIMIT, RunQueue
from nsqpy.nsqd.message import Message

Op = tuple[str, int]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.just(1)),
        st.tuples(st.sampled_from(["extend_tuple", "extend_list"]), st.integers(0, 300)),
        st.tuples(st.just("popleft"), st.just(1)),
        st.tuples(st.just("take"), st.integers(0, 600)),
        st.tuples(st.just("clear"), st.just(0)),
    ),
    max_size=60,
)


def message(n: int) -> Message:
    return Message(b"%016d" % n, b"body", 0)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_a_run_queue_behaves_as_a_deque(operations: list[Op]) -> None:
    queue = RunQueue()
    reference: deque[Message] = deque()
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
            queue.extend(tuple(batch) if name == "extend_tuple" else batch)
            reference.extend(batch)
        elif name == "popleft":
            if reference:
                assert queue.popleft() is reference.popleft()
            else:
                with pytest.raises(IndexError):
                    queue.popleft()
        elif name == "take":
            expected = [reference.popleft() for _ in range(min(size, len(reference)))]
            taken = queue.take(size)
            assert [m.id for m in taken] == [m.id for m in expected]
            assert all(a is b for a, b in zip(taken, expected, strict=True))
        else:
            queue.clear()
            reference.clear()
        assert len(queue) == len(reference)
        assert bool(queue) == bool(reference)
        assert [m.id for m in queue] == [m.id for m in reference]


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
