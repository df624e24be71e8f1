"""Graceful drain before shutdown (nsqpy addition, ``--drain-timeout``; docs/beyond-go.md).

On SIGTERM with a drain timeout, nsqd first stops taking publishes (PUB/MPUB/DPUB answer
``E_<CMD>_FAILED ... draining``, HTTP /pub and /mpub 503 ``DRAINING``), leaves nsqlookupd
(closes its connections and does not reconnect, so lookupd drops the node from ``/nodes`` and
every topic and channel from ``/lookup``: consumers stop discovering it), answers ``/ping`` with
503 ``DRAINING`` for readiness probes, and keeps delivering until every channel is empty
(depth + in flight + deferred == 0) or the timeout passes. Then the usual shutdown persists
whatever is left.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..nsqd import NSQD

#: How often the channels are checked for emptiness while draining.
POLL_INTERVAL = 0.05


def start_draining(nsqd: NSQD) -> None:
    """Refuse publishes and leave nsqlookupd (idempotent)."""
    if nsqd.draining:
        return
    nsqd.draining = True
    nsqd.logger.info("NSQ: draining - refusing publishes, leaving nsqlookupd")
    if nsqd.lookup is not None:
        # A closed connection is how lookupd learns a node is gone: it removes the node and
        # all its registrations (Go's nsqlookupd does the same). UNREGISTERs alone would leave
        # the node listed in /nodes, with no topics, for the whole drain.
        nsqd.lookup.leave()


def remaining(nsqd: NSQD) -> int:
    """Messages still to deliver: every channel's depth, in flight and deferred, plus the
    backlog of topics that have channels to deliver it to."""
    total = 0
    for topic in nsqd.topics.values():
        if not topic.channels:
            continue  # nobody to deliver to: it is persisted at shutdown
        total += topic.depth()
        for channel in topic.channels.values():
            total += channel.depth() + len(channel.in_flight) + len(channel.deferred)
    return total


async def drain(nsqd: NSQD, timeout: float, interrupt: asyncio.Event | None = None) -> bool:
    """Drain for up to ``timeout`` seconds (or until ``interrupt`` is set); True if every
    channel emptied. The caller then stops nsqd as usual."""
    start_draining(nsqd)
    deadline = time.monotonic() + timeout
    while True:
        left = remaining(nsqd)
        if left == 0:
            nsqd.logger.info("NSQ: drained - all channels empty")
            return True
        if time.monotonic() >= deadline or (interrupt is not None and interrupt.is_set()):
            nsqd.logger.warn(f"NSQ: drain ended with {left} messages left (persisted)")
            return False
        await asyncio.sleep(POLL_INTERVAL)
