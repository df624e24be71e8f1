"""The cluster's daemons, each started inside its node's namespace.

``ip netns exec`` execs the daemon in place, so the child's PID is the daemon's own: kill -9,
SIGSTOP and SIGCONT reach it directly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nsqpy.testing import DaemonProcess

from .netns import Node, Topology, run_ip

NSQD_TCP, NSQD_HTTP = 4150, 4151
LOOKUPD_TCP, LOOKUPD_HTTP = 4160, 4161


class NetnsDaemon(DaemonProcess):
    """A daemon (ours via ``-m module``, or a binary such as Go's) inside a namespace."""

    def __init__(
        self,
        node: Node,
        module: str,
        args: Sequence[str],
        *,
        binary: str | None,
        log_path: Path,
    ) -> None:
        super().__init__(module, args, ["TCP", "HTTP"], log_path=log_path, new_session=True)
        self.node = node
        self.binary = binary
        self.paused = False

    def command(self) -> list[str]:
        program = [self.binary] if self.binary else [sys.executable, "-m", self.module]
        return self.node.exec_argv([*program, *self.args])

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        if sig == signal.SIGSTOP:
            self.paused = True
        elif sig == signal.SIGCONT:
            self.paused = False

    def kill9(self) -> None:
        if self.paused:
            self.signal(signal.SIGCONT)
        self.kill()

    def shutdown(self) -> None:
        if self.paused:
            self.signal(signal.SIGCONT)
        self.stop(timeout=5.0)


@dataclass
class ClusterOptions:
    nsqd_bin: str | None = None
    nsqlookupd_bin: str | None = None
    mem_queue_size: int = 0
    sync_every: int = 1
    msg_timeout: float = 5.0
    data_size: str = "64m"
    extra_nsqd_args: tuple[str, ...] = ()
    #: one replication group (docs/replication.md): every nsqd lists the others as peers
    replicated: bool = False
    replica_acks: int = 2
    replica_timeout: float = 3.0

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """Why these options cannot run, or None."""
        if not self.replicated:
            return None
        if self.nsqd_bin:
            return (
                f"--replicated needs nsqpy's nsqd, not --nsqd-bin {self.nsqd_bin}: Go's nsqd "
                "has no --replica-* flags (run Go's daemons unreplicated, e.g. with "
                "--faults to give them the same fault classes)"
            )
        if self.replica_acks < 1:
            return "--replica-acks must be at least 1"
        if self.replica_timeout <= 0:
            return "--replica-timeout must be positive"
        return None


def nsqd_args(
    options: ClusterOptions,
    index: int,
    address: str,
    data: Path,
    lookupd_tcp: Sequence[str],
    nsqd_tcp: Sequence[str],
) -> list[str]:
    """The flags of the ``index``-th nsqd (0-based) listening on ``address``; ``nsqd_tcp`` is
    every nsqd's TCP address, its own included (its peers when replicated)."""
    own_tcp = f"{address}:{NSQD_TCP}"
    args = [
        f"--tcp-address={own_tcp}",
        f"--http-address={address}:{NSQD_HTTP}",
        f"--broadcast-address={address}",
        f"--data-path={data}",
        f"--mem-queue-size={options.mem_queue_size}",
        f"--sync-every={options.sync_every}",
        f"--msg-timeout={_go_duration(options.msg_timeout)}",
        *(f"--lookupd-tcp-address={a}" for a in lookupd_tcp),
    ]
    if options.replicated:
        # message IDs are built from --node-id: a node taking over another's messages must
        # not mint the same IDs, and all nodes share one host name (the default's source)
        args += [
            f"--node-id={index + 1}",
            *(f"--replica-peer={peer}" for peer in nsqd_tcp if peer != own_tcp),
            f"--replica-acks={options.replica_acks}",
            f"--replica-timeout={_go_duration(options.replica_timeout)}",
        ]
    return [*args, *options.extra_nsqd_args]


class Cluster:
    """3 nsqd + 2 nsqlookupd on a :class:`Topology`; each nsqd's data path is its own small
    tmpfs (so a full disk can be made and undone on one node)."""

    def __init__(self, topology: Topology, workdir: Path, options: ClusterOptions) -> None:
        self.topology = topology
        self.workdir = workdir
        self.options = options
        self.lookupds: dict[str, NetnsDaemon] = {}
        self.nsqds: dict[str, NetnsDaemon] = {}

    @property
    def lookupd_tcp(self) -> list[str]:
        return [f"{n.address}:{LOOKUPD_TCP}" for n in self.topology.of_role("lookupd")]

    @property
    def lookupd_http(self) -> list[str]:
        return [f"{n.address}:{LOOKUPD_HTTP}" for n in self.topology.of_role("lookupd")]

    @property
    def nsqd_tcp(self) -> list[str]:
        return [f"{n.address}:{NSQD_TCP}" for n in self.topology.of_role("nsqd")]

    def data_path(self, name: str) -> Path:
        return self.workdir / f"{self.topology.prefix}data" / name

    def start(self) -> None:
        opts = self.options
        for node in self.topology.of_role("lookupd"):
            args = [
                f"--tcp-address={node.address}:{LOOKUPD_TCP}",
                f"--http-address={node.address}:{LOOKUPD_HTTP}",
                f"--broadcast-address={node.address}",
            ]
            self.lookupds[node.name] = NetnsDaemon(
                node,
                "nsqpy.nsqlookupd",
                args,
                binary=opts.nsqlookupd_bin,
                log_path=self.workdir / "logs" / f"{node.name}.log",
            )
        for index, node in enumerate(self.topology.of_role("nsqd")):
            data = self.data_path(node.name)
            data.mkdir(parents=True, exist_ok=True)
            run_ip(["mount", "-t", "tmpfs", "-o", f"size={opts.data_size}", "tmpfs", str(data)])
            args = nsqd_args(opts, index, node.address, data, self.lookupd_tcp, self.nsqd_tcp)
            self.nsqds[node.name] = NetnsDaemon(
                node,
                "nsqpy.nsqd",
                args,
                binary=opts.nsqd_bin,
                log_path=self.workdir / "logs" / f"{node.name}.log",
            )
        for group in (self.lookupds, self.nsqds):
            for daemon in group.values():
                daemon.launch()
            for daemon in group.values():
                daemon.wait_ready(30.0)

    def daemon(self, name: str) -> NetnsDaemon:
        return self.nsqds.get(name) or self.lookupds[name]

    def restart(self, name: str) -> None:
        daemon = self.daemon(name)
        for _ in range(3):  # the address can take a moment to be free after kill -9
            try:
                daemon.start(30.0)
                return
            except RuntimeError:
                time.sleep(1.0)
        daemon.start(30.0)

    def stop(self) -> None:
        for group in (self.nsqds, self.lookupds):
            for daemon in group.values():
                try:
                    daemon.shutdown()
                except (OSError, subprocess.SubprocessError):
                    daemon.kill()


def _go_duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"
