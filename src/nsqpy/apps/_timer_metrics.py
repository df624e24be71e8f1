"""Request timing summaries every N requests (bitly/timer_metrics, used by nsq_to_nsq and
nsq_to_http's ``--status-every``).

Every ``status_every``-th duration after the first window, one log line::

    [aggregate]: finished 250 - 99th: 1.25ms - 95th: 0.80ms - avg: 0.41ms
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["TimerMetrics", "percentile"]


def percentile(perc: float, ordered: list[float]) -> float:
    """timer_metrics' percentile of a sorted list: index ``ceil(perc% * n + 0.5)``, clamped."""
    if not ordered:
        return 0.0
    index = math.ceil(perc / 100.0 * len(ordered) + 0.5)
    return ordered[min(index, len(ordered) - 1)]


class TimerMetrics:
    """A ring of the last ``status_every`` durations (seconds); 0 disables it."""

    def __init__(self, status_every: int, prefix: str, log: Callable[[str], None]) -> None:
        self.status_every = status_every
        self.prefix = prefix
        self.log = log
        self.timings: list[float] = []
        self.position = 0
        if 0 < status_every < 100:
            log(
                "Warning: use more than 100 status values for accurate percentiles "
                f"(configured with {status_every})"
            )

    def status(self, start: float) -> None:
        """Record the time since ``start`` (a ``time.monotonic()`` reading)."""
        if self.status_every:
            self.status_duration(time.monotonic() - start)

    def status_duration(self, duration: float) -> None:
        if not self.status_every:
            return
        self.position += 1
        looped = self.position > self.status_every
        if looped:
            self.position = 1
        if self.position > len(self.timings):
            self.timings.append(duration)
        else:
            self.timings[self.position - 1] = duration
        if looped:
            self.log(self.summary())

    def summary(self) -> str:
        ordered = sorted(self.timings)
        count = len(ordered)
        avg = sum(ordered) / count if count else 0.0
        p95, p99 = percentile(95.0, ordered), percentile(99.0, ordered)
        return (
            f"{self.prefix} finished {count} - 99th: {p99 * 1000:.2f}ms - "
            f"95th: {p95 * 1000:.2f}ms - avg: {avg * 1000:.2f}ms"
        )
