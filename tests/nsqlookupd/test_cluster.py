"""Two nsqd and two nsqlookupd processes, each nsqd registered with both lookupds.

After every change (topics created on either nsqd, a topic deleted, an nsqd SIGKILLed and
restarted on its ports and data dir, each lookupd restarted on its ports) both lookupds'
``/nodes`` and ``/lookup`` must again describe exactly what the nsqds' ``/stats`` say. Every wait
polls with a deadline. The tests share one cluster and run in file order; each starts and ends
with the cluster converged.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from tests.raw_v2 import unique, wait_for

from nsqpy.testing import DaemonProcess, start_nsqd, start_nsqlookupd

T = TypeVar("T")

#: how long a lookupd may take to reflect a change pushed by a running nsqd
PUSH = 1.0
#: a restarted daemon must be started, connected and registered within this
RECOVER = 8.0


# --------------------------------------------------------------------------- HTTP


def get(daemon: DaemonProcess, path: str) -> tuple[int, Any]:
    request = urllib.request.Request(
        daemon.http_url + path, headers={"Accept": "application/vnd.nsq; version=1.0"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def post(daemon: DaemonProcess, path: str, body: bytes = b"", **params: str) -> None:
    url = f"{daemon.http_url}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(urllib.request.Request(url, body, method="POST"), timeout=5) as r:
        assert r.status == 200


# --------------------------------------------------------------------------- the cluster


def pin_ports(daemon: DaemonProcess) -> None:
    """Make the next ``start()`` listen where this run does (later flags win)."""
    daemon.args += [
        f"--tcp-address=127.0.0.1:{daemon.tcp_port}",
        f"--http-address=127.0.0.1:{daemon.http_port}",
    ]


class Cluster:
    def __init__(self, tmp: Path) -> None:
        with ThreadPoolExecutor(2) as pool:
            self.lookupds = list(pool.map(lambda _: start_nsqlookupd(), range(2)))
            flags = [f"--lookupd-tcp-address=127.0.0.1:{ld.tcp_port}" for ld in self.lookupds]
            paths = [tmp / "nsqd0", tmp / "nsqd1"]
            for path in paths:
                path.mkdir()
            self.nsqds = list(pool.map(lambda path: start_nsqd(path, *flags), paths))
        for daemon in [*self.lookupds, *self.nsqds]:
            pin_ports(daemon)
        self.data_paths = dict(zip((d.tcp_port for d in self.nsqds), paths, strict=True))
        #: topics some nsqd once had: lookupd must list them without that nsqd
        self.gone: set[str] = set()

    def stop(self) -> list[str]:
        crashed = [
            f"{d.module} {d.args}:\n{d.log}"
            for d in [*self.nsqds, *self.lookupds]
            if d.proc is not None and d.proc.poll() is not None
        ]
        for daemon in [*self.nsqds, *self.lookupds]:
            daemon.stop()
        return crashed

    # ------------------------------------------------------------------ truth from nsqd

    def topics(self, nsqd: DaemonProcess) -> dict[str, list[str]]:
        """``topic -> channels`` from the nsqd's own /stats."""
        status, data = get(nsqd, "/stats?format=json")
        assert status == 200
        return {
            t["topic_name"]: sorted(c["channel_name"] for c in t["channels"])
            for t in data["topics"]
        }

    # ------------------------------------------------------------------ lookupd's view

    def mismatches(self, running: list[DaemonProcess] | None = None) -> list[str]:
        """Every way the lookupds' /nodes and /lookup differ from the running nsqds' /stats."""
        nsqds = self.nsqds if running is None else running
        truth = {nsqd.tcp_port: (nsqd, self.topics(nsqd)) for nsqd in nsqds}
        everything = self.gone.union(*(topics for _, topics in truth.values()))
        problems: list[str] = []
        for lookupd in self.lookupds:
            where = f"lookupd :{lookupd.http_port}"
            problems += self._node_mismatches(lookupd, truth, where)
            for topic in sorted(everything):
                problems += self._lookup_mismatches(lookupd, topic, truth, where)
        return problems

    def _node_mismatches(
        self,
        lookupd: DaemonProcess,
        truth: dict[int, tuple[DaemonProcess, dict[str, list[str]]]],
        where: str,
    ) -> list[str]:
        _, data = get(lookupd, "/nodes")
        listed = {node["tcp_port"]: node for node in data["producers"]}
        if sorted(listed) != sorted(truth):
            return [f"{where} /nodes lists {sorted(listed)}, not {sorted(truth)}"]
        problems = []
        for port, (nsqd, topics) in truth.items():
            node = listed[port]
            expected = {
                "broadcast_address": "127.0.0.1",
                "http_port": nsqd.http_port,
                "version": "1.3.0",
                "tombstones": [False] * len(topics),
                "topics": sorted(topics),
            }
            actual = {key: node[key] for key in expected} | {"topics": sorted(node["topics"])}
            if actual != expected:
                problems.append(f"{where} /nodes has {actual}, not {expected}")
        return problems

    def _lookup_mismatches(
        self,
        lookupd: DaemonProcess,
        topic: str,
        truth: dict[int, tuple[DaemonProcess, dict[str, list[str]]]],
        where: str,
    ) -> list[str]:
        holders = sorted(port for port, (_, topics) in truth.items() if topic in topics)
        status, data = get(lookupd, f"/lookup?{urllib.parse.urlencode({'topic': topic})}")
        if status == 404:
            # a restarted lookupd never heard of a topic nobody has any more
            return [f"{where} has no {topic}"] if holders else []
        producers = sorted(p["tcp_port"] for p in data["producers"])
        problems = []
        if producers != holders:
            problems.append(f"{where} /lookup {topic}: producers {producers}, not {holders}")
        channels = {c for port in holders for c in truth[port][1][topic]}
        if not channels <= set(data["channels"]):
            problems.append(f"{where} /lookup {topic}: channels {data['channels']} < {channels}")
        return problems

    def converge(
        self, timeout: float, what: str, running: list[DaemonProcess] | None = None
    ) -> None:
        wait_for(lambda: self.mismatches(running), lambda problems: not problems, timeout, what)

    # ------------------------------------------------------------------ nsqd state on disk

    def wait_persisted(self, nsqd: DaemonProcess, topics: dict[str, list[str]]) -> None:
        """Wait until ``nsqd.dat`` lists ``topics`` and their channels, so a SIGKILL cannot
        lose them (each create is persisted by its own write)."""
        path = self.data_paths[nsqd.tcp_port] / "nsqd.dat"

        def persisted() -> dict[str, list[str]]:
            try:
                return {
                    t["name"]: sorted(c["name"] for c in t["channels"] or [])
                    for t in json.loads(path.read_bytes())["topics"] or []
                }
            except (OSError, ValueError):
                return {}

        wait_for(persisted, lambda found: found == topics, 3.0, "metadata persisted")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("cluster"))
    yield running
    crashed = running.stop()
    assert not crashed, "a daemon died:\n" + "\n\n".join(crashed)


