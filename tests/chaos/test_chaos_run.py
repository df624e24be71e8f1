"""A short chaos run (60 s of faults): every fault class once, then the checker's verdict and a
clean machine afterwards. Root only (network namespaces); CI runs as root."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsqpy.chaos.daemons import ClusterOptions
from nsqpy.chaos.faults import FAULT_CLASSES
from nsqpy.chaos.runner import Run, RunOptions

from .support import assert_nothing_left, assert_valid

pytestmark = [pytest.mark.chaos, pytest.mark.root, pytest.mark.slow]

#: seed 7's first six faults (one of each class) end 54 s in, with msg_timeout 3 s
SEED, DURATION, MSG_TIMEOUT = 7, 60.0, 3.0


@pytest.mark.timeout(300)
def test_short_run_loses_nothing_and_leaves_nothing_behind(tmp_path: Path):
    run = Run(
        RunOptions(
            seed=SEED,
            duration=DURATION,
            out=tmp_path,
            rate=60.0,
            settle=25.0,
            plot=False,
            cluster=ClusterOptions(msg_timeout=MSG_TIMEOUT),
        )
    )
    report = run.execute()
    # --mem-queue-size=0 --sync-every=1: nothing acknowledged is lost, also not what an nsqd
    # held in flight when it was killed -9 (in-flight messages are persisted)
    assert_valid(report, FAULT_CLASSES)
    # every heal was followed by deliveries from the healed node (consumers came back)
    recovery = report["check"]["recovery"]
    assert all(row["seconds"] is not None for row in recovery), recovery
    assert_nothing_left(run)
