"""Helpers for the Spark tests: publishing, channel stats, reading outputs."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from nsqpy.client import sync
from nsqpy.testing import DaemonProcess

from ..raw_v2 import wait_until


def tcp(daemon: DaemonProcess) -> str:
    host, port = daemon.tcp_address
    return f"{host}:{port}"


def http(daemon: DaemonProcess) -> str:
    host, port = daemon.http_address
    return f"{host}:{port}"


@dataclass
class NSQCluster:
    lookupd: DaemonProcess
    nsqds: list[DaemonProcess]

    @property
    def lookupd_http(self) -> str:
        return http(self.lookupd)

    def source_options(
        self, topic: str, channel: str, staging: Path, **extra: str
    ) -> dict[str, str]:
        return {
            "lookupd": self.lookupd_http,
            "topic": topic,
            "channel": channel,
            "stagingLocation": str(staging),
            "waitMs": "500",
            **extra,
        }


def post(daemon: DaemonProcess, path: str, **params: str) -> None:
    query = urllib.parse.urlencode(params)
    request = urllib.request.Request(f"{daemon.http_url}{path}?{query}", method="POST")
    with urllib.request.urlopen(request, timeout=5):
        pass


def make_topic(cluster: NSQCluster, topic: str, channel: str | None = None) -> None:
    """Create the topic (and channel) on every nsqd and wait until nsqlookupd lists them all."""
    for nsqd in cluster.nsqds:
        post(nsqd, "/topic/create", topic=topic)
        if channel is not None:
            post(nsqd, "/channel/create", topic=topic, channel=channel)
    wait_until(
        lambda: len(lookup(cluster, topic)) == len(cluster.nsqds),
        what="lookupd listing",
        timeout=20.0,
    )


def lookup(cluster: NSQCluster, topic: str) -> list[Any]:
    url = f"http://{cluster.lookupd_http}/lookup?topic={topic}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return list(json.loads(resp.read()).get("producers") or [])
    except urllib.error.HTTPError:
        return []


def publish(nsqd: DaemonProcess, topic: str, bodies: Sequence[bytes], batch: int = 1000) -> None:
    with sync.SyncProducer(tcp(nsqd)) as producer:
        for i in range(0, len(bodies), batch):
            producer.multi_publish(topic, list(bodies[i : i + batch]))


def publish_numbered(
    cluster: NSQCluster, topic: str, start: int, count: int, batch: int = 1000
) -> list[bytes]:
    """Bodies ``m<n>`` for n in [start, start+count), alternating over the nsqd."""
    bodies = [b"m%d" % n for n in range(start, start + count)]
    for i, nsqd in enumerate(cluster.nsqds):
        publish(nsqd, topic, bodies[i :: len(cluster.nsqds)], batch)
    return bodies


def stats(nsqd: DaemonProcess, topic: str) -> dict[str, Any]:
    url = f"{nsqd.http_url}/stats?format=json&include_mem=false&topic={topic}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        for t in json.loads(resp.read()).get("topics") or ():
            if t["topic_name"] == topic:
                return dict(t)
    return {}


def channel(nsqd: DaemonProcess, topic: str, name: str) -> dict[str, Any]:
    for c in stats(nsqd, topic).get("channels") or ():
        if c["channel_name"] == name:
            return dict(c)
    return {}


def depth(cluster: NSQCluster, topic: str, name: str) -> int:
    return sum(int(channel(n, topic, name).get("depth", 0)) for n in cluster.nsqds)


def in_flight(cluster: NSQCluster, topic: str, name: str) -> int:
    return sum(int(channel(n, topic, name).get("in_flight_count", 0)) for n in cluster.nsqds)


def committed_files(path: Path) -> list[str]:
    """The files Spark's file sink committed, from its ``_spark_metadata`` log.

    Only these are the output: a file in the directory but not in the log (an attempt that
    failed, a batch being written) is not.
    """
    log = path / "_spark_metadata"
    if not log.exists():
        return []
    files: set[str] = set()
    for entry in sorted(log.iterdir()):
        if entry.name.startswith(".") or not entry.name.split(".")[0].isdigit():
            continue
        for line in entry.read_text().splitlines()[1:]:  # the first line is the version
            record = json.loads(line)
            target = urllib.parse.unquote(urllib.parse.urlparse(record["path"]).path)
            if record.get("action", "add") == "add":
                files.add(target)
            else:
                files.discard(target)
    return sorted(files)


def parquet_rows(path: Path) -> list[dict[str, Any]]:
    """Every committed row of a Parquet output (Spark's file sink), with partition columns."""
    files = committed_files(path)
    if not files:
        return []
    dataset = ds.dataset(files, format="parquet", partitioning="hive", partition_base_dir=str(path))
    return list(dataset.to_table().to_pylist())


def consume_all(
    cluster: NSQCluster, topic: str, name: str, count: int, timeout: float = 20.0
) -> list[bytes]:
    """``count`` messages of ``topic``/``name`` from every nsqd.

    With fewer RDY than connections a consumer holds RDY on one nsqd at a time and moves it
    only after ``low_rdy_idle_timeout`` (10 s): so every connection gets RDY at once here,
    whichever nsqd holds the messages (any beyond ``count`` are requeued)."""
    messages = sync.consume(
        topic,
        name,
        count,
        nsqd_tcp_addresses=[tcp(n) for n in cluster.nsqds],
        timeout=timeout,
        max_in_flight=max(count, len(cluster.nsqds)),
    )
    return [m.body for m in messages]
