"""One chaos run: build the network, start the cluster and the workload, inject the seeded
faults, let the cluster settle, check the histories, write the report; and remove every
namespace, link, mount and process whatever happens (exception, Ctrl-C, SIGTERM)."""

from __future__ import annotations

import atexit
import json
import logging
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from . import checker, report
from .daemons import NSQD_HTTP, NSQD_TCP, Cluster, ClusterOptions
from .faults import FAULT_CLASSES, REPLICATED_FAULT_CLASSES, Fault, Nemesis, make_schedule
from .netns import NAME_PREFIX, Node, Topology, cleanup_prefix
from .spark import SparkArchive, check_archive
from .workload import CHANNEL

#: the pipeline's default archive channel
ARCHIVE_CHANNEL = "archive"

log = logging.getLogger("nsqpy.chaos")


@dataclass
class RunOptions:
    seed: int = 1
    duration: float = 90.0
    out: Path | None = None
    rate: float = 100.0
    publishers: int = 3
    pub_timeout: float = 5.0
    settle: float = 40.0
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    plot: bool = True
    keep_data: bool = False
    spark: bool = False
    spark_settle: float = 120.0
    #: the schedule's classes; None: FAULT_CLASSES, plus node-lost when replicated
    fault_classes: tuple[str, ...] | None = None

    def schedule_classes(self) -> tuple[str, ...]:
        """The classes the schedule draws from (kill-spark joins them with the Spark job)."""
        if self.fault_classes is not None:
            classes = self.fault_classes
        elif self.cluster.replicated:
            classes = REPLICATED_FAULT_CLASSES
        else:
            classes = FAULT_CLASSES
        if self.spark and "kill-spark" not in classes:
            classes = (*classes, "kill-spark")
        return classes


