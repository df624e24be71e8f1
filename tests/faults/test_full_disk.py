"""nsqd on a small real filesystem (tmpfs) that fills up: it refuses publishes with NSQ's
error, says so in /ping and /stats, frees what its consumers finish even when the disk is full
to the last block, takes writes again by itself, and delivers every acknowledged message."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqpy.testing import DaemonProcess

from ..nsqd.nsqd_storage_support import consume_all, consume_from
from ..raw_v2 import NsqConn, channel_stats, http_ok, pub_cmd, wait_until
from .support import (
    REPEAT_INTERVAL,
    fill_disk,
    health,
    limited_nsqd,
    log_lines_since,
    log_mark,
    mounted_tmpfs,
    ping,
    publish_all,
    publish_until_refused,
    try_pub,
)

BODY_SIZE = 1024
FULL = "no space left on device"
FAULT_SECONDS = 3.0  # how long the tests keep knocking at a full disk


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "disk", "1m") as mount_point:
        yield mount_point


@pytest.fixture
def nsqd(disk: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DaemonProcess]:
    data = disk / "data"
    data.mkdir()
    with limited_nsqd(
        monkeypatch, data, "--mem-queue-size=0", "--max-bytes-per-file=65536"
    ) as daemon:
        yield daemon


def assert_no_temporary_files_after_stop(nsqd: DaemonProcess, disk: Path) -> None:
    """No failed write left its temporary file. Checked after a clean stop: while nsqd runs,
    a metadata write in progress (the periodic sync) has its temporary file for a moment."""
    assert nsqd.stop() == 0
    assert not list(disk.rglob("*.tmp")), "temporary files left behind"


def knock_while_full(nsqd: DaemonProcess, topic: str, seconds: float) -> int:
    """Keep publishing to a full disk for ``seconds`` (bounded); every PUB must be refused
    with NSQ's error. Returns how many were refused."""
    refused = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and refused < 5000:
        conn = NsqConn(nsqd.tcp_address)
        conn.send(pub_cmd(topic, b"refused" + bytes(BODY_SIZE)))
        conn.expect_error(f"E_PUB_FAILED PUB failed {FULL}")
        conn.close()
        refused += 1
    return refused


def assert_unhealthy(nsqd: DaemonProcess) -> None:
    assert ping(nsqd) == (500, f"NOK - {FULL}")
    assert health(nsqd) == f"NOK - {FULL}"


def assert_short_fault_log(lines: list[str], refused: int) -> None:
    """Hundreds of refused writes and failed syncs: a few lines, then a summary per interval."""
    failures = [line for line in lines if "ERROR" in line or "WARN" in line]
    bound = 6 * (FAULT_SECONDS / REPEAT_INTERVAL + 2)
    assert refused > 4 * bound, f"only {refused} refusals: the bound would mean nothing"
    assert len(failures) <= bound, "\n".join(failures)
    assert any("repeated" in line for line in failures), "\n".join(failures)


