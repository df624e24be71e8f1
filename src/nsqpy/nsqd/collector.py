"""The cycle collector paced for a daemon that keeps millions of messages in memory.

nsqd holds up to ``--mem-queue-size`` messages per queue, every one an object the cycle
collector tracks. CPython runs a full collection after ten middle-generation ones whenever
the objects that survived the young generations since reach a quarter of those that survived
the last full one. A large backlog that keeps flowing meets that rule again and again, and
each full collection walks every queued message with the event loop stopped (at 100 channels
and a million queued messages, hundreds of milliseconds in which no client is served).

nsqd keeps CPython's rule but bounds its cost: after a full collection that took *d* seconds,
no other starts by itself for ``d / BUDGET`` seconds (and at least ``MIN_INTERVAL``), so full
collections take under ``BUDGET`` of the time however large the backlog. Cycles that outlive
the young generations (a closed connection's objects, say) are still collected, a little
later at most. The young generations are collected every ``YOUNG_THRESHOLD`` allocations
rather than CPython's 700, in larger, cheaper steps.

Every collection stops the event loop, and no client is served meanwhile. nsqd keeps the
most recent pauses (:data:`PAUSES`), whatever their generation, and ``/stats`` reports them
where Go's nsqd reports its own collector's (``gc_pause_usec_100``, ``_99``, ``_95``).
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

#: allocations between young collections (CPython's default is 700)
YOUNG_THRESHOLD = 10_000
#: young collections between middle-generation collections (CPython's default)
MIDDLE_THRESHOLD = 10
#: middle-generation collections before a full one may start (CPython's default)
MIDDLE_PER_FULL = 10
#: a middle-generation count no run reaches: CPython then starts no full collection
NEVER = 2**31 - 1
#: the most of the time full collections may take
BUDGET = 0.05
#: the least time between two full collections CPython starts, seconds
MIN_INTERVAL = 1.0
#: how often the pacer looks whether full collections may start again, seconds
CHECK_INTERVAL = 0.25
#: the pauses kept for /stats (Go's runtime keeps its last 256)
PAUSES_KEPT = 256


class PauseLog:
    """The most recent collections' pauses, every generation, as a ``gc.callbacks`` entry."""

    def __init__(
        self, clock: Callable[[], float] = time.perf_counter, kept: int = PAUSES_KEPT
    ) -> None:
        self._clock = clock
        self._started = 0.0
        self._pauses: deque[float] = deque(maxlen=kept)

    def observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._clock()
        else:
            self._pauses.append(self._clock() - self._started)

    def percentile_usec(self, percent: float) -> int:
        """The kept pauses' ``percent`` percentile in whole microseconds, 0 before any, as
        Go's nsqd picks it (statsd.go ``percentile``: the sorted pauses' element at
        ``floor(percent / 100 * n + 0.5)``, the last at most)."""
        pauses = sorted(self._pauses)
        if not pauses:
            return 0
        index = min(len(pauses) - 1, math.floor(percent / 100 * len(pauses) + 0.5))
        return round(pauses[index] * 1_000_000)


#: the daemon's pause log, filled once its pacer is installed
PAUSES = PauseLog()


class CollectorPacer:
    """Holds CPython's full collections back for a while after each one, once installed.

    Every full collection counts, an explicit ``gc.collect()`` made elsewhere included."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        budget: float = BUDGET,
        min_interval: float = MIN_INTERVAL,
        pauses: PauseLog = PAUSES,
    ) -> None:
        self._clock = clock
        self._pauses = pauses
        self._budget = budget
        self._min_interval = min_interval
        self._full_started = 0.0
        self._resume_at: float | None = None  # when full collections may start again
        self._saved_threshold: tuple[int, int, int] | None = None

    def install(self) -> None:
        """Freeze what start-up made, set the thresholds and watch collections (their
        pauses logged in ``pauses``)."""
        gc.freeze()  # start-up's objects (modules, classes) live as long as the process
        self._saved_threshold = gc.get_threshold()
        gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, MIDDLE_PER_FULL)
        gc.callbacks.append(self.observe)
        gc.callbacks.append(self._pauses.observe)

    def uninstall(self) -> None:
        """Give the collector back as it was (for a test that installed a pacer)."""
        for callback in (self.observe, self._pauses.observe):
            if callback in gc.callbacks:
                gc.callbacks.remove(callback)
        if self._saved_threshold is not None:
            gc.set_threshold(*self._saved_threshold)
            self._saved_threshold = None
        gc.unfreeze()

    @property
    def holding(self) -> bool:
        """Whether full collections are held back now."""
        return self._resume_at is not None

    def observe(self, phase: str, info: dict[str, Any]) -> None:
        """``gc.callbacks`` entry: after each full collection, hold the next one back."""
        if info["generation"] != 2:
            return
        now = self._clock()
        if phase == "start":
            self._full_started = now
            return
        took = now - self._full_started
        self._resume_at = now + max(self._min_interval, took / self._budget)
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, NEVER)

    def resume_if_due(self) -> bool:
        """Let CPython start full collections again once the hold is over; whether it did."""
        if self._resume_at is None or self._clock() < self._resume_at:
            return False
        self._resume_at = None
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, MIDDLE_PER_FULL)
        return True

    async def run(self, interval: float = CHECK_INTERVAL) -> None:
        """Lift each hold when it is over, checking every ``interval`` seconds, until
        cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.resume_if_due()
