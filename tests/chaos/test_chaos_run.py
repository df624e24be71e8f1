"""A short chaos run (60 s of faults): every fault class once, then the checker's verdict and a
clean machine afterwards. Root only (network namespaces); CI runs as root."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsqpy.chaos.daemons import ClusterOptions
from nsqpy.chaos.faults import FAULT_CLASSES
from nsqpy.chaos.netns import list_netns, mounts_under
from nsqpy.chaos.runner import Run, RunOptions

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
    check, faults = report["check"], report["faults"]

    assert set(report["faults_by_class"]) == set(FAULT_CLASSES), report["faults_by_class"]
    assert [f["errors"] for f in faults if f["errors"]] == []
    assert check["acknowledged"] > 0.8 * check["attempted"] > 0
    assert check["unexpected"] == 0
    assert check["refused_but_delivered"] == 0
    # every heal was followed by deliveries from the healed node (consumers came back)
    assert all(row["seconds"] is not None for row in check["recovery"]), check["recovery"]
    # --mem-queue-size=0 --sync-every=1: nothing acknowledged is lost, also not what an nsqd
    # held in flight when it was killed -9 (in-flight messages are persisted)
    assert check["lost"] == 0, (check["lost_numbers"], check["lost_by_fault"])

    # nothing left: namespaces (and with them every veth and the bridge), processes, mounts
    assert list_netns(run.prefix) == []
    assert mounts_under(run.prefix) == []
    daemons = [*run.cluster.nsqds.values(), *run.cluster.lookupds.values()]
    assert all(d.proc is not None and d.proc.poll() is not None for d in daemons)
    assert all(w.proc.poll() is not None for w in run.workloads)
