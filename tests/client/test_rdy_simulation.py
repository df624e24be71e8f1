"""RdyManager under a simulated clock and network: the max_in_flight ceiling holds at nsqd.

Each connection has a one-way latency; nsqd delivers while its in-flight count is below the last
RDY it *received*, and learns of FINs only when they arrive. Connections come and go, handlers
take random times and sometimes fail (backoff). The total in flight as nsqd counts it must never
exceed max_in_flight: that is what the settle time and the ``max(rdy, in_flight)`` budget buy.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.client.backoff import ExponentialBackoff
from nsqpy.client.rdy import Outcome, RdyManager, RdyState

LAG = 0.002


class Sim:
    def __init__(self) -> None:
        self.now = 0.0
        self.events: list[tuple[float, int, Callable[[], None], list[bool]]] = []
        self.seq = 0

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Handle:
        cancelled = [False]
        self.seq += 1
        heapq.heappush(self.events, (self.now + delay, self.seq, callback, cancelled))
        return _Handle(cancelled)

    def run_until(self, end: float, limit: int = 200_000) -> None:
        steps = 0
        while self.events and self.events[0][0] <= end and steps < limit:
            when, _, callback, cancelled = heapq.heappop(self.events)
            self.now = when
            if not cancelled[0]:
                callback()
            steps += 1
        self.now = end


@dataclass
class _Handle:
    cancelled: list[bool]

    def cancel(self) -> None:
        self.cancelled[0] = True


def _bind(func: Callable[[ServerConn], None], server: ServerConn) -> Callable[[], None]:
    return lambda: func(server)


@dataclass
class ServerConn:
    rdy: int = 0
    in_flight: int = 0
    alive: bool = True
    client: RdyState | None = None
    pending: list[int] = field(default_factory=list)


def simulate(seed: int, max_in_flight: int, conns: int, fail_rate: float) -> int:
    rng = random.Random(seed)
    sim = Sim()
    manager = RdyManager(
        max_in_flight,
        backoff_strategy=ExponentialBackoff(0.005),
        max_backoff_duration=0.05,
        low_rdy_idle_timeout=0.05,
        low_rdy_timeout=0.2,
        settle_time=3 * LAG,
        clock=lambda: sim.now,
        call_later=sim.call_later,
        rng=rng,
        log=logging.getLogger("rdy-sim"),
    )
    manager.start_redistribution(0.02)
    servers: list[ServerConn] = []
    delivered = 0
    worst = 0

    def total_in_flight() -> int:
        return sum(s.in_flight for s in servers if s.alive)

    def pump(server: ServerConn) -> None:
        nonlocal delivered, worst
        while server.alive and server.in_flight < server.rdy:
            server.in_flight += 1
            delivered += 1
            worst = max(worst, total_in_flight())
            assert total_in_flight() <= max_in_flight, (sim.now, [vars(s) for s in servers])
            sim.call_later(LAG, _bind(receive, server))

    def receive(server: ServerConn) -> None:
        state = server.client
        if not server.alive or state is None:
            return
        manager.on_message(state)
        sim.call_later(rng.uniform(0.0, 0.01), lambda: respond(server))

    def respond(server: ServerConn) -> None:
        state = server.client
        if not server.alive or state is None:
            return
        outcome = Outcome.REQUEUED if rng.random() < fail_rate else Outcome.FINISHED
        manager.on_response(state, outcome)
        sim.call_later(LAG, lambda: fin_arrives(server))
        manager.after_response(state)

    def fin_arrives(server: ServerConn) -> None:
        if server.alive:
            server.in_flight -= 1
            pump(server)

    def rdy_arrives(server: ServerConn, count: int) -> None:
        if server.alive:
            server.rdy = count
            pump(server)

    def connect() -> None:
        server = ServerConn()

        def send_rdy(count: int) -> None:
            sim.call_later(LAG, lambda: rdy_arrives(server, count))

        state = RdyState(f"nsqd{len(servers)}", send_rdy, 2500, sim.now)
        server.client = state
        servers.append(server)
        manager.add(state)

    def disconnect() -> None:
        alive = [s for s in servers if s.alive]
        if len(alive) <= 1:
            return
        server = rng.choice(alive)
        server.alive = False  # its in-flight messages go back to the queue
        assert server.client is not None
        manager.remove(server.client)

    for _ in range(conns):
        connect()
    for _ in range(20):
        sim.run_until(sim.now + rng.uniform(0.01, 0.1))
        action = rng.random()
        if action < 0.2:
            connect()
        elif action < 0.35:
            disconnect()
    manager.close()
    return delivered


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    max_in_flight=st.integers(1, 12),
    conns=st.integers(1, 5),
    fail_rate=st.sampled_from([0.0, 0.05, 0.3]),
)
def test_in_flight_at_nsqd_never_exceeds_max_in_flight(
    seed: int, max_in_flight: int, conns: int, fail_rate: float
) -> None:
    delivered = simulate(seed, max_in_flight, conns, fail_rate)
    assert delivered > 0  # messages did flow


def test_without_settle_time_the_ceiling_can_be_crossed() -> None:
    """The settle time is what the test above depends on: without it, lowering RDY on one
    nsqd and raising it on another lets both deliver for a moment."""

    original = RdyManager.__init__

    def no_settle(self: RdyManager, *args: object, **kwargs: object) -> None:
        kwargs["settle_time"] = 0.0
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    RdyManager.__init__ = no_settle  # type: ignore[method-assign]
    try:
        with pytest.raises(AssertionError):
            for seed in range(200):
                simulate(seed, 2, 3, 0.0)
    finally:
        RdyManager.__init__ = original  # type: ignore[method-assign]
