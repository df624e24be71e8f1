"""The source's read task against real nsqd: stage, then FIN; replay; races; crashes; poison.

No Spark here: ``fetch_task`` is what each Spark task runs, called directly.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pyarrow as pa
import pytest

from nsqpy.spark.fetch import FaultInjected, PoisonMessageError, empty_table, fetch_task
from nsqpy.spark.options import SourceOptions, parse_source_options
from nsqpy.spark.plan import ReadTask
from nsqpy.spark.staging import Staging
from nsqpy.testing import DaemonProcess, start_nsqd
from nsqpy.testing.certs import make_certificates

from ..raw_v2 import unique, wait_until
from .helpers import NSQCluster, channel, consume_all, post, publish, tcp

CHANNEL = "spark"


def options(nsqd: DaemonProcess, topic: str, staging: Path, **extra: str) -> SourceOptions:
    raw = {
        "nsqd": tcp(nsqd),
        "topic": topic,
        "channel": CHANNEL,
        "stagingLocation": str(staging),
        "waitMs": "4000",
        "idleMs": "200",
        **extra,
    }
    return parse_source_options(raw, streaming=True)


def prepared(nsqd: DaemonProcess, topic: str, count: int) -> list[bytes]:
    post(nsqd, "/topic/create", topic=topic)
    post(nsqd, "/channel/create", topic=topic, channel=CHANNEL)
    bodies = [b"%s-%d" % (topic.encode(), i) for i in range(count)]
    publish(nsqd, topic, bodies)
    return bodies


def staging_for(tmp_path: Path, opts: SourceOptions) -> Staging:
    staging = Staging(opts.staging_location)
    staging.claim(opts.identity())
    return staging


def test_stage_then_finish(cluster: NSQCluster, tmp_path: Path) -> None:
    nsqd = cluster.nsqds[0]
    topic = unique("fetch")
    bodies = prepared(nsqd, topic, 30)
    opts = options(nsqd, topic, tmp_path)
    staging = staging_for(tmp_path, opts)
    task = ReadTask("t1-a-r0", 1, topic, tcp(nsqd), 50)

    started = time.monotonic()
    table = fetch_task(task, opts, staging)
    # 30 of 50 arrived, then an idle gap (200 ms), not the whole wait (4 s), ended the read
    assert time.monotonic() - started < 2.5
    assert sorted(table.column("body").to_pylist()) == sorted(bodies)
    assert set(table.column("attempts").to_pylist()) == {1}
    assert set(table.column("nsqd").to_pylist()) == {tcp(nsqd)}
    assert set(table.column("channel").to_pylist()) == {CHANNEL}
    assert all(len(i) == 16 for i in table.column("id").to_pylist())
    staged = staging.load(task.key)
    assert staged is not None and staged.equals(table)
    stats = channel(nsqd, topic, CHANNEL)
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0  # all FINished
    assert stats["requeue_count"] == 0 and stats["timeout_count"] == 0


def test_retry_replays_the_staged_rows_without_touching_nsqd(
    cluster: NSQCluster, tmp_path: Path
) -> None:
    nsqd = cluster.nsqds[0]
    topic = unique("fetch")
    prepared(nsqd, topic, 20)
    opts = options(nsqd, topic, tmp_path)
    staging = staging_for(tmp_path, opts)
    task = ReadTask("t1-a-r0", 1, topic, tcp(nsqd), 100)
    first = fetch_task(task, opts, staging)
    publish(nsqd, topic, [b"later-%d" % i for i in range(5)])

    again = fetch_task(task, opts, staging)

    assert again.equals(first)
    assert channel(nsqd, topic, CHANNEL)["depth"] == 5  # the new messages wait for a new tick


def test_losing_attempt_requeues_and_replays_the_winner(
    cluster: NSQCluster, tmp_path: Path
) -> None:
    nsqd = cluster.nsqds[0]
    topic = unique("fetch")
    prepared(nsqd, topic, 10)
    opts = options(nsqd, topic, tmp_path)
    staging = staging_for(tmp_path, opts)
    task = ReadTask("t1-a-r0", 1, topic, tcp(nsqd), 10)
    # the winner staged its rows, then this attempt reads from nsqd: a race lost at the link
    winner = empty_table()
    original_publish = staging.publish

    def stage_first_then_lose(key: str, table: pa.Table) -> bool:
        original_publish(key, winner)
        return original_publish(key, table)

    staging.publish = stage_first_then_lose  # type: ignore[method-assign]
    result = fetch_task(task, opts, staging)

    assert result.num_rows == 0  # the winner's (empty) rows
    stats = channel(nsqd, topic, CHANNEL)
    assert stats["depth"] == 10 and stats["requeue_count"] == 10  # ours went back at once


def test_crash_between_staging_and_fin_redelivers_the_same_ids(
    cluster: NSQCluster, tmp_path: Path
) -> None:
    nsqd = cluster.nsqds[0]
    topic = unique("fetch")
    prepared(nsqd, topic, 25)
    fault = json.dumps({"point": "after_stage", "dir": str(tmp_path / "faults")})
    opts = options(nsqd, topic, tmp_path / "st", _faultInjection=fault, **{"nsq.msg_timeout": "1s"})
    staging = staging_for(tmp_path, opts)
    task = ReadTask("t1-a-r0", 1, topic, tcp(nsqd), 25)

    with pytest.raises(FaultInjected):
        fetch_task(task, opts, staging)
    staged = staging.load(task.key)
    assert staged is not None and staged.num_rows == 25
    assert channel(nsqd, topic, CHANNEL)["in_flight_count"] == 25  # never FINished

    # the retry replays the staged rows; nsqd redelivers the same messages after msg_timeout
    assert fetch_task(task, opts, staging).equals(staged)
    wait_until(lambda: channel(nsqd, topic, CHANNEL)["depth"] == 25, timeout=10, what="timeouts")
    plain = options(nsqd, topic, tmp_path / "st")
    redelivered = fetch_task(ReadTask("t2-a-r0", 2, topic, tcp(nsqd), 25), plain, staging)
    assert sorted(redelivered.column("id").to_pylist()) == sorted(staged.column("id").to_pylist())
    assert set(redelivered.column("attempts").to_pylist()) == {2}


@pytest.mark.parametrize("policy", ["skip", "deadletter", "fail"])
def test_poison_policy(cluster: NSQCluster, tmp_path: Path, policy: str) -> None:
    nsqd = cluster.nsqds[0]
    topic = unique("poison")
    prepared(nsqd, topic, 6)
    dead = topic + "_dead"
    post(nsqd, "/topic/create", topic=dead)
    post(nsqd, "/channel/create", topic=dead, channel="check")
    base = options(nsqd, topic, tmp_path, **{"nsq.msg_timeout": "1s"})
    staging = staging_for(tmp_path, base)
    # first delivery: crash before staging, so all 6 come back with attempts=2
    crash = json.dumps({"point": "before_stage", "dir": str(tmp_path / "faults")})
    first = options(nsqd, topic, tmp_path, _faultInjection=crash, **{"nsq.msg_timeout": "1s"})
    with pytest.raises(FaultInjected):
        fetch_task(ReadTask("t1-a-r0", 1, topic, tcp(nsqd), 6), first, staging)
    wait_until(lambda: channel(nsqd, topic, CHANNEL)["depth"] == 6, timeout=10, what="timeouts")

    extra = {"maxAttempts": "1", "poisonPolicy": policy, "nsq.msg_timeout": "1s"}
    if policy == "deadletter":
        extra["deadLetterTopic"] = dead
    opts = options(nsqd, topic, tmp_path, **extra)
    task = ReadTask("t2-a-r0", 2, topic, tcp(nsqd), 6)
    if policy == "fail":
        with pytest.raises(PoisonMessageError, match="delivered 2 times"):
            fetch_task(task, opts, staging)
        assert staging.load(task.key) is None
        wait_until(
            lambda: channel(nsqd, topic, CHANNEL)["depth"] == 6, what="requeue", timeout=20.0
        )
        return
    table = fetch_task(task, opts, staging)
    assert table.num_rows == 0  # none is staged for the query
    stats = channel(nsqd, topic, CHANNEL)
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0  # all FINished
    if policy == "deadletter":
        assert len(consume_all(cluster_of(nsqd), dead, "check", 6)) == 6


def cluster_of(nsqd: DaemonProcess) -> NSQCluster:
    return NSQCluster(lookupd=nsqd, nsqds=[nsqd])


def test_unreachable_nsqd_stages_an_empty_task(tmp_path: Path, cluster: NSQCluster) -> None:
    nsqd = cluster.nsqds[0]
    opts = options(nsqd, "nowhere", tmp_path)
    staging = staging_for(tmp_path, opts)
    task = ReadTask("t1-a-r0", 1, "nowhere", "127.0.0.1:1", 10)  # nothing listens on port 1
    assert fetch_task(task, opts, staging).num_rows == 0
    staged = staging.load(task.key)
    assert staged is not None and staged.num_rows == 0  # a replay is empty too


@pytest.fixture
def small_rdy_nsqd(tmp_path: Path) -> Iterator[DaemonProcess]:
    (tmp_path / "d").mkdir()
    nsqd = start_nsqd(tmp_path / "d", "--max-rdy-count=40")
    yield nsqd
    nsqd.stop()


def test_a_task_larger_than_max_rdy_count_reads_over_several_connections(
    small_rdy_nsqd: DaemonProcess, tmp_path: Path
) -> None:
    topic = unique("rdy")
    bodies = prepared(small_rdy_nsqd, topic, 150)
    opts = options(small_rdy_nsqd, topic, tmp_path / "st")
    staging = staging_for(tmp_path, opts)
    table = fetch_task(ReadTask("t1-a-r0", 1, topic, tcp(small_rdy_nsqd), 130), opts, staging)
    assert table.num_rows == 130  # 4 connections of at most 40 un-FINished messages each
    assert set(table.column("body").to_pylist()) <= set(bodies)
    stats = channel(small_rdy_nsqd, topic, CHANNEL)
    assert stats["depth"] == 20 and stats["in_flight_count"] == 0


# ---------------------------------------------------------------------- TLS and AUTH


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    certificates = make_certificates(tmp_path_factory.mktemp("certs"), "nsqpy spark test CA")
    return certificates.ca.parent


class _AuthHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = "secret=letmein" in self.path
        body = {
            "ttl": 3600,
            "identity": "spark",
            "authorizations": [
                {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}
            ]
            if ok
            else [],
        }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def secure_nsqd(certs: Path, tmp_path: Path) -> Iterator[DaemonProcess]:
    server = HTTPServer(("127.0.0.1", 0), _AuthHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "d").mkdir()
    nsqd = start_nsqd(
        tmp_path / "d",
        f"--tls-cert={certs / 'server.pem'}",
        f"--tls-key={certs / 'server.key'}",
        "--tls-required=true",
        f"--auth-http-address=127.0.0.1:{server.server_address[1]}",
    )
    yield nsqd
    nsqd.stop()
    server.shutdown()


def test_tls_and_auth_settings_reach_identify(
    secure_nsqd: DaemonProcess, certs: Path, tmp_path: Path
) -> None:
    from nsqpy.client.errors import IdentifyError

    topic = unique("secure")
    secure = {
        "nsq.tls_v1": "true",
        "nsq.tls_root_ca_file": str(certs / "ca.pem"),
        "nsq.auth_secret": "letmein",
    }
    # publish through TLS + AUTH too (the HTTP API is closed by --tls-required)
    from nsqpy.client import sync
    from nsqpy.spark.options import connection_options

    conn = connection_options(tuple((k[4:], v) for k, v in secure.items()))
    with sync.SyncProducer(tcp(secure_nsqd), tls=conn.tls, auth_secret="letmein") as producer:
        producer.multi_publish(topic, [b"a", b"b", b"c"])

    opts = options(secure_nsqd, topic, tmp_path / "st", createChannel="false", **secure)
    staging = staging_for(tmp_path, opts)
    table = fetch_task(ReadTask("t1-a-r0", 1, topic, tcp(secure_nsqd), 3), opts, staging)
    assert sorted(table.column("body").to_pylist()) == [b"a", b"b", b"c"]

    wrong = options(secure_nsqd, topic, tmp_path / "st", **{**secure, "nsq.auth_secret": "nope"})
    with pytest.raises(IdentifyError, match="AUTH failed"):
        fetch_task(ReadTask("t2-a-r0", 2, topic, tcp(secure_nsqd), 3), wrong, staging)
    plain = options(secure_nsqd, topic, tmp_path / "st", **{"nsq.auth_secret": "letmein"})
    with pytest.raises(Exception, match=r"E_INVALID|E_UNAUTHORIZED|TLS"):  # --tls-required
        fetch_task(ReadTask("t3-a-r0", 3, topic, tcp(secure_nsqd), 3), plain, staging)


def test_deliveries_after_the_task_stopped_taking_go_back_at_once(
    cluster: NSQCluster, tmp_path: Path
) -> None:
    # a loaded task can still be reading what nsqd sent before RDY 0 when it closes; those
    # messages must be requeued as they arrive, not left in flight until msg_timeout (nsqd
    # does not requeue a closed client's messages earlier), where a planner cannot see them
    import asyncio

    from nsqpy.protocol import commands
    from nsqpy.spark.fetch import _Collector, _source_connection_options
    from nsqpy.spark.receive import FrameConnection

    nsqd = cluster.nsqds[0]
    topic = unique("late")
    prepared(nsqd, topic, 10)
    opts = options(nsqd, topic, tmp_path)

    async def read_after_stopping() -> int:
        collector = _Collector()
        conn = FrameConnection(tcp(nsqd), _source_connection_options(opts), collector)
        await conn.connect()
        assert await conn.handshake_command(commands.sub(topic, CHANNEL)) == b"OK"
        assert len(conn.freeze()) == 0  # the task stopped taking before anything arrived
        conn.start_streaming()
        conn.send_rdy(10)
        deadline = time.monotonic() + 10
        while collector.late_count < 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        conn.send_rdy(0)  # as the task did before it stopped: no more redeliveries to us
        await asyncio.sleep(0.5)  # what was still on the wire arrives and is requeued
        stats = channel(nsqd, topic, CHANNEL)  # while the connection is still open
        conn.close()
        assert stats["in_flight_count"] == 0 and stats["depth"] == 10, stats
        return collector.late_count

    assert asyncio.run(read_after_stopping()) >= 10