def test_channel_queue_full_to_the_last_block_recovers_after_a_drain(
    disk: Path, nsqd: DaemonProcess
) -> None:
    http_ok(nsqd, "POST", "/topic/create?topic=t")
    http_ok(nsqd, "POST", "/channel/create?topic=t&channel=c")
    assert ping(nsqd) == (200, "OK")

    first, error = publish_until_refused(nsqd, "t", b"first", BODY_SIZE)
    assert error == f"E_PUB_FAILED PUB failed {FULL}".encode()
    fill_disk(disk / "filler")  # not a page left: even the metadata's temporary file fails
    assert_unhealthy(nsqd)
    mark = log_mark(nsqd)
    refused = knock_while_full(nsqd, "t", FAULT_SECONDS)
    assert_unhealthy(nsqd)
    assert (channel_stats(nsqd, "t", "c") or {})["depth"] == len(first)

    # a consumer drains the channel: the finished queue files are deleted although their
    # metadata cannot be written first, which is what frees the space
    received = consume_from(nsqd, "t", "c", len(first), timeout=30.0)
    second = [b"second%06d:" % i + bytes(BODY_SIZE - 13) for i in range(len(first) // 2)]
    publish_all(nsqd, "t", second, timeout=30.0)
    assert ping(nsqd) == (200, "OK")
    assert health(nsqd) == "OK"
    assert_short_fault_log(log_lines_since(nsqd, mark), refused)

    received += consume_from(nsqd, "t", "c", len(second), timeout=30.0)
    got = Counter(m.body for m in received)
    assert got == Counter(first + second), "acknowledged messages lost or duplicated"
    assert (channel_stats(nsqd, "t", "c") or {})["depth"] == 0
    assert_no_temporary_files_after_stop(nsqd, disk)


def test_topic_and_channel_on_a_full_disk_hand_over_without_loss(
    disk: Path, nsqd: DaemonProcess
) -> None:
    """The topic's queue holds the backlog (topic paused), the disk is full to the last block;
    unpaused, the topic moves its backlog to the channel's queue, which has no room until the
    topic's finished files are deleted. Nothing is lost on the way."""
    http_ok(nsqd, "POST", "/topic/create?topic=t")
    http_ok(nsqd, "POST", "/channel/create?topic=t&channel=c")
    http_ok(nsqd, "POST", "/topic/pause?topic=t")
    first, error = publish_until_refused(nsqd, "t", b"first", BODY_SIZE)
    assert error == f"E_PUB_FAILED PUB failed {FULL}".encode()
    fill_disk(disk / "filler")
    assert_unhealthy(nsqd)

    http_ok(nsqd, "POST", "/topic/unpause?topic=t")
    wait_until(lambda: (channel_stats(nsqd, "t", "c") or {}).get("depth") == len(first), 30.0)
    received = consume_from(nsqd, "t", "c", len(first), timeout=30.0)
    second = [b"second%06d:" % i + bytes(BODY_SIZE - 13) for i in range(100)]
    publish_all(nsqd, "t", second, timeout=30.0)
    assert ping(nsqd) == (200, "OK")
    received += consume_from(nsqd, "t", "c", len(second), timeout=30.0)
    assert Counter(m.body for m in received) == Counter(first + second)
    assert_no_temporary_files_after_stop(nsqd, disk)


def test_copies_a_full_disk_refused_survive_a_crash(
    disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The topic's pump copies its backlog while the channel's disk is full: the copies wait
    in the channel's memory, and the topic keeps their records (its metadata does not move
    past them however often it syncs). SIGKILL then, space freed, restart: every message
    comes back. (Go 1.3 logs "failed to write message to backend" and the copy is gone.)"""
    data = disk / "data"
    data.mkdir()
    args = ("--mem-queue-size=0", "--max-bytes-per-file=65536", "--sync-timeout=50ms")
    with limited_nsqd(monkeypatch, data, *args) as nsqd:
        http_ok(nsqd, "POST", "/topic/create?topic=t")
        http_ok(nsqd, "POST", "/channel/create?topic=t&channel=c")
        http_ok(nsqd, "POST", "/topic/pause?topic=t")
        first, _ = publish_until_refused(nsqd, "t", b"first", BODY_SIZE)
        filler = disk / "filler"
        fill_disk(filler)
        http_ok(nsqd, "POST", "/topic/unpause?topic=t")
        wait_until(lambda: (channel_stats(nsqd, "t", "c") or {}).get("depth") == len(first), 30.0)
        on_disk = sum(path.stat().st_size for path in data.glob("t:c.diskqueue.*.dat"))
        assert on_disk < BODY_SIZE * len(first) // 2, "the channel's disk took the copies"
        time.sleep(0.5)  # ten sync timeouts: the topic's metadata is written if it can be
        assert nsqd.kill() == -9
        filler.unlink()

        nsqd.start(15.0)
        http_ok(nsqd, "POST", "/topic/unpause?topic=t")  # (the full disk kept nsqd.dat paused)
        got = Counter(m.body for m in consume_all(nsqd, "t", "c", timeout=30.0))
        assert not Counter(first) - got, "acknowledged messages were lost"
        assert set(got) <= set(first)


def test_a_topic_frees_its_files_once_every_channel_settled_its_copies(
    disk: Path, nsqd: DaemonProcess
) -> None:
    """Refused copies keep the topic's records until each channel is done with them: one
    channel finishing them is not enough, the other channel's deletion settles the rest; then
    the topic's files go and publishes are taken again."""
    http_ok(nsqd, "POST", "/topic/create?topic=t")
    for channel in ("c", "d"):
        http_ok(nsqd, "POST", f"/channel/create?topic=t&channel={channel}")
    http_ok(nsqd, "POST", "/topic/pause?topic=t")
    first, _ = publish_until_refused(nsqd, "t", b"first", BODY_SIZE)
    fill_disk(disk / "filler")
    http_ok(nsqd, "POST", "/topic/unpause?topic=t")
    depths = lambda: [(channel_stats(nsqd, "t", ch) or {}).get("depth") for ch in ("c", "d")]  # noqa: E731
    wait_until(lambda: depths() == [len(first)] * 2, 30.0)
    received = consume_from(nsqd, "t", "c", len(first), timeout=30.0)
    assert Counter(m.body for m in received) == Counter(first)
    time.sleep(0.3)
    assert try_pub(nsqd, "t", b"still full") is not None, "d's copies no longer kept the files"

    http_ok(nsqd, "POST", "/channel/delete?topic=t&channel=d")
    second = [b"second%06d:" % i + bytes(BODY_SIZE - 13) for i in range(20)]
    publish_all(nsqd, "t", second, timeout=30.0)
    received = consume_from(nsqd, "t", "c", len(second), timeout=30.0)
    assert Counter(m.body for m in received) == Counter(second)


def test_a_crash_during_the_fault_loses_no_acknowledged_message(
    disk: Path, nsqd: DaemonProcess
) -> None:
    """SIGKILL while the disk is full to the last block and a consumer is half way through:
    after a restart (space freed) every acknowledged message not yet finished comes back."""
    http_ok(nsqd, "POST", "/topic/create?topic=t")
    http_ok(nsqd, "POST", "/channel/create?topic=t&channel=c")
    first, error = publish_until_refused(nsqd, "t", b"first", BODY_SIZE)
    assert error == f"E_PUB_FAILED PUB failed {FULL}".encode()
    filler = disk / "filler"
    fill_disk(filler)
    finished = consume_from(nsqd, "t", "c", len(first) // 2, timeout=30.0)
    assert nsqd.kill() == -9
    filler.unlink()
    # A failed metadata write removes its temporary file; one the SIGKILL cut short may leave
    # it (at most one per file being written: the topic's and the channel's queue metadata,
    # nsqd.dat), and start-up removes those.
    left = list((disk / "data").glob("*.tmp"))
    assert len(left) <= 3, left

    nsqd.start(15.0)
    assert not any(path.exists() for path in left)
    # (the topic copies again what it copied since its last metadata write: no fixed count)
    rest = consume_all(nsqd, "t", "c", timeout=30.0)
    got = Counter(m.body for m in finished + rest)
    assert not Counter(first) - got, "acknowledged messages were lost"
    # read before the kill but not yet recorded as read: delivered again (at least once)
    assert set(got) <= set(first), "messages that were never acknowledged came back"


def test_stale_temporary_files_are_removed_at_start(disk: Path, nsqd: DaemonProcess) -> None:
    data = disk / "data"
    nsqd.stop()
    stale = [data / "nsqd.dat.123.tmp", data / "t:c.diskqueue.meta.dat.456.tmp"]
    for path in stale:
        path.touch()
    kept = data / "notes.tmp"  # not one of nsqd's: left alone
    kept.touch()
    nsqd.start(15.0)
    assert not any(path.exists() for path in stale)
    assert kept.exists()


def test_a_channel_created_on_a_full_disk_is_recorded_once_space_is_back(
    disk: Path, nsqd: DaemonProcess
) -> None:
    """nsqd.dat cannot be written on a full disk: the write is retried (with a backoff) until
    it succeeds, so the new channel survives a restart without any further change."""
    http_ok(nsqd, "POST", "/topic/create?topic=t")
    nsqd_dat = disk / "data" / "nsqd.dat"
    wait_until(lambda: b'"t"' in nsqd_dat.read_bytes())
    filler = disk / "filler"
    fill_disk(filler)
    http_ok(nsqd, "POST", "/channel/create?topic=t&channel=late")
    wait_until(lambda: any("failed to persist metadata" in line for line in nsqd.log_lines))
    assert b"late" not in nsqd_dat.read_bytes()
    filler.unlink()

    def recorded() -> bool:
        topics = json.loads(nsqd_dat.read_bytes())["topics"]
        return any(c["name"] == "late" for t in topics for c in t["channels"] or [])

    wait_until(recorded, 15.0, "the channel in nsqd.dat")
    assert any("persisted metadata again" in line for line in nsqd.log_lines)
    assert_no_temporary_files_after_stop(nsqd, disk)
