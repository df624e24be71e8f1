"""How long to wait: consumer backoff durations and reconnect delays."""

from __future__ import annotations

import random
from typing import Protocol


class BackoffStrategy(Protocol):
    """Maps a backoff level (1, 2, 3...) to a duration in seconds."""

    def calculate(self, level: int) -> float: ...


class ExponentialBackoff:
    """``multiplier * 2**level`` seconds: 2 s, 4 s, 8 s... with the default 1 s (go-nsq's)."""

    __slots__ = ("multiplier",)

    def __init__(self, multiplier: float = 1.0) -> None:
        self.multiplier = multiplier

    def calculate(self, level: int) -> float:
        return float(self.multiplier * 2**level)


class FullJitterBackoff:
    """A uniform random duration in ``[0, multiplier * 2**level)`` (go-nsq's "full_jitter")."""

    __slots__ = ("multiplier", "rng")

    def __init__(self, multiplier: float = 1.0, rng: random.Random | None = None) -> None:
        self.multiplier = multiplier
        self.rng = rng if rng is not None else random.Random()

    def calculate(self, level: int) -> float:
        return self.rng.uniform(0.0, self.multiplier * 2**level)


class ReconnectDelay:
    """Exponential delays between reconnect attempts to one nsqd: initial, 2x, 4x... up to max.

    A small random jitter (up to ``jitter`` of the delay) keeps many consumers of a restarted
    nsqd from reconnecting in lockstep.
    """

    __slots__ = ("_failures", "initial", "jitter", "maximum", "rng")

    def __init__(
        self,
        initial: float,
        maximum: float,
        jitter: float = 0.1,
        rng: random.Random | None = None,
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self.rng = rng if rng is not None else random.Random()
        self._failures = 0

    def next(self) -> float:
        """The delay before the next attempt; each call doubles the following one."""
        base = min(self.maximum, self.initial * 2**self._failures)
        self._failures += 1
        return base * (1.0 + self.jitter * self.rng.random())

    def reset(self) -> None:
        self._failures = 0

    @property
    def failures(self) -> int:
        return self._failures
