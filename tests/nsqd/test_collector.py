"""nsqd's paced full collections: after each full collection CPython starts none for the
collection's cost over the budget (at least the minimum interval), then starts them by its
own rule again, so cyclic garbage that outlived the young generations is still collected."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from nsqpy.nsqd.collector import (
    MIDDLE_PER_FULL,
    NEVER,
    YOUNG_THRESHOLD,
    CollectorPacer,
    PauseLog,
)

from .in_process_support import FakeClock

FULL = {"generation": 2, "collected": 0, "uncollectable": 0}
MIDDLE = {"generation": 1, "collected": 0, "uncollectable": 0}


class Node:
    """An object in a reference cycle: only the cycle collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def pauses() -> PauseLog:
    return PauseLog()


@pytest.fixture
def pacer(clock: FakeClock, pauses: PauseLog) -> Iterator[CollectorPacer]:
    pacer = CollectorPacer(clock.now, budget=0.05, min_interval=1.0, pauses=pauses)
    before = gc.get_threshold()
    pacer.install()
    try:
        yield pacer
    finally:
        pacer.uninstall()
        assert gc.get_threshold() == before


def full_collection(pacer: CollectorPacer, clock: FakeClock, seconds: float) -> None:
    pacer.observe("start", FULL)
    clock.advance(seconds)
    pacer.observe("stop", FULL)


def full_collections_during_allocations() -> int:
    """Full collections CPython starts while 14 middle collections' worth of objects survive
    (its own rule starts one after 10 middle collections that promoted this much)."""
    before = gc.get_stats()
    # a middle collection every 11 young ones, a young one every 10,001 allocations
    survivors: list[list[int]] = [[] for _ in range(14 * 11 * (YOUNG_THRESHOLD + 1))]
    after = gc.get_stats()
    del survivors
    assert after[1]["collections"] - before[1]["collections"] >= MIDDLE_PER_FULL + 1
    return int(after[2]["collections"] - before[2]["collections"])


def test_the_hold_after_a_full_collection_is_its_cost_over_the_budget(
    pacer: CollectorPacer, clock: FakeClock
) -> None:
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, MIDDLE_PER_FULL)
    assert not pacer.holding
    pacer.observe("start", MIDDLE)
    pacer.observe("stop", MIDDLE)
    assert not pacer.holding  # only full collections are held back
    full_collection(pacer, clock, 0.5)  # 0.5 s at a 5% budget: 10 s before the next
    assert pacer.holding
    assert gc.get_threshold()[2] == NEVER
    clock.advance(9.9)
    assert not pacer.resume_if_due()
    clock.advance(0.2)
    assert pacer.resume_if_due()
    assert not pacer.holding
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, MIDDLE_PER_FULL)
    full_collection(pacer, clock, 0.01)  # a cheap one: the minimum interval rules
    clock.advance(0.9)
    assert not pacer.resume_if_due()
    clock.advance(0.2)
    assert pacer.resume_if_due()


async def test_old_cyclic_garbage_waits_for_the_hold_then_goes(
    pacer: CollectorPacer, clock: FakeClock
) -> None:
    gc.collect()  # a real full collection: held back from now on
    assert pacer.holding
    garbage = Node()
    alive = weakref.ref(garbage)
    gc.collect(1)  # it survives the young generations: now in the old one
    del garbage
    assert full_collections_during_allocations() == 0
    assert alive() is not None
    pacing = asyncio.create_task(pacer.run(interval=0.001))
    try:
        clock.advance(60)
        for _ in range(100):
            if not pacer.holding:
                break
            await asyncio.sleep(0.005)
        assert not pacer.holding
    finally:
        pacing.cancel()
    assert full_collections_during_allocations() >= 1
    assert alive() is None


def test_pauses_are_picked_as_go_picks_its_collectors() -> None:
    clock = FakeClock()
    log = PauseLog(clock.now, kept=4)
    assert log.percentile_usec(100) == 0  # none yet
    for seconds in (0.004, 0.001, 0.003, 0.002, 0.010):  # the first drops out: 4 kept
        log.observe("start", MIDDLE)
        clock.advance(seconds)
        log.observe("stop", MIDDLE)
    # sorted 1, 2, 3, 10 ms: floor(p / 100 * 4 + 0.5), the last at most
    assert log.percentile_usec(100) == 10_000
    assert log.percentile_usec(99) == 10_000
    assert log.percentile_usec(95) == 10_000
    assert log.percentile_usec(50) == 3_000
    assert log.percentile_usec(10) == 1_000


def test_an_installed_pacer_logs_every_generations_pauses(
    pacer: CollectorPacer, pauses: PauseLog
) -> None:
    assert pauses.percentile_usec(100) == 0
    gc.collect(0)
    gc.collect()
    assert pauses.percentile_usec(100) > 0  # a full collection takes microseconds at least
    assert len(pauses._pauses) == 2
