"""Queue files removed, truncated or made unreadable under a running nsqd: it loses what those
files held and nothing else, keeps serving, stays healthy for publishers, and says so briefly."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqpy.protocol import MESSAGE_HEADER_LENGTH
from nsqpy.testing import DaemonProcess

from ..nsqd.nsqd_storage_support import consume_from, data_file, parse_records
from ..raw_v2 import channel_stats, http_ok, wait_until
from .support import (
    limited_nsqd,
    log_lines_since,
    log_mark,
    mounted_tmpfs,
    ping,
    publish_all,
)

QUEUE = "t:c"


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "disk", "8m") as mount_point:
        yield mount_point


@pytest.fixture
def nsqd(data: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DaemonProcess]:
    with limited_nsqd(
        monkeypatch, data, "--mem-queue-size=0", "--max-bytes-per-file=8192"
    ) as daemon:
        yield daemon


def bodies_in(path: Path) -> list[bytes]:
    return [record[MESSAGE_HEADER_LENGTH:] for record in parse_records(path.read_bytes())]


def test_removed_truncated_and_unreadable_files_lose_only_their_own_messages(
    data: Path, nsqd: DaemonProcess
) -> None:
    http_ok(nsqd, "POST", "/topic/create?topic=t")
    http_ok(nsqd, "POST", "/channel/create?topic=t&channel=c")
    published = [b"m%04d:" % i + bytes(1000) for i in range(90)]  # 7 records per 8 KiB file
    publish_all(nsqd, "t", published, timeout=30.0)
    assert data_file(data, QUEUE, 11).exists()
    per_file = {num: bodies_in(data_file(data, QUEUE, num)) for num in range(11)}
    assert sum(len(found) for found in per_file.values()) == 77

    mark = log_mark(nsqd)
    data_file(data, QUEUE, 2).unlink()  # removed
    with open(data_file(data, QUEUE, 4), "r+b") as truncated:
        truncated.truncate(1500)  # one whole record and a torn one remain
    unreadable = data_file(data, QUEUE, 6)
    unreadable.unlink()
    unreadable.mkdir()  # open() works, read() fails with EISDIR (root ignores file modes)
    lost = per_file[2] + per_file[4][1:] + per_file[6]

    expected = Counter(published) - Counter(lost)
    received = consume_from(nsqd, "t", "c", len(published) - len(lost), timeout=30.0)
    assert Counter(m.body for m in received) == expected
    wait_until(lambda: (channel_stats(nsqd, "t", "c") or {}).get("depth") == 0, 10.0)

    # still serving, and healthy: the damage was on the reading side
    assert ping(nsqd) == (200, "OK")
    later = [b"later%02d:" % i + bytes(100) for i in range(20)]
    publish_all(nsqd, "t", later, timeout=10.0)
    assert Counter(m.body for m in consume_from(nsqd, "t", "c", 20)) == Counter(later)
    assert os.path.exists(f"{unreadable}.bad")
    errors = [line for line in log_lines_since(nsqd, mark) if "ERROR" in line or "WARN" in line]
    assert any(f"{data_file(data, QUEUE, 2)}" in line for line in errors)
    assert len(errors) <= 12, "\n".join(errors)
