"""nsq_to_file killed with SIGKILL again and again while messages flow: nothing that nsqd
counts as finished may be missing from the files, and every gzip file must decompress."""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import wait_until
from .conftest import ToolProcess, channel_stats, http_post, tcp

TOPIC = "crash_archive"
MAX_TOTAL = 6000  # messages at most, published at a steady rate in batches until the kills end
BATCH = 15
BATCH_EVERY = 0.1  # ~150 msgs/s for ~10 s
KILL_AFTER = (0.8, 1.3, 0.6, 1.0, 0.9)  # seconds each run lives before its SIGKILL


@pytest.fixture
def crash_nsqd(tmp_path: Path) -> Iterator[DaemonProcess]:
    (tmp_path / "nsqd").mkdir()
    # messages held by a killed archiver come back after --msg-timeout
    with start_nsqd(tmp_path / "nsqd", "--msg-timeout=2s") as daemon:
        yield daemon


def publish_steadily(nsqd: DaemonProcess, bodies: list[bytes], stop: threading.Event) -> None:
    """~150 msgs/s until ``stop`` (or MAX_TOTAL); ``bodies`` gets what nsqd accepted."""
    while not stop.is_set() and len(bodies) < MAX_TOTAL:
        batch = [b"crash-%06d" % i for i in range(len(bodies), len(bodies) + BATCH)]
        http_post(nsqd, "/mpub", b"\n".join(batch), topic=TOPIC)
        bodies.extend(batch)
        time.sleep(BATCH_EVERY)


def read_records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        payload = b""
        while data:  # member by member: each must be complete
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            payload += inflater.decompress(data) + inflater.flush()
            assert inflater.eof, f"{path} has a truncated gzip member"
            data = inflater.unused_data
        data = payload
    return data.split(b"\n")


@pytest.mark.parametrize("mode", ["gzip", "plain"])
def test_sigkill_loses_nothing_finished(
    mode: str,
    crash_nsqd: DaemonProcess,
    tool: Callable[..., ToolProcess],
    tmp_path: Path,
) -> None:
    output, work = tmp_path / "out", tmp_path / "work"
    args = [
        f"--topic={TOPIC}",
        f"--nsqd-tcp-address={tcp(crash_nsqd)}",
        f"--output-dir={output}",
        f"--work-dir={work}",
        "--rotate-size=20000",
        "--sync-interval=100ms",
        "--max-in-flight=50",
        # a message in flight at several kills must not be given up after 5 attempts
        "--consumer-opt=max_attempts,0",
        *(["--gzip"] if mode == "gzip" else []),
    ]
    # create the channel first so that it gets every message
    http_post(crash_nsqd, "/topic/create", topic=TOPIC)
    http_post(crash_nsqd, "/channel/create", topic=TOPIC, channel="nsq_to_file")
    bodies: list[bytes] = []
    kills_done = threading.Event()
    publisher = threading.Thread(
        target=publish_steadily, args=(crash_nsqd, bodies, kills_done), daemon=True
    )
    publisher.start()
    for lifetime in KILL_AFTER:
        archiver = tool("nsq_to_file", *args)
        archiver.wait_for_stderr(b"connected and subscribed", timeout=60)
        time.sleep(lifetime)  # let it work for a while: the kill lands mid-stream
        archiver.kill()
    kills_done.set()
    archiver = tool("nsq_to_file", *args)
    publisher.join(120)
    assert len(bodies) < MAX_TOTAL  # so every kill landed while messages were flowing

    def finished() -> bool:
        stats = channel_stats(crash_nsqd, TOPIC, "nsq_to_file")
        return stats is not None and stats["depth"] == 0 and stats["in_flight_count"] == 0

    wait_until(finished, timeout=120, what="everything archived")
    stats = channel_stats(crash_nsqd, TOPIC, "nsq_to_file")
    assert stats is not None and stats["message_count"] == len(bodies)
    assert archiver.signal() == 0, archiver.stderr.decode()
    assert b"Traceback" not in archiver.stderr

    paths = sorted(p for d in (output, work) for p in d.rglob("*") if p.is_file())
    if mode == "gzip":  # exclusive creation: each run left files of its own
        assert len(paths) > len(KILL_AFTER)
    records = [record for path in paths for record in read_records(path)]
    wanted = set(bodies)
    missing = wanted - set(records)
    assert not missing, f"{len(missing)} finished messages missing, e.g. {sorted(missing)[:3]}"
    # anything else is an empty split remainder or a record torn by a kill (then redelivered)
    strays = [r for r in records if r and r not in wanted]
    assert all(any(body.startswith(r) for body in bodies) for r in strays), strays[:3]
