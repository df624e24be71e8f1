"""nsqd resolves ``--lookupd-tcp-address`` names again on every reconnect (nsqio/nsq#1233).

nsqd runs with its own /etc/hosts (tests/hosts_namespace.py). The name first points at a lookupd
on 127.0.0.1; the test points it at ::1, where a second lookupd listens on the same port, and
stops the first one (what a rescheduled pod looks like): nsqd reconnects, finds the new address
and registers its topics there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import DaemonProcess, start_nsqlookupd

from ..hosts_namespace import HostsFile, NamespacedDaemon
from ..raw_v2 import http_ok, q, unique, wait_until

pytestmark = pytest.mark.root

NAME = "lookupd.nsqpy.test"


def registered_topics(lookupd: DaemonProcess) -> list[list[Any]]:
    """The topics each producer in lookupd's /nodes registered."""
    nodes = json.loads(http_ok(lookupd, "GET", "/nodes"))["producers"]
    return [list(node["topics"]) for node in nodes]


def test_nsqd_follows_a_lookupd_name_to_its_new_address(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    old = start_nsqlookupd()
    daemons.append(old)
    tcp_port, http_port = old.tcp_port, old.http_port
    new = start_nsqlookupd(f"--tcp-address=[::1]:{tcp_port}", f"--http-address=[::1]:{http_port}")
    daemons.append(new)
    hosts = HostsFile(tmp_path / "hosts", {NAME: "127.0.0.1"})
    data = tmp_path / "data"
    data.mkdir()
    nsqd = NamespacedDaemon(
        hosts,
        "nsqpy.nsqd",
        [
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={data}",
            "--broadcast-address=127.0.0.1",
            f"--lookupd-tcp-address={NAME}:{tcp_port}",
        ],
        ["TCP", "HTTP"],
    )
    daemons.append(nsqd.start())
    topic = unique("moved")
    http_ok(nsqd, "POST", "/topic/create?" + q(topic=topic))
    wait_until(lambda: registered_topics(old) == [[topic]], timeout=10, what="on the old lookupd")
    assert registered_topics(new) == []

    hosts.set(NAME, "::1")
    old.stop()
    wait_until(lambda: registered_topics(new) == [[topic]], timeout=10, what="on the new lookupd")
    assert f"LOOKUP {NAME}:{tcp_port} now resolves to ::1 (was 127.0.0.1)" in nsqd.log
    # and it stays registered there: new topics follow
    second = unique("moved")
    http_ok(nsqd, "POST", "/topic/create?" + q(topic=second))
    wait_until(
        lambda: sorted(registered_topics(new)[0]) == sorted([topic, second]),
        what="the new topic on the new lookupd",
    )


# nsqd's lookupd peers (nsqd/lookup.py) on their own, with a short ping interval, in a process
# that has its own /etc/hosts. They register as an nsqd does; the lines they log go to stdout.
_PEERS_SCRIPT = """
import asyncio, sys
from nsqpy.nsqd.lookup import LookupPeers, nsqd_identity

async def main():
    identity = nsqd_identity("127.0.0.1", 4150, 4151, hostname="mover")
    log = lambda level, text: print(text, flush=True)
    peers = LookupPeers([sys.argv[1]], identity, lambda: [(sys.argv[2], None)], log,
                        ping_interval=0.2)
    await peers.start()
    await asyncio.sleep(120)

asyncio.run(main())
"""


def test_lookup_peer_moves_when_its_name_moves_even_if_the_old_lookupd_answers(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    """Once per ping interval the peer checks where its name leads; the old lookupd staying up
    (a pod that lingers, an address reused) does not keep it there."""
    old = start_nsqlookupd()
    daemons.append(old)
    new = start_nsqlookupd(
        f"--tcp-address=[::1]:{old.tcp_port}", f"--http-address=[::1]:{old.http_port}"
    )
    daemons.append(new)
    hosts = HostsFile(tmp_path / "hosts", {NAME: "127.0.0.1"})
    topic = unique("follow")
    argv = [sys.executable, "-c", _PEERS_SCRIPT, f"{NAME}:{old.tcp_port}", topic]
    peers = subprocess.Popen(hosts.wrap(argv), stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: registered_topics(old) == [[topic]], timeout=10, what="on the old one")
        hosts.set(NAME, "::1")
        wait_until(lambda: registered_topics(new) == [[topic]], timeout=10, what="on the new one")
        wait_until(lambda: registered_topics(old) == [], timeout=10, what="gone from the old one")
    finally:
        peers.kill()
        output, _ = peers.communicate(timeout=10)
    assert f"LOOKUP {NAME}:{old.tcp_port} no longer resolves to 127.0.0.1: reconnecting" in output
    assert f"LOOKUP {NAME}:{old.tcp_port} now resolves to ::1 (was 127.0.0.1)" in output
