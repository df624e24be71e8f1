"""gnsq (gevent) and nsqjs (node) against one nsqpy nsqd, each through its script in clients/.

Each client publishes with its own producer (gnsq ``Producer``, nsqjs ``Writer``): three
bodies with a PUB each and three in one MPUB. Its reader, connected straight to nsqd, FINs
every delivery but the first one of one body, which it REQs (no delay, no backoff): that body
must come back with attempts 2 and every body be finished once.
"""

from __future__ import annotations

import pytest

from nsqpy.testing import DaemonProcess

from ..raw_v2 import unique
from .helpers import http_post, tcp_address, topic_stats, wait_channel
from .script_clients import KINDS, Delivery, run_script

PUB_BODIES = ("pub-0", "pub-1", "pub-2")
MPUB_BODIES = ("mpub-0", "mpub-1", "mpub-2")
REQUEUED = "pub-1"


async def publish(kind: str, nsqd: DaemonProcess, topic: str, *extra: str) -> None:
    publisher = await run_script(
        kind, "publish", "--nsqd", tcp_address(nsqd), "--topic", topic, *extra
    )
    assert await publisher.wait(timeout=15.0) == 0, publisher.explain()


@pytest.mark.parametrize("kind", KINDS)
async def test_publish_then_fin_and_one_req(kind: str, nsqd: DaemonProcess) -> None:
    topic, channel = unique(kind), "readers"
    # the channel exists before the first publish, so it gets every message
    http_post(nsqd, "/topic/create", topic=topic)
    http_post(nsqd, "/channel/create", topic=topic, channel=channel)
    await publish(kind, nsqd, topic, *PUB_BODIES)
    await publish(kind, nsqd, topic, "--mpub", *MPUB_BODIES)
    assert topic_stats(nsqd, topic)["message_count"] == len(PUB_BODIES) + len(MPUB_BODIES)

    everything = [*PUB_BODIES, *MPUB_BODIES]
    reader = await run_script(
        kind,
        "read",
        *("--nsqd", tcp_address(nsqd), "--topic", topic, "--channel", channel),
        *("--count", str(len(everything)), "--timeout", "20", "--requeue", REQUEUED),
    )
    try:
        assert await reader.wait(timeout=30.0) == 0, reader.explain()
    finally:
        await reader.stop()

    received = sorted(reader.deliveries, key=lambda d: (d.body, d.attempts))
    expected = sorted(
        [Delivery(body.encode(), 1, "fin") for body in everything if body != REQUEUED]
        + [Delivery(REQUEUED.encode(), 1, "req"), Delivery(REQUEUED.encode(), 2, "fin")],
        key=lambda d: (d.body, d.attempts),
    )
    assert received == expected, reader.explain()
    await wait_channel(nsqd, topic, channel, depth=0, in_flight_count=0, requeue_count=1)
