"""RDY state and backoff for one consumer, across all of its nsqd connections.

The rules (https://nsq.io/clients/building_client_libraries.html, and go-nsq's consumer.go):

* a new connection starts at RDY 1; after its first message it gets its share,
  ``max_in_flight // connections`` (at least 1, at most the nsqd's ``max_rdy_count``);
* the RDY state of a connection is re-evaluated after each message is answered, and a new
  value is sent when it is 0, when less than ~25% of the credit granted by the last RDY is left,
  or when the share changed;
* with more connections than ``max_in_flight`` a periodic redistribution moves RDY 1 from idle
  connections to random others;
* backoff: a failure sends RDY 0 everywhere for an exponentially growing time, then RDY 1 on
  one random connection tests the waters; only one result per backoff window counts; successes
  step back down until normal RDY returns.

``max_in_flight`` is a hard ceiling on messages in flight. nsqd may deliver up to a
connection's RDY *or* keep what it already delivered, so the budget counts each connection as
``max(rdy, in_flight)``, and a lowered RDY keeps counting its old value for ``settle_time``:
until nsqd has read the lower value it may still send under the old one.

Nothing here does I/O: RDY commands go out through each connection's ``send`` callback, time
comes from ``clock`` and timers from ``call_later``, so the logic can run under a fake clock.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from enum import Enum
from typing import Protocol

from .backoff import BackoffStrategy

__all__ = ["Outcome", "RdyManager", "RdyState"]


class Outcome(Enum):
    """How a message was answered, as far as backoff is concerned."""

    FINISHED = 1  # a success: steps backoff down
    REQUEUED = 2  # a failure: steps backoff up
    REQUEUED_NO_BACKOFF = 3  # neither


class Cancellable(Protocol):
    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], None]], Cancellable]


class RdyState:
    """RDY bookkeeping for one connection."""

    __slots__ = (
        "closing",
        "in_flight",
        "last_msg_time",
        "last_rdy_time",
        "max_rdy",
        "name",
        "rdy",
        "remaining",
        "send",
        "settle_until",
        "settle_value",
    )

    def __init__(self, name: str, send: Callable[[int], None], max_rdy: int, now: float) -> None:
        self.name = name
        #: writes ``RDY n`` on the connection
        self.send = send
        #: nsqd's max_rdy_count from IDENTIFY
        self.max_rdy = max_rdy
        #: the last RDY value sent
        self.rdy = 0
        #: messages received and not yet answered
        self.in_flight = 0
        #: how much of the last RDY's credit is left (decremented per message received)
        self.remaining = 0
        self.last_msg_time = now
        self.last_rdy_time = now
        #: after lowering RDY: the old value still counts against the budget until settle_until
        self.settle_value = 0
        self.settle_until = 0.0
        self.closing = False

    def __repr__(self) -> str:
        return f"<RdyState {self.name} rdy={self.rdy} in_flight={self.in_flight}>"


class RdyManager:
    """Owns the RDY counts of a consumer's connections and its backoff state."""

    def __init__(
        self,
        max_in_flight: int,
        *,
        backoff_strategy: BackoffStrategy,
        max_backoff_duration: float,
        low_rdy_idle_timeout: float,
        low_rdy_timeout: float,
        settle_time: float,
        clock: Callable[[], float],
        call_later: CallLater,
        rng: random.Random,
        log: logging.Logger,
    ) -> None:
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        self.max_in_flight = max_in_flight
        self.backoff_strategy = backoff_strategy
        self.max_backoff_duration = max_backoff_duration
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self.low_rdy_timeout = low_rdy_timeout
        self.settle_time = settle_time
        self.clock = clock
        self.call_later = call_later
        self.rng = rng
        self.log = log
        self.conns: list[RdyState] = []
        self.backoff_level = 0
        self._backoff_timer: Cancellable | None = None
        self._settle_timer: Cancellable | None = None
        self._settle_timer_at = 0.0
        self._redistribute_timer: Cancellable | None = None
        self._need_redistribute = False
        # connections whose RDY was cut short by the budget, in arrival order
        self._wanting: dict[RdyState, None] = {}
        self._closed = False

    # ------------------------------------------------------------------ queries

    @property
    def in_backoff(self) -> bool:
        return self.backoff_level > 0

    @property
    def in_backoff_timeout(self) -> bool:
        """True while RDY is held at 0 waiting for the backoff duration to pass."""
        return self._backoff_timer is not None

    def per_conn_target(self) -> int:
        """Each connection's share of max_in_flight (at least 1 while not paused)."""
        limit = self.max_in_flight
        if limit <= 0:
            return 0
        count = len(self.conns)
        if count <= 1:
            return limit
        return max(1, limit // count)

    def is_starved(self) -> bool:
        """True if any connection has (nearly) used up its RDY: time to process a batch."""
        for st in self.conns:
            if st.in_flight > 0 and st.in_flight >= st.rdy * 0.85 and not st.closing:
                return True
        return False

    @property
    def total_rdy(self) -> int:
        return sum(st.rdy for st in self.conns)

    def committed(self, st: RdyState, now: float) -> int:
        """How many messages this connection may hold in flight, at most, from now on."""
        value = st.rdy if st.rdy > st.in_flight else st.in_flight
        if st.settle_value > value and now < st.settle_until:
            value = st.settle_value
        return value

    def total_committed(self, now: float) -> int:
        return sum(self.committed(st, now) for st in self.conns)

    # ------------------------------------------------------------------ connections

    def add(self, st: RdyState) -> None:
        """A connection finished SUB: bootstrap it with RDY 1 (if the budget and backoff allow)."""
        self.conns.append(st)
        if self._closed or self.max_in_flight <= 0:
            return
        target = self.per_conn_target()
        # make room first: the others may hold more than their new share
        for other in self.conns:
            if other is not st and other.rdy > target:
                self._set(other, target)
        if self.in_backoff:
            # while backing off only one message at a time flows; a newcomer probes only when
            # no other connection is probing
            if not self.in_backoff_timeout and not any(o.rdy for o in self.conns):
                self._set(st, 1)
            return
        self._set(st, 1)

    def remove(self, st: RdyState) -> None:
        """A connection closed: forget it and give its share to the others."""
        if st not in self.conns:
            return
        self.conns.remove(st)
        self._wanting.pop(st, None)
        st.closing = True
        if self._closed:
            return
        if st.rdy > 0 and (len(self.conns) == self.max_in_flight or self.in_backoff):
            # it held RDY that the redistribution regime or a backoff probe needs elsewhere
            self._need_redistribute = True
        if self.in_backoff:
            if st.rdy > 0 and not self.in_backoff_timeout and not any(o.rdy for o in self.conns):
                self._probe()
            return
        self._rebalance()

    def close(self) -> None:
        """Stop all timers; RDY changes after this are ignored."""
        self._closed = True
        for timer in (self._backoff_timer, self._settle_timer, self._redistribute_timer):
            if timer is not None:
                timer.cancel()
        self._backoff_timer = self._settle_timer = self._redistribute_timer = None

    # ------------------------------------------------------------------ messages

    def on_message(self, st: RdyState) -> None:
        """A message arrived on ``st`` (hot path)."""
        st.in_flight += 1
        if st.remaining > 0:
            st.remaining -= 1
        st.last_msg_time = self.clock()

    def on_response(self, st: RdyState, outcome: Outcome) -> None:
        """A message is being answered; called *before* its FIN/REQ is written.

        Backoff goes first so that RDY 0 reaches nsqd before the REQ: nsqd must not hand the
        requeued message straight back to us. The message still counts as in flight here: its
        slot may only be handed to another connection once the FIN/REQ is on its way.
        """
        if not self._closed:
            self._backoff_signal(outcome)

    def after_response(self, st: RdyState) -> None:
        """Called after the FIN/REQ was written: free the slot, re-evaluate RDY."""
        st.in_flight -= 1
        if self._wanting:
            self._satisfy_wanting()
        if self._closed or st.closing or self.backoff_level or self._backoff_timer is not None:
            return
        target = self.per_conn_target()
        if target <= 0:
            return
        rdy = st.rdy
        if rdy == target and st.remaining and st.remaining * 4 >= rdy:
            return
        if rdy == 0 and len(self.conns) > self.max_in_flight:
            return  # in the redistribution regime the periodic redistribution hands out RDY
        self._set(st, target)
        # RDY is a credit in nsqd (not counted down), so an unchanged value is not re-sent;
        # the evaluation window restarts either way
        st.remaining = st.rdy

    # ------------------------------------------------------------------ max_in_flight

    def change_max_in_flight(self, max_in_flight: int) -> None:
        """Set a new ceiling and move every connection to its new share; 0 pauses."""
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        self.max_in_flight = max_in_flight
        if self._closed:
            return
        if max_in_flight == 0:
            for st in self.conns:
                self._set(st, 0)
            return
        if self.in_backoff:
            if not self.in_backoff_timeout and not any(st.rdy for st in self.conns):
                self._probe()
            return
        self._rebalance()

    def _rebalance(self) -> None:
        """Lower connections above their share first (freeing budget), then raise the rest."""
        if self.max_in_flight <= 0:
            return
        target = self.per_conn_target()
        for st in self.conns:
            if st.rdy > target:
                self._set(st, target)
        if len(self.conns) > self.max_in_flight:
            self._need_redistribute = True
            self.redistribute()
            return
        for st in self.conns:
            if st.rdy < target:
                self._set(st, target)

    # ------------------------------------------------------------------ sending RDY

    def _set(self, st: RdyState, count: int) -> int:
        """Send ``RDY count`` to ``st`` if the budget allows, else as much as it allows.

        Returns the RDY value now in force on the connection.
        """
        if st.closing:
            return st.rdy
        if count > st.max_rdy:
            count = st.max_rdy
        now = self.clock()
        if count > 0:
            allowed = self.max_in_flight
            for other in self.conns:
                if other is not st:
                    allowed -= self.committed(other, now)
            if count > allowed:
                count = allowed if allowed > 0 else 0
                if len(self.conns) <= self.max_in_flight:
                    self._wanting[st] = None  # retried when the budget frees up
                else:
                    self._need_redistribute = True
            else:
                self._wanting.pop(st, None)
        else:
            self._wanting.pop(st, None)
        if count == st.rdy:
            return count
        if count < st.rdy and self.settle_time > 0:
            old = st.rdy
            if now < st.settle_until and st.settle_value > old:
                old = st.settle_value
            st.settle_value = old
            st.settle_until = now + self.settle_time
            self._schedule_settle_check(st.settle_until)
        st.rdy = count
        st.remaining = count
        if count > 0:
            st.last_rdy_time = now
        st.send(count)
        return count

    def _satisfy_wanting(self) -> None:
        if self._closed or self.backoff_level or self._backoff_timer is not None:
            return
        if self.max_in_flight <= 0:
            self._wanting.clear()
            return
        now = self.clock()
        if self.total_committed(now) >= self.max_in_flight:
            return
        target = self.per_conn_target()
        for st in list(self._wanting):
            if st.rdy >= target or st.closing:
                self._wanting.pop(st, None)
                continue
            self._set(st, target)

    def _schedule_settle_check(self, when: float) -> None:
        if self._closed:
            return
        if self._settle_timer is not None:
            if self._settle_timer_at <= when:
                return
            self._settle_timer.cancel()
        self._settle_timer_at = when
        self._settle_timer = self.call_later(max(0.0, when - self.clock()), self._on_settled)

    def _on_settled(self) -> None:
        self._settle_timer = None
        now = self.clock()
        pending = [st.settle_until for st in self.conns if st.settle_until > now]
        if pending:
            self._schedule_settle_check(min(pending))
        self._satisfy_wanting()

    # ------------------------------------------------------------------ backoff

    def _backoff_signal(self, outcome: Outcome) -> None:
        if self._backoff_timer is not None:
            return  # only one result counts per backoff window
        level = self.backoff_level
        updated = False
        if outcome is Outcome.FINISHED:
            if level > 0:
                level -= 1
                updated = True
        elif (
            outcome is Outcome.REQUEUED
            and self.backoff_strategy.calculate(level + 1) <= self.max_backoff_duration
        ):
            level += 1
            updated = True
        self.backoff_level = level

        if level == 0:
            if updated:
                self.log.warning("exiting backoff, returning all to RDY %d", self.per_conn_target())
                self._rebalance()
            return
        # start or continue a backoff window: RDY 0 everywhere, then probe
        duration = min(self.backoff_strategy.calculate(level), self.max_backoff_duration)
        self.log.warning(
            "backing off for %.3fs (backoff level %d), setting all to RDY 0", duration, level
        )
        for st in self.conns:
            self._set(st, 0)
        self._backoff_timer = self.call_later(duration, self._resume)

    def _resume(self) -> None:
        """The backoff window expired: let one message through on one random connection."""
        self._backoff_timer = None
        if self._closed:
            return
        self._probe()

    def _probe(self) -> None:
        if self.max_in_flight <= 0:
            return  # paused: change_max_in_flight probes when resumed
        candidates = [st for st in self.conns if not st.closing]
        if not candidates:
            return  # the next connection to be added probes
        choice = candidates[self.rng.randrange(len(candidates))]
        self.log.warning("(%s) backoff timeout expired, sending RDY 1", choice.name)
        if self._set(choice, 1) == 0:
            # a lowered RDY elsewhere has not settled yet: try again when it has
            now = self.clock()
            wait = max((st.settle_until - now for st in self.conns), default=0.0)
            self._wanting.pop(choice, None)
            self._backoff_timer = self.call_later(max(wait, 0.001), self._resume)

    # ------------------------------------------------------------------ redistribution

    def start_redistribution(self, interval: float) -> None:
        """Run :meth:`redistribute` every ``interval`` seconds until :meth:`close`."""

        def tick() -> None:
            if self._closed:
                return
            self.redistribute()
            self._redistribute_timer = self.call_later(interval, tick)

        self._redistribute_timer = self.call_later(interval, tick)

    def redistribute(self) -> None:
        """Move RDY 1 between connections when not all of them can hold RDY at once.

        That is when there are more connections than max_in_flight, or while backing off with
        several connections: idle holders give up their RDY and random others receive it, so a
        connection whose nsqd has messages is eventually found.
        """
        if self._closed or self._backoff_timer is not None or not self.conns:
            return
        if self.max_in_flight <= 0:
            return
        count = len(self.conns)
        if count > self.max_in_flight or (self.in_backoff and count > 1):
            self._need_redistribute = True
        if not self._need_redistribute:
            return
        self._need_redistribute = False

        now = self.clock()
        for st in self.conns:
            if st.rdy > 0 and (
                now - st.last_msg_time > self.low_rdy_idle_timeout
                or now - st.last_rdy_time > self.low_rdy_timeout
            ):
                self.log.debug("(%s) idle connection, giving up RDY", st.name)
                self._set(st, 0)

        limit = 1 if self.in_backoff else self.max_in_flight
        available = limit - self.total_committed(now)
        if available <= 0:
            # everything is held by messages in flight: take RDY from one of those holders so a
            # later round can hand it to someone else instead of staying pinned
            holders = [st for st in self.conns if st.in_flight and st.rdy]
            if holders:
                self._set(holders[self.rng.randrange(len(holders))], 0)
            return
        candidates = [st for st in self.conns if not st.rdy and not st.in_flight]
        while candidates and available > 0:
            st = candidates.pop(self.rng.randrange(len(candidates)))
            self.log.debug("(%s) redistributing RDY", st.name)
            if self._set(st, 1):
                available -= 1
