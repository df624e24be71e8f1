"""The faults and their seeded schedule: one fault at a time (a nemesis in Jepsen's terms),
injected, held, healed, then a quiet gap before the next."""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .daemons import Cluster
from .netns import Topology
from .spark import SparkArchive

log = logging.getLogger("nsqpy.chaos")

FAULT_CLASSES = (
    "kill-nsqd",
    "pause-nsqd",
    "partition-nsqd",
    "degrade-link",
    "kill-lookupd",
    "disk-full",
)
#: kill -9, the data path emptied, a restart on the empty data path: the loss of a machine
NODE_LOST = "node-lost"
#: a replicated group's classes: a node's loss is what replication is for
REPLICATED_FAULT_CLASSES = (*FAULT_CLASSES, NODE_LOST)
#: every class a schedule may be made of (kill-spark only with the Spark job)
KNOWN_FAULT_CLASSES = (*REPLICATED_FAULT_CLASSES, "kill-spark")


@dataclass
class Fault:
    kind: str
    target: str
    at: float  # seconds after the workload starts
    hold: float  # seconds between injection and heal
    address: str = ""  # an nsqd's TCP address (host:port), as deliveries name it
    # filled in while it runs: wall-clock times and how it was done
    started: float | None = None
    healed: float | None = None
    detail: str = ""
    data_lost: str = ""  # the node whose data path was emptied (node-lost), else ""
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_schedule(
    seed: int,
    duration: float,
    nsqds: list[str],
    lookupds: list[str],
    msg_timeout: float,
    classes: tuple[str, ...] = FAULT_CLASSES,
) -> list[Fault]:
    """Faults until ``duration`` seconds. The first round has every class once (in a seeded
    order), so even a short run covers them all; after that the class is drawn at random."""
    rng = random.Random(seed)
    first_round = list(classes)
    rng.shuffle(first_round)
    schedule: list[Fault] = []
    at = rng.uniform(3.0, 5.0)  # let the workload get going first
    while True:
        kind = first_round.pop(0) if first_round else rng.choice(classes)
        if kind == "kill-spark":
            target = "spark"
        else:
            target = rng.choice(lookupds if kind == "kill-lookupd" else nsqds)
        if kind == "pause-nsqd":
            hold = msg_timeout + rng.uniform(2.0, 4.0)  # long enough for in-flight to expire
        else:
            hold = rng.uniform(4.0, 8.0)
        if at + hold > duration:
            break
        schedule.append(Fault(kind, target, round(at, 3), round(hold, 3)))
        at += hold + rng.uniform(3.0, 6.0)
    return schedule


class Nemesis:
    """Injects and heals faults on a cluster."""

    def __init__(
        self, cluster: Cluster, topology: Topology, spark: SparkArchive | None = None
    ) -> None:
        self.cluster = cluster
        self.topology = topology
        self.spark = spark

    def inject(self, fault: Fault) -> None:
        fault.started = time.time()
        getattr(self, "_start_" + fault.kind.replace("-", "_"))(fault)
        log.info("fault %s on %s: %s", fault.kind, fault.target, fault.detail)

    def heal(self, fault: Fault) -> None:
        getattr(self, "_heal_" + fault.kind.replace("-", "_"))(fault)
        fault.healed = time.time()
        log.info("healed %s on %s", fault.kind, fault.target)

    # kill -9, then a restart on the same data path
    def _start_kill_nsqd(self, fault: Fault) -> None:
        self.cluster.daemon(fault.target).kill9()
        fault.detail = "kill -9"

    def _heal_kill_nsqd(self, fault: Fault) -> None:
        self.cluster.restart(fault.target)

    _start_kill_lookupd = _start_kill_nsqd
    _heal_kill_lookupd = _heal_kill_nsqd

    # kill -9, everything under its data path removed (the tmpfs mount stays), a restart on
    # the empty data path: the machine and its disk are gone, a blank one takes their place
    def _start_node_lost(self, fault: Fault) -> None:
        self.cluster.daemon(fault.target).kill9()
        files, size = empty_directory(self.cluster.data_path(fault.target))
        fault.data_lost = fault.target
        fault.detail = f"kill -9, data path emptied ({files} files, {size} bytes)"

    def _heal_node_lost(self, fault: Fault) -> None:
        self.cluster.restart(fault.target)

    # SIGSTOP for longer than msg_timeout
    def _start_pause_nsqd(self, fault: Fault) -> None:
        self.cluster.daemon(fault.target).signal(signal.SIGSTOP)
        fault.detail = "SIGSTOP"

    def _heal_pause_nsqd(self, fault: Fault) -> None:
        self.cluster.daemon(fault.target).signal(signal.SIGCONT)

    # the nsqd cannot reach (or be reached by) the consumers and the lookupds; producers can
    def _start_partition_nsqd(self, fault: Fault) -> None:
        nodes = self.topology.nodes
        others = [nodes["consumers"], *self.topology.of_role("lookupd")]
        self.topology.partition(nodes[fault.target], others)
        fault.detail = "blackhole routes to/from " + ", ".join(o.name for o in others)

    def _heal_partition_nsqd(self, fault: Fault) -> None:
        self.topology.heal_partition()

    def _start_degrade_link(self, fault: Fault) -> None:
        node = self.topology.nodes[fault.target]
        fault.detail = self.topology.degrade_link(node, delay_ms=200, loss_percent=20)

    def _heal_degrade_link(self, fault: Fault) -> None:
        self.topology.restore_link(self.topology.nodes[fault.target])

    # the Spark archive job's driver (and its JVM) killed, then restarted on its checkpoint
    def _start_kill_spark(self, fault: Fault) -> None:
        assert self.spark is not None
        self.spark.kill9()
        fault.detail = "kill -9 of the driver's process group"

    def _heal_kill_spark(self, fault: Fault) -> None:
        assert self.spark is not None
        self.spark.start()

    # the nsqd's tmpfs data path filled to the last byte, then emptied again
    def _start_disk_full(self, fault: Fault) -> None:
        filler = self.cluster.data_path(fault.target) / "chaos-filler"
        written = fill(filler)
        fault.detail = f"filled the tmpfs data path ({written} bytes)"

    def _heal_disk_full(self, fault: Fault) -> None:
        (self.cluster.data_path(fault.target) / "chaos-filler").unlink(missing_ok=True)


def empty_directory(path: os.PathLike[str] | str) -> tuple[int, int]:
    """Remove everything inside ``path`` but not ``path`` itself (a mount point stays
    mounted); returns how many files and bytes went."""
    files = size = 0
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            for root, _dirs, names in os.walk(entry.path):
                for name in names:
                    files += 1
                    size += os.lstat(os.path.join(root, name)).st_size
            shutil.rmtree(entry.path)
        else:
            files += 1
            size += entry.stat(follow_symlinks=False).st_size
            os.unlink(entry.path)
    return files, size


def fill(path: os.PathLike[str] | str) -> int:
    """Write ``path`` until the filesystem refuses another byte."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            block = bytes(chunk)
            while True:
                try:
                    written += os.write(fd, block)
                except OSError:
                    break
    finally:
        os.close(fd)
    return written
