"""A short replicated chaos run (60 s of faults): 3 nsqd in one replication group
(--replica-acks=2), every fault class once including the loss of a node with its disk, then
the checker's verdict and a clean machine afterwards. Root only (network namespaces)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsqpy.chaos.daemons import ClusterOptions
from nsqpy.chaos.faults import NODE_LOST, REPLICATED_FAULT_CLASSES
from nsqpy.chaos.runner import Run, RunOptions

from .support import assert_nothing_left, assert_valid

pytestmark = [pytest.mark.chaos, pytest.mark.root, pytest.mark.slow]

#: seed 34322's first seven faults (one of each class, node-lost on nsqd3 at 18.6 s) end
#: 58.9 s in, with msg_timeout 3 s (print make_schedule(34322, 60, ...) to see them)
SEED, DURATION, MSG_TIMEOUT = 34322, 60.0, 3.0


@pytest.mark.timeout(300)
def test_replicated_run_loses_nothing_when_a_node_and_its_disk_are_lost(tmp_path: Path):
    run = Run(
        RunOptions(
            seed=SEED,
            duration=DURATION,
            out=tmp_path,
            rate=60.0,
            settle=30.0,
            plot=False,
            cluster=ClusterOptions(
                msg_timeout=MSG_TIMEOUT, replicated=True, replica_acks=2, replica_timeout=3.0
            ),
        )
    )
    report = run.execute()
    # acks 2 on --mem-queue-size=0 --sync-every=1: every acknowledged message is fsynced on
    # two nodes, so the loss of one of them, disk included, loses nothing acknowledged
    assert_valid(report, REPLICATED_FAULT_CLASSES)
    lost_nodes = [f for f in report["faults"] if f["kind"] == NODE_LOST]
    assert lost_nodes and all(f["data_lost"] == f["target"] for f in lost_nodes)
    assert_nothing_left(run)