class Workload:
    """A workload process (producers or consumer) inside a client namespace."""

    def __init__(self, node: Node, role: str, args: list[str], out: Path) -> None:
        self.history = out / f"{role}.jsonl"
        self._log: IO[str] = open(out / "logs" / f"{role}.log", "w")  # noqa: SIM115
        argv = [sys.executable, "-m", "nsqpy.chaos", f"workload-{role}", "--history"]
        self.proc = subprocess.Popen(
            node.exec_argv([*argv, str(self.history), *args]),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def events(self) -> list[dict[str, Any]]:
        return checker.read_history(self.history)


class Run:
    def __init__(self, options: RunOptions) -> None:
        self.options = options
        self.prefix = f"{NAME_PREFIX}{secrets.token_hex(3)}-"
        self.out = options.out or Path("chaos-out") / self.prefix.rstrip("-")
        self.topology = Topology(self.prefix)
        self.cluster = Cluster(self.topology, self.out, options.cluster)
        self.workloads: list[Workload] = []
        self.spark: SparkArchive | None = None
        self.faults: list[Fault] = []
        self._cleaned = False

    # ------------------------------------------------------------------ lifecycle

    def execute(self) -> dict[str, Any]:
        """The whole run; returns the report (also written to ``out``)."""
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        atexit.register(self.cleanup)
        previous = signal.signal(signal.SIGTERM, _raise_system_exit)
        try:
            return self._execute()
        finally:
            self.cleanup()
            signal.signal(signal.SIGTERM, previous)
            atexit.unregister(self.cleanup)

    def _execute(self) -> dict[str, Any]:
        opts = self.options
        log.info("building namespaces %s*", self.prefix)
        self.topology.create()
        self.cluster.start()
        log.info("cluster up: nsqd %s, lookupd %s", self.cluster.nsqd_tcp, self.cluster.lookupd_tcp)
        nodes = self.topology.nodes
        consumer = Workload(
            nodes["consumers"],
            "consumer",
            [*(f"--lookupd={a}" for a in self.cluster.lookupd_http)],
            self.out,
        )
        self.workloads.append(consumer)
        producer = Workload(
            nodes["producers"],
            "producer",
            [
                *(f"--nsqd={a}" for a in self.cluster.nsqd_tcp),
                f"--rate={opts.rate}",
                f"--publishers={opts.publishers}",
                f"--timeout={opts.pub_timeout}",
                *(f"--nsqd-http={n.address}:{NSQD_HTTP}" for n in self.topology.of_role("nsqd")),
                f"--channel={CHANNEL}",
                *([f"--channel={ARCHIVE_CHANNEL}"] if opts.spark else []),
            ],
            self.out,
        )
        self.workloads.append(producer)
        start = time.time()
        if opts.spark:
            self.spark = SparkArchive(nodes["consumers"], self.cluster.lookupd_http, self.out)
            self.spark.start()
        self.faults = make_schedule(
            opts.seed,
            opts.duration,
            list(self.cluster.nsqds),
            list(self.cluster.lookupds),
            opts.cluster.msg_timeout,
            opts.schedule_classes(),
        )
        for fault in self.faults:
            if fault.target in self.cluster.nsqds:
                fault.address = f"{nodes[fault.target].address}:{NSQD_TCP}"
        self._run_schedule(start)
        _sleep_until(start + opts.duration)
        producer.stop()
        log.info("workload stopped; settling for up to %.0fs", opts.settle)
        self._settle(producer, consumer, time.time() + opts.settle)
        consumer.stop()
        pubs = producer.events()
        result = self._report(start, pubs, consumer.events())
        if self.spark is not None:
            result["spark"] = self._check_spark(pubs)
        return result

    def _check_spark(self, pubs: list[dict[str, Any]]) -> dict[str, Any]:
        assert self.spark is not None
        acked = {e["n"] for e in pubs if e.get("outcome") == "ok"}
        invoked = {e["n"] for e in pubs if e["op"] == "invoke"}
        log.info("waiting up to %.0fs for the archive", self.options.spark_settle)
        self.spark.wait_for(acked, time.time() + self.options.spark_settle)
        self.spark.stop()
        archive = check_archive(self.spark.archived_rows(), acked, invoked)
        print(
            f"spark archive: {archive['rows']} rows, {archive['rows_after_dedup']} after dedup "
            f"on (nsqd, id); acknowledged missing {archive['missing_acknowledged']}, "
            f"unexpected {archive['unexpected']}, numbers archived twice "
            f"{archive['numbers_archived_twice']}"
        )
        path = self.out / "report.json"
        full = json.loads(path.read_text())
        full["spark"] = archive
        path.write_text(json.dumps(full, indent=2) + "\n")
        return archive

    def _run_schedule(self, start: float) -> None:
        nemesis = Nemesis(self.cluster, self.topology, self.spark)
        for fault in self.faults:
            _sleep_until(start + fault.at)
            try:
                nemesis.inject(fault)
            except Exception as exc:
                fault.errors.append(f"inject: {exc}")
                log.error("fault %s on %s failed: %s", fault.kind, fault.target, exc)
            _sleep_until(start + fault.at + fault.hold)
            try:
                nemesis.heal(fault)
            except Exception as exc:
                fault.errors.append(f"heal: {exc}")
                log.error("healing %s on %s failed: %s", fault.kind, fault.target, exc)

    def _settle(self, producer: Workload, consumer: Workload, deadline: float) -> None:
        """Wait until every acknowledged message was delivered, or the deadline."""
        acked = {e["n"] for e in producer.events() if e.get("outcome") == "ok"}
        while time.time() < deadline:
            delivered = {e.get("n") for e in consumer.events() if e["op"] == "recv"}
            if acked <= delivered:
                return
            time.sleep(1.0)

    def _report(
        self, start: float, pubs: list[dict[str, Any]], recvs: list[dict[str, Any]]
    ) -> dict[str, Any]:
        opts = self.options
        meta = {
            "prefix": self.prefix,
            "seed": opts.seed,
            "duration": opts.duration,
            "started": start,
            "daemons": "go" if opts.cluster.nsqd_bin else "nsqpy",
            "nsqd_bin": opts.cluster.nsqd_bin,
            "nsqlookupd_bin": opts.cluster.nsqlookupd_bin,
            "nsqd_flags": next(iter(self.cluster.nsqds.values())).args[4:7],
            "replication": replication_summary(opts.cluster),
            "fault_classes": list(opts.schedule_classes()),
            "link_faults": "netem" if self.topology.netem else "tbf (no netem in this kernel)",
        }
        faults = [f.as_dict() for f in self.faults]
        return check_and_report(self.out, meta, pubs, recvs, faults, plot=opts.plot)

    def cleanup(self) -> None:
        """Idempotent: stop everything this run started and remove its network."""
        if self._cleaned:
            return
        self._cleaned = True
        if self.spark is not None:
            try:
                self.spark.stop(timeout=10.0)
            except Exception as exc:
                log.error("stopping the Spark job: %s", exc)
        for workload in self.workloads:
            try:
                workload.stop(timeout=5.0)
            except Exception as exc:  # keep going: the namespaces must still go
                log.error("stopping a workload: %s", exc)
        try:
            self.cluster.stop()
        except Exception as exc:
            log.error("stopping the cluster: %s", exc)
        removed = cleanup_prefix(self.prefix)
        log.info("cleaned up %d namespaces/processes/mounts", len(removed))
        data = self.out / f"{self.prefix}data"
        if data.exists() and not self.options.keep_data:
            shutil.rmtree(data, ignore_errors=True)
        (self.out / "faults.json").write_text(
            json.dumps([f.as_dict() for f in self.faults], indent=2) + "\n"
        )


def replication_summary(cluster: ClusterOptions) -> str:
    """How the group replicates, for the report ("none": each nsqd alone)."""
    if not cluster.replicated:
        return "none"
    return (
        f"every nsqd peers with the others, --replica-acks={cluster.replica_acks} "
        f"--replica-timeout={cluster.replica_timeout:g}s, --node-id 1..n"
    )


def check_and_report(
    out: Path,
    meta: dict[str, Any],
    pubs: list[dict[str, Any]],
    recvs: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    *,
    plot: bool,
) -> dict[str, Any]:
    """Check the histories, write report.txt/.json (and chaos.png), print the text."""
    result_report = report.build_report(meta, faults, checker.check(pubs, recvs, faults))
    print(report.write_report(out, result_report), flush=True)
    if plot:
        title = f"{meta['daemons']} daemons, seed {meta['seed']}, {meta['duration']:.0f}s"
        if meta.get("replication", "none") != "none":
            title += ", replicated"
        if report.plot(out / "chaos.png", meta["started"], pubs, recvs, faults, title):
            print(f"plot: {out / 'chaos.png'}")
        else:
            print("no plot: matplotlib is not installed (pip install 'nsqpy[chaos]')")
    print(f"history and logs: {out}")
    return result_report


def recheck(out: Path, *, plot: bool = True) -> dict[str, Any]:
    """Check a finished run's directory again (e.g. after a checker change)."""
    meta = json.loads((out / "report.json").read_text())["run"]
    faults = json.loads((out / "faults.json").read_text())
    pubs = checker.read_history(out / "producer.jsonl")
    recvs = checker.read_history(out / "consumer.jsonl")
    return check_and_report(out, meta, pubs, recvs, faults, plot=plot)


def _raise_system_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.time()
    if delay > 0:
        time.sleep(delay)
