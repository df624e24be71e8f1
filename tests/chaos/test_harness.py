"""The harness's parts that need no cluster: the checker, the schedule, the refusal without
root, and the clean-up of a crashed run's leftovers."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsqpy.chaos.__main__ import fault_classes
from nsqpy.chaos.__main__ import main as chaos_main
from nsqpy.chaos.checker import check
from nsqpy.chaos.daemons import ClusterOptions, nsqd_args
from nsqpy.chaos.faults import (
    FAULT_CLASSES,
    NODE_LOST,
    REPLICATED_FAULT_CLASSES,
    empty_directory,
    make_schedule,
)
from nsqpy.chaos.netns import NAME_PREFIX, list_netns, netns_pids
from nsqpy.chaos.report import build_report, format_text
from nsqpy.chaos.runner import RunOptions
from nsqpy.chaos.spark import check_archive
from nsqpy.chaos.workload import classify
from nsqpy.client import ConnectionClosedError, NoConnectionsError, ServerError


def pub(n: int, outcome: str, t: float = 0.0) -> list[dict]:
    return [{"op": "invoke", "n": n, "t": t}, {"op": "pub", "n": n, "outcome": outcome, "t": t}]


def recv(n: int | None, t: float = 1.0, nsqd: str = "a:1", body: str | None = None) -> dict:
    return {"op": "recv", "n": n, "t": t, "nsqd": nsqd, "body": body}


def test_checker_counts_lost_duplicated_unexpected_and_outcomes():
    pubs = pub(1, "ok") + pub(2, "ok") + pub(3, "refused") + pub(4, "unknown") + pub(5, "ok")
    pubs.append({"op": "invoke", "n": 6, "t": 0.0})  # stopped mid-call: unknown
    recvs = [recv(1), recv(1), recv(3), recv(4), recv(5), recv(99), recv(None, body="junk")]
    result = check(pubs, recvs)
    assert (result.attempted, result.acknowledged, result.refused, result.unknown) == (6, 3, 1, 2)
    assert result.lost == 1 and result.lost_numbers == [2]
    assert result.duplicated == 1
    assert result.unexpected == 2 and result.unexpected_sample == [99, "junk"]
    assert result.refused_but_delivered == 1
    assert result.unknown_delivered == 1
    assert result.delivered_unique == 4 and result.deliveries == 7
    assert not result.valid
    assert check(pub(1, "ok"), [recv(1)]).valid
    assert not check(pub(1, "refused"), []).valid  # nothing acknowledged: nothing tested


def test_recovery_is_measured_from_the_heal_to_the_healed_nsqds_next_delivery():
    faults = [
        {"kind": "kill-nsqd", "target": "nsqd1", "address": "a:1", "healed": 10.0},
        {"kind": "kill-lookupd", "target": "lookupd1", "address": "", "healed": 20.0},
        {"kind": "pause-nsqd", "target": "nsqd2", "address": "b:1", "healed": 30.0},
    ]
    recvs = [recv(1, 11.0, "b:1"), recv(2, 12.5, "a:1"), recv(3, 20.25, "b:1")]
    rows = check(pub(1, "ok") + pub(2, "ok") + pub(3, "ok"), recvs, faults).recovery
    assert [r["seconds"] for r in rows] == [2.5, 0.25, None]


def test_schedule_is_seeded_and_covers_every_class_first():
    nsqds, lookupds = ["nsqd1", "nsqd2", "nsqd3"], ["lookupd1", "lookupd2"]
    first = make_schedule(7, 300, nsqds, lookupds, 3.0)
    assert first == make_schedule(7, 300, nsqds, lookupds, 3.0)
    assert first != make_schedule(8, 300, nsqds, lookupds, 3.0)
    assert {f.kind for f in first[: len(FAULT_CLASSES)]} == set(FAULT_CLASSES)
    for fault in first:
        assert fault.target in (lookupds if fault.kind == "kill-lookupd" else nsqds)
        assert fault.at + fault.hold <= 300
        if fault.kind == "pause-nsqd":
            assert fault.hold > 3.0  # longer than msg_timeout
    assert all(b.at >= a.at + a.hold for a, b in itertools.pairwise(first))


def test_publish_outcomes_are_refused_only_when_nothing_was_sent():
    assert classify(TimeoutError()) == "unknown"
    assert classify(ServerError(b"E_PUB_FAILED nope")) == "refused"
    never_connected = NoConnectionsError("none")
    never_connected.__cause__ = OSError("connection refused")
    assert classify(never_connected) == "refused"
    closed_under_it = NoConnectionsError("none")
    closed_under_it.__cause__ = ConnectionClosedError("closed")
    assert classify(closed_under_it) == "unknown"


def test_without_root_it_says_why_and_exits_2(monkeypatch, capsys):
    # not a real unprivileged process: CI's checkout may not be readable by another user
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert chaos_main(["--duration", "1"]) == 2
    assert "needs root" in capsys.readouterr().err
    assert chaos_main(["cleanup"]) == 2


@pytest.mark.parametrize(
    "args", [["--duration", "-1"], ["--rate", "0"], ["--publishers", "0"], ["--settle", "-1"]]
)
def test_bad_run_arguments_are_refused_before_anything_starts(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        chaos_main(args)
    assert exit_info.value.code == 2
    assert args[0] in capsys.readouterr().err


@pytest.mark.chaos
@pytest.mark.root
def test_cleanup_removes_a_crashed_runs_namespaces_and_processes():
    prefix = f"{NAME_PREFIX}test{time.monotonic_ns() % 100000}-"
    netns = f"{prefix}nsqd1"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", netns, "sleep", "300"])
    try:
        deadline = time.monotonic() + 5
        while not netns_pids(netns) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert netns_pids(netns) == [sleeper.pid]
        out = subprocess.run(
            [sys.executable, "-m", "nsqpy.chaos", "cleanup", "--prefix", prefix],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert sleeper.wait(10) == -9
        assert list_netns(prefix) == []
        assert f"netns {netns}" in out
    finally:
        sleeper.kill()
        subprocess.run(["ip", "netns", "del", netns], check=False, capture_output=True)


def test_lost_messages_are_put_down_to_the_fault_around_their_acknowledgement():
    faults = [
        {"kind": "disk-full", "target": "nsqd1", "started": 100.0, "healed": 105.0},
        {"kind": "kill-nsqd", "target": "nsqd2", "started": 108.0, "healed": 112.0},
    ]
    pubs = pub(1, "ok", 103.0) + pub(2, "ok", 106.0) + pub(3, "ok", 50.0) + pub(4, "ok", 110.0)
    result = check(pubs, [], faults)
    # 1: during the full disk (not the kill that began within 10 s); 2: just before the kill
    assert result.lost_by_fault == {"disk-full": 1, "kill-nsqd": 2, "none": 1}


def test_the_archive_is_deduplicated_on_nsqd_and_id_and_compared_with_the_acknowledged():
    rows = [
        {"nsqd": "a:1", "id": "01", "body": b"1"},
        {"nsqd": "a:1", "id": "01", "body": b"1"},  # a replayed batch: the same message
        {"nsqd": "b:1", "id": "01", "body": b"2"},  # same id on another nsqd: another message
        {"nsqd": "b:1", "id": "02", "body": b"2"},  # published twice (a retried PUB)
        {"nsqd": "a:1", "id": "03", "body": b"7"},  # never published
    ]
    result = check_archive(rows, acked={1, 2, 3}, invoked={1, 2, 3, 4})
    assert result["rows"] == 5 and result["rows_after_dedup"] == 4
    assert result["same_id_twice"] == 1
    assert result["numbers_archived_twice"] == 1
    assert result["missing_acknowledged"] == 1 and result["missing_sample"] == [3]
    assert result["unexpected"] == 1
    assert not result["equals_acknowledged"]
    assert check_archive(rows[:3], acked={1, 2}, invoked={1, 2})["equals_acknowledged"]


def test_a_replicated_schedule_covers_node_lost_in_its_first_round():
    nsqds, lookupds = ["nsqd1", "nsqd2", "nsqd3"], ["lookupd1", "lookupd2"]
    schedule = make_schedule(34322, 60, nsqds, lookupds, 3.0, REPLICATED_FAULT_CLASSES)
    assert (*FAULT_CLASSES, NODE_LOST) == REPLICATED_FAULT_CLASSES
    assert [f.kind for f in schedule] == [
        "kill-nsqd",
        "kill-lookupd",
        "node-lost",
        "disk-full",
        "degrade-link",
        "partition-nsqd",
        "pause-nsqd",
    ]
    assert all(f.target in nsqds for f in schedule if f.kind == NODE_LOST)
    assert schedule[-1].at + schedule[-1].hold <= 60
    # the classes given are the classes drawn: no node-lost unless asked for
    assert NODE_LOST not in {f.kind for f in make_schedule(3, 600, nsqds, lookupds, 3.0)}
    only = make_schedule(3, 120, nsqds, lookupds, 3.0, (NODE_LOST, "kill-nsqd"))
    assert {f.kind for f in only} == {NODE_LOST, "kill-nsqd"}


def test_the_schedule_classes_follow_replication_and_faults():
    assert RunOptions().schedule_classes() == FAULT_CLASSES
    replicated = RunOptions(cluster=ClusterOptions(replicated=True))
    assert replicated.schedule_classes() == REPLICATED_FAULT_CLASSES
    go = RunOptions(
        cluster=ClusterOptions(nsqd_bin="/go/nsqd"), fault_classes=REPLICATED_FAULT_CLASSES
    )
    assert go.schedule_classes() == REPLICATED_FAULT_CLASSES
    assert RunOptions(spark=True).schedule_classes() == (*FAULT_CLASSES, "kill-spark")


def test_replicated_nsqds_peer_with_each_other_under_their_own_node_ids():
    options = ClusterOptions(replicated=True, replica_acks=2, replica_timeout=3.0)
    everyone = ["198.18.0.11:4150", "198.18.0.12:4150", "198.18.0.13:4150"]
    lookupds = ["198.18.0.21:4160"]
    args = nsqd_args(options, 1, "198.18.0.12", Path("/d/nsqd2"), lookupds, everyone)
    assert args[:7] == [
        "--tcp-address=198.18.0.12:4150",
        "--http-address=198.18.0.12:4151",
        "--broadcast-address=198.18.0.12",
        "--data-path=/d/nsqd2",
        "--mem-queue-size=0",
        "--sync-every=1",
        "--msg-timeout=5000ms",
    ]
    assert args[7:] == [
        "--lookupd-tcp-address=198.18.0.21:4160",
        "--node-id=2",
        "--replica-peer=198.18.0.11:4150",
        "--replica-peer=198.18.0.13:4150",
        "--replica-acks=2",
        "--replica-timeout=3000ms",
    ]
    ids = {
        a
        for i, host in enumerate(["198.18.0.11", "198.18.0.12", "198.18.0.13"])
        for a in nsqd_args(options, i, host, Path("/d"), lookupds, everyone)
        if a.startswith("--node-id=")
    }
    assert ids == {"--node-id=1", "--node-id=2", "--node-id=3"}
    plain = nsqd_args(ClusterOptions(), 1, "198.18.0.12", Path("/d"), lookupds, everyone)
    assert not [a for a in plain if a.startswith(("--replica-", "--node-id"))]


def test_replicated_with_another_nsqd_binary_is_refused(capsys):
    with pytest.raises(ValueError, match="no --replica-\\* flags"):
        ClusterOptions(replicated=True, nsqd_bin="/work/go-nsq/bin/nsqd")
    with pytest.raises(SystemExit) as exit_info:
        chaos_main(["--replicated", "--nsqd-bin", "/work/go-nsq/bin/nsqd"])
    assert exit_info.value.code == 2
    assert "--replicated needs nsqpy's nsqd" in capsys.readouterr().err


def test_faults_names_known_classes_only(capsys):
    assert fault_classes("node-lost, kill-nsqd,node-lost") == ("kill-nsqd", NODE_LOST)
    # Go's daemons given the replicated classes get the replicated run's schedule
    listed = fault_classes(",".join(reversed(REPLICATED_FAULT_CLASSES)))
    assert listed == REPLICATED_FAULT_CLASSES
    go = RunOptions(cluster=ClusterOptions(nsqd_bin="/go/nsqd"), fault_classes=listed)
    ours = RunOptions(cluster=ClusterOptions(replicated=True))
    nsqds, lookupds = ["nsqd1", "nsqd2", "nsqd3"], ["lookupd1", "lookupd2"]
    assert make_schedule(5, 300, nsqds, lookupds, 5.0, go.schedule_classes()) == make_schedule(
        5, 300, nsqds, lookupds, 5.0, ours.schedule_classes()
    )
    with pytest.raises(SystemExit):
        chaos_main(["--faults", "kill-nsqd,lose-everything"])
    assert "unknown fault class lose-everything" in capsys.readouterr().err


def test_a_lost_node_keeps_its_mount_point_and_nothing_under_it(tmp_path: Path):
    (tmp_path / "topic.diskqueue.meta.dat").write_bytes(b"x" * 10)
    (tmp_path / "replica").mkdir()
    (tmp_path / "replica" / "a+1.replica").write_bytes(b"y" * 5)
    assert empty_directory(tmp_path) == (2, 15)
    assert tmp_path.is_dir() and list(tmp_path.iterdir()) == []


def test_lost_counts_a_message_whose_node_lost_its_disk_and_duplicates_apart():
    faults = [
        {
            "kind": NODE_LOST,
            "target": "nsqd3",
            "address": "c:1",
            "data_lost": "nsqd3",
            "started": 100.0,
            "healed": 105.0,
        }
    ]
    # 1: acknowledged by nsqd3 just before its loss, never delivered; 2: taken over by another
    # node and delivered by both; 3: delivered twice by one node
    pubs = pub(1, "ok", 99.0) + pub(2, "ok", 99.0) + pub(3, "ok", 99.0)
    recvs = [recv(2, 99.5, "c:1"), recv(2, 104.0, "a:1"), recv(3, 99.5), recv(3, 99.9)]
    result = check(pubs, recvs, faults)
    assert result.lost_numbers == [1] and result.lost_by_fault == {NODE_LOST: 1}
    assert (result.duplicated, result.duplicated_across_nsqds) == (2, 1)
    assert result.recovery == [
        {"kind": NODE_LOST, "target": "nsqd3", "data_lost": "nsqd3", "seconds": None}
    ]
    meta = {
        "prefix": "p",
        "seed": 1,
        "duration": 60.0,
        "started": 90.0,
        "daemons": "nsqpy",
        "nsqd_flags": [],
        "link_faults": "tbf",
        "replication": "every nsqd peers with the others",
    }
    text = format_text(build_report(meta, faults, result))
    assert (
        "data lost (node-lost: killed, data path emptied, restarted empty): nsqd3 at +10.0s" in text
    )
    assert "duplicated 2 (1 by two or more nsqds)" in text
    assert "lost (acknowledged, never delivered): 1 e.g. [1]" in text
    assert "node-lost       nsqd3     never  (data lost: nsqd3)" in text
