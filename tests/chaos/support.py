"""What the chaos runs' tests share: the checks every finished run must pass."""

from __future__ import annotations

from typing import Any

from nsqpy.chaos.netns import list_netns, mounts_under
from nsqpy.chaos.runner import Run


def assert_valid(report: dict[str, Any], classes: tuple[str, ...]) -> None:
    """Every class injected without a fault's own error; most PUBs acknowledged; nothing
    acknowledged lost, nothing delivered that was never published or was refused."""
    check, faults = report["check"], report["faults"]
    assert set(report["faults_by_class"]) == set(classes), report["faults_by_class"]
    assert [f["errors"] for f in faults if f["errors"]] == []
    assert check["acknowledged"] > 0.8 * check["attempted"] > 0
    assert check["unexpected"] == 0
    assert check["refused_but_delivered"] == 0
    assert check["lost"] == 0, (check["lost_numbers"], check["lost_by_fault"])


def assert_nothing_left(run: Run) -> None:
    """No namespace (and with them no veth or bridge), mount or process of the run is left."""
    assert list_netns(run.prefix) == []
    assert mounts_under(run.prefix) == []
    daemons = [*run.cluster.nsqds.values(), *run.cluster.lookupds.values()]
    assert all(d.proc is not None and d.proc.poll() is not None for d in daemons)
    assert all(w.proc.poll() is not None for w in run.workloads)
