"""The harness's private network: one namespace per node, veth links to a bridge in a "switch"
namespace, addresses from 198.18.0.0/15 (RFC 2544's benchmark range).

Nothing here touches the host's own interfaces: every link is created inside the run's
switch namespace with its peer moved straight into the node's namespace, so deleting the
namespaces removes every link. Names start with a per-run prefix, which is what
:func:`cleanup_prefix` looks for after a crash.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("nsqpy.chaos")

#: every run's namespaces start with this (and then a per-run id)
NAME_PREFIX = "nsqchaos-"
SUBNET = "198.18.0"
PREFIX_LEN = 24
BRIDGE = "br0"


class NetworkError(RuntimeError):
    """An ``ip``/``tc`` command failed."""


def run_ip(args: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip``/``tc``/``mount`` and friends; a failure raises with the command's stderr."""
    proc = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetworkError(f"{' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


@dataclass
class Node:
    """A namespace with one interface (``eth0``) on the run's bridge."""

    role: str  # "nsqd", "lookupd" or "client"
    name: str  # short name, e.g. "nsqd1"
    netns: str  # the namespace's full name (prefix + name)
    address: str  # its IPv4 address
    peer: str  # the veth end in the switch namespace
    blackholed: set[str] = field(default_factory=set)

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]


class Topology:
    """The run's namespaces and links, built by :meth:`create`, removed by :meth:`destroy`."""

    def __init__(self, prefix: str, nsqd_count: int = 3, lookupd_count: int = 2) -> None:
        self.prefix = prefix
        self.switch = f"{prefix}sw"
        self.nodes: dict[str, Node] = {}
        specs = [("nsqd", f"nsqd{i + 1}", 11 + i) for i in range(nsqd_count)]
        specs += [("lookupd", f"lookupd{i + 1}", 21 + i) for i in range(lookupd_count)]
        specs += [("client", "producers", 31), ("client", "consumers", 32)]
        for role, name, host in specs:
            self.nodes[name] = Node(
                role, name, f"{prefix}{name}", f"{SUBNET}.{host}", f"v-{name}"[:15]
            )
        self.netem = False  # set by create(): whether the kernel has the netem qdisc

    def of_role(self, role: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.role == role]

    # ------------------------------------------------------------------ build / tear down

    def create(self) -> None:
        self._add_netns(self.switch)
        sw = ["ip", "-n", self.switch]
        run_ip([*sw, "link", "add", BRIDGE, "type", "bridge"])
        run_ip([*sw, "link", "set", BRIDGE, "up"])
        for node in self.nodes.values():
            self._add_netns(node.netns)
            veth = ["type", "veth", "peer", "name", "eth0", "netns", node.netns]
            run_ip([*sw, "link", "add", node.peer, *veth])
            run_ip([*sw, "link", "set", node.peer, "master", BRIDGE])
            run_ip([*sw, "link", "set", node.peer, "up"])
            inside = ["ip", "-n", node.netns]
            run_ip([*inside, "addr", "add", f"{node.address}/{PREFIX_LEN}", "dev", "eth0"])
            run_ip([*inside, "link", "set", "eth0", "up"])
        self.netem = self._probe_netem()

    def _add_netns(self, name: str) -> None:
        run_ip(["ip", "netns", "add", name])
        run_ip(["ip", "-n", name, "link", "set", "lo", "up"])

    def _probe_netem(self) -> bool:
        probe = run_ip(
            ["tc", "-n", self.switch, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
            check=False,
        )
        if probe.returncode == 0:
            run_ip(["tc", "-n", self.switch, "qdisc", "del", "dev", "lo", "root"], check=False)
        return probe.returncode == 0

    def destroy(self) -> None:
        cleanup_prefix(self.prefix)

    # ------------------------------------------------------------------ faults

    def partition(self, isolated: Node, others: Sequence[Node]) -> None:
        """Cut ``isolated`` off from ``others`` both ways: blackhole routes on each side, so
        packets vanish silently (as on a dead switch port), while the rest still reach it."""
        for other in others:
            self._blackhole(isolated, other.address, add=True)
            self._blackhole(other, isolated.address, add=True)

    def heal_partition(self) -> None:
        for node in self.nodes.values():
            for address in list(node.blackholed):
                self._blackhole(node, address, add=False)

    def _blackhole(self, node: Node, address: str, *, add: bool) -> None:
        verb = "add" if add else "del"
        run_ip(["ip", "-n", node.netns, "route", verb, "blackhole", f"{address}/32"])
        if add:
            node.blackholed.add(address)
        else:
            node.blackholed.discard(address)

    def degrade_link(self, node: Node, delay_ms: int, loss_percent: int) -> str:
        """Delay and drop packets both ways on ``node``'s link; returns how (for the report).

        With netem: its delay and random loss. Kernels without netem (some VMs) get a token
        bucket instead: a slow link (64 kbit/s) whose queue adds up to ``delay_ms`` of delay
        and drops what overflows it, which is loss and delay too, only not random."""
        ends = [(node.netns, "eth0"), (self.switch, node.peer)]
        for netns, dev in ends:
            if self.netem:
                shape = ["netem", "delay", f"{delay_ms}ms", "loss", f"{loss_percent}%"]
            else:
                shape = ["tbf", "rate", "64kbit", "burst", "4kb", "latency", f"{delay_ms}ms"]
            run_ip(["tc", "-n", netns, "qdisc", "add", "dev", dev, "root", *shape])
        if self.netem:
            return f"netem delay {delay_ms}ms loss {loss_percent}%"
        return f"tbf 64kbit latency {delay_ms}ms (no netem in this kernel)"

    def restore_link(self, node: Node) -> None:
        for netns, dev in [(node.netns, "eth0"), (self.switch, node.peer)]:
            run_ip(["tc", "-n", netns, "qdisc", "del", "dev", dev, "root"], check=False)


# ---------------------------------------------------------------------- leftovers


def list_netns(prefix: str) -> list[str]:
    out = run_ip(["ip", "netns", "list"], check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix)]


def netns_pids(netns: str) -> list[int]:
    out = run_ip(["ip", "netns", "pids", netns], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def mounts_under(marker: str) -> list[str]:
    """Mount points whose path contains ``marker`` (the run's tmpfs data paths)."""
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 1 and marker in fields[1]:
            points.append(fields[1])
    return points


def cleanup_prefix(prefix: str) -> list[str]:
    """Kill every process inside a namespace named ``prefix*``, delete those namespaces (and
    with them every veth and the bridge), unmount the run's tmpfs. Returns what it removed."""
    if not prefix.startswith(NAME_PREFIX):
        raise ValueError(f"refusing to clean up names not starting with {NAME_PREFIX!r}")
    removed = []
    names = list_netns(prefix)
    for name in names:
        for pid in netns_pids(name):
            try:
                os.kill(pid, signal.SIGCONT)  # a stopped process must run to die
                os.kill(pid, signal.SIGKILL)
                removed.append(f"process {pid} in {name}")
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    while any(netns_pids(n) for n in names) and time.monotonic() < deadline:
        time.sleep(0.05)
    for name in names:
        run_ip(["ip", "netns", "del", name], check=False)
        removed.append(f"netns {name}")
    for point in mounts_under(prefix):
        run_ip(["umount", "-l", point], check=False)
        removed.append(f"mount {point}")
    return removed
