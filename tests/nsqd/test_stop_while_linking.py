"""nsqd stops promptly whenever the stop comes, even while its replication links and its
nsqlookupd connections are being refused: a cancel that arrives as a connect fails must end
the retry loop, not be lost (with asyncio.wait_for on Python 3.11 it could be, and stop()
then waited for that loop forever)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from nsqpy.internal import lg
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options

from ..raw_v2 import free_port

TRIALS = 40
#: how long after starting the stop comes: at once, or as the first connects fail
STOP_AFTER = (0.0, 0.0005, 0.001, 0.002)
STOP_LIMIT = 5.0  # seconds; a stop takes milliseconds here


def refusing_addresses(count: int) -> list[str]:
    """Loopback addresses nothing listens on: every connect is refused at once."""
    return [f"127.0.0.1:{free_port()}" for _ in range(count)]


@pytest.mark.parametrize(
    ("peers", "lookupds"), [(2, 0), (0, 2)], ids=["replica-peers", "nsqlookupds"]
)
async def test_stop_ends_the_connects_being_refused(
    tmp_path: Path, peers: int, lookupds: int
) -> None:
    for trial in range(TRIALS):
        data = tmp_path / str(trial)
        data.mkdir()
        options = Options(
            data_path=str(data),
            tcp_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            replica_peers=refusing_addresses(peers),
            nsqlookupd_tcp_addresses=refusing_addresses(lookupds),
        )
        nsqd = NSQD(options, lg.Logger("[nsqd] ", lg.INFO, stream=io.StringIO()))
        await nsqd.start()
        await asyncio.sleep(STOP_AFTER[trial % len(STOP_AFTER)])
        async with asyncio.timeout(STOP_LIMIT):
            await nsqd.stop()
