"""The data path turns read-only under a running nsqd (remounted), then writable again: nsqd
refuses publishes with NSQ's error meanwhile, says so in /ping and /stats, and takes writes
again by itself, with every acknowledged message delivered."""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..nsqd.nsqd_storage_support import consume_from
from ..raw_v2 import NsqConn, http_ok, pub_cmd
from .support import (
    health,
    limited_nsqd,
    log_lines_since,
    log_mark,
    mounted_tmpfs,
    ping,
    publish_all,
)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "disk", "4m") as mount_point:
        yield mount_point
        remount(mount_point, "rw")  # after nsqd stopped: a failed test may leave it read-only


def remount(mount_point: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mount_point)], check=True)


def test_a_data_path_turned_read_only_refuses_writes_until_it_is_writable_again(
    disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with limited_nsqd(monkeypatch, disk, "--mem-queue-size=0") as nsqd:
        http_ok(nsqd, "POST", "/topic/create?topic=t")
        http_ok(nsqd, "POST", "/channel/create?topic=t&channel=c")
        # nothing written to a queue yet, so no file is open for writing and the remount works
        remount(disk, "ro")
        mark = log_mark(nsqd)
        error = f"{disk}/t:c.diskqueue.000000.dat: read-only file system"
        for _ in range(50):
            conn = NsqConn(nsqd.tcp_address)
            conn.send(pub_cmd("t", b"refused"))
            conn.expect_error(f"E_PUB_FAILED PUB failed {error}")
            conn.close()
        assert ping(nsqd) == (500, f"NOK - {error}")
        assert health(nsqd) == f"NOK - {error}"
        failures = [line for line in log_lines_since(nsqd, mark) if "ERROR" in line]
        assert 1 <= len(failures) <= 6, failures  # 50 refusals, said once or twice per key

        remount(disk, "rw")
        published = [b"m%03d" % i for i in range(100)]
        publish_all(nsqd, "t", published, timeout=10.0)
        assert ping(nsqd) == (200, "OK")
        received = consume_from(nsqd, "t", "c", len(published))
        assert Counter(m.body for m in received) == Counter(published)