# --------------------------------------------------------------------------- tests


def test_topics_from_either_nsqd_reach_both_lookupds_within_a_second(cluster: Cluster) -> None:
    first, second = cluster.nsqds
    cluster.converge(PUSH, "an idle cluster converged")
    on_first, on_second, published = unique("first"), unique("second"), unique("pub")
    post(first, "/topic/create", topic=on_first)
    post(second, "/topic/create", topic=on_second)
    post(second, "/channel/create", topic=on_second, channel="audit")
    post(first, "/pub", b"m", topic=published)
    post(second, "/pub", b"m", topic=published)
    cluster.converge(PUSH, "every new topic in both lookupds")
    for lookupd in cluster.lookupds:
        _, found = get(lookupd, f"/lookup?topic={on_second}")
        assert found["channels"] == ["audit"]
        assert [p["tcp_port"] for p in found["producers"]] == [second.tcp_port]
        _, found = get(lookupd, f"/lookup?topic={published}")
        assert sorted(p["tcp_port"] for p in found["producers"]) == sorted(
            [first.tcp_port, second.tcp_port]
        )


def test_deleting_a_topic_on_one_nsqd(cluster: Cluster) -> None:
    first, second = cluster.nsqds
    topic = unique("deleted")
    for nsqd in cluster.nsqds:
        post(nsqd, "/topic/create", topic=topic)
        post(nsqd, "/channel/create", topic=topic, channel="c")
    cluster.converge(PUSH, "the shared topic registered")
    cluster.gone.add(topic)
    post(first, "/topic/delete", topic=topic)
    cluster.converge(PUSH, "the deleted topic unregistered")
    for lookupd in cluster.lookupds:
        _, found = get(lookupd, f"/lookup?topic={topic}")
        assert [p["tcp_port"] for p in found["producers"]] == [second.tcp_port]
    post(second, "/topic/delete", topic=topic)
    cluster.converge(PUSH, "the topic unregistered everywhere")
    for lookupd in cluster.lookupds:
        # lookupd keeps a non-ephemeral topic's keys, without producers
        assert get(lookupd, f"/lookup?topic={topic}") == (200, {"channels": ["c"], "producers": []})
        _, debug = get(lookupd, "/debug")
        assert f"topic:{topic}:" not in debug
        assert f"channel:{topic}:c" not in debug


def test_sigkilled_nsqd_leaves_and_comes_back(cluster: Cluster) -> None:
    victim, survivor = cluster.nsqds
    topic = unique("durable")
    post(victim, "/topic/create", topic=topic)
    post(victim, "/channel/create", topic=topic, channel="c")
    cluster.converge(PUSH, "the topic registered")
    before = cluster.topics(victim)
    cluster.wait_persisted(victim, before)

    victim.kill()
    cluster.converge(PUSH, "the killed nsqd gone from both lookupds", running=[survivor])
    for lookupd in cluster.lookupds:
        assert [n["tcp_port"] for n in get(lookupd, "/nodes")[1]["producers"]] == [
            survivor.tcp_port
        ]
        assert get(lookupd, f"/lookup?topic={topic}")[1]["producers"] == []

    victim.start()
    assert cluster.topics(victim) == before  # restored from nsqd.dat, on the same ports
    cluster.converge(RECOVER, "the restarted nsqd registered again")


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_restarted_lookupd_gets_everything_back(cluster: Cluster, how: str) -> None:
    restarted = cluster.lookupds[0 if how == "sigterm" else 1]
    topic = unique("before_restart")
    post(cluster.nsqds[0], "/topic/create", topic=topic)
    post(cluster.nsqds[0], "/channel/create", topic=topic, channel="c")
    cluster.converge(PUSH, "the topic registered")

    if how == "sigterm":
        restarted.stop()
    else:
        restarted.kill()
    started = time.monotonic()
    restarted.start()
    # nsqd notices the dropped connection and reconnects; with Go's lazy reconnect this would
    # wait for the next PING, up to 15 s
    cluster.converge(RECOVER, "the restarted lookupd repopulated")
    assert time.monotonic() - started < RECOVER
    _, found = get(restarted, f"/lookup?topic={topic}")
    assert found["channels"] == ["c"]
    assert [p["tcp_port"] for p in found["producers"]] == [cluster.nsqds[0].tcp_port]
