"""Choosing a destination among several (bitly/go-hostpool, as nsq_to_nsq and nsq_to_http use it).

:class:`HostPool` is go-hostpool's standard pool: hosts in turn, skipping one marked failed
until its retry time (30 s, doubling up to 15 min); when all are failed, all are reset.
:class:`EpsilonGreedyHostPool` prefers the healthy host with the best recent response time and
explores another one with probability epsilon (a simpler scorer than go-hostpool's decaying
buckets, with the same preference for fast, healthy hosts).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

__all__ = ["EpsilonGreedyHostPool", "HostPool", "HostPoolResponse"]

INITIAL_RETRY_DELAY = 30.0
MAX_RETRY_INTERVAL = 900.0


class _Host:
    __slots__ = ("dead", "host", "next_retry", "retry_delay", "score")

    def __init__(self, host: str) -> None:
        self.host = host
        self.dead = False
        self.retry_delay = INITIAL_RETRY_DELAY
        self.next_retry = 0.0
        #: smoothed response time in seconds (epsilon-greedy); None until the first success
        self.score: float | None = None


class HostPoolResponse:
    """The host a request goes to; :meth:`mark` it with the outcome once (None = success)."""

    __slots__ = ("_marked", "host", "pool", "started")

    def __init__(self, pool: HostPool, host: str) -> None:
        self.pool = pool
        self.host = host
        self.started = pool.clock()
        self._marked = False

    def mark(self, error: BaseException | str | None) -> None:
        if self._marked:
            return
        self._marked = True
        if error is None:
            self.pool.mark_success(self)
        else:
            self.pool.mark_failed(self)


class HostPool:
    def __init__(self, hosts: Sequence[str], clock: Callable[[], float] = time.monotonic) -> None:
        if not hosts:
            raise ValueError("a host pool needs at least one host")
        self.clock = clock
        self._hosts = [_Host(h) for h in hosts]
        self._by_name = {h.host: h for h in self._hosts}
        self._next = 0

    @property
    def hosts(self) -> list[str]:
        return [h.host for h in self._hosts]

    def get(self) -> HostPoolResponse:
        return HostPoolResponse(self, self._round_robin().host)

    def _round_robin(self) -> _Host:
        now = self.clock()
        count = len(self._hosts)
        for i in range(count):
            index = (i + self._next) % count
            entry = self._hosts[index]
            if not entry.dead:
                self._next = index + 1
                return entry
            if entry.next_retry < now:  # give a failed host another chance, then wait longer
                entry.retry_delay = min(entry.retry_delay * 2, MAX_RETRY_INTERVAL)
                entry.next_retry = now + entry.retry_delay
                self._next = index + 1
                return entry
        for entry in self._hosts:  # every host failed: start afresh
            entry.dead = False
        self._next = 0
        return self._hosts[0]

    def mark_success(self, response: HostPoolResponse) -> None:
        self._by_name[response.host].dead = False

    def mark_failed(self, response: HostPoolResponse) -> None:
        entry = self._by_name[response.host]
        if not entry.dead:
            entry.dead = True
            entry.retry_delay = INITIAL_RETRY_DELAY
            entry.next_retry = self.clock() + entry.retry_delay


class EpsilonGreedyHostPool(HostPool):
    """Mostly the fastest healthy host; with probability ``epsilon`` another healthy one."""

    def __init__(
        self,
        hosts: Sequence[str],
        epsilon: float = 0.3,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(hosts, clock)
        self.epsilon = epsilon
        self.rng = rng if rng is not None else random.Random()

    def get(self) -> HostPoolResponse:
        now = self.clock()
        healthy = [h for h in self._hosts if not h.dead or h.next_retry < now]
        if not healthy:
            return super().get()
        unscored = [h for h in healthy if h.score is None]
        if unscored:  # measure every host before judging
            choice = unscored[0]
        elif self.rng.random() < self.epsilon:
            choice = self.rng.choice(healthy)
        else:
            choice = min(healthy, key=lambda h: h.score or 0.0)
        if choice.dead:  # a retry of a failed host: push its next retry out
            choice.retry_delay = min(choice.retry_delay * 2, MAX_RETRY_INTERVAL)
            choice.next_retry = now + choice.retry_delay
        return HostPoolResponse(self, choice.host)

    def mark_success(self, response: HostPoolResponse) -> None:
        entry = self._by_name[response.host]
        entry.dead = False
        took = max(self.clock() - response.started, 0.0)
        entry.score = took if entry.score is None else 0.8 * entry.score + 0.2 * took

    def mark_failed(self, response: HostPoolResponse) -> None:
        super().mark_failed(response)
        self._by_name[response.host].score = None
