"""The benchmark table: nsqd's PUB and SUB beside Go nsqd 1.3, per scenario, with the ratio.

    make bench GO_NSQ_BIN=build/go-nsq        # the whole table, 5-10 minutes (`make go-nsq`)
    python bench/bench_table.py --go-bin DIR --channels 1 --modes default --runfor 1s
    python bench/bench_table.py --before-src /tmp/before/src     # adds an older nsqpy's column

Go's own ``bench_writer`` and ``bench_reader`` are the load for every server: 200-byte
messages in MPUBs of 200 for ``--runfor``, then RDY 2500 with a FIN per message for
``--runfor``, the topic and its channels created over HTTP first, one reader per channel at
once (``bench_nsqd.py --readers all``): SUB is messages delivered across all channels per
second. Each scenario starts a fresh Go nsqd and a fresh nsqpy nsqd in turn (the order
alternates), and reads each nsqd's CPU time, so a cell is ``msgs/s (µs of nsqd CPU per
message)``; with ``--trials`` above 1 the cells are medians. Scenarios: ``--channels``
(1, 10, 100) times ``--modes``:

    default   --mem-queue-size=10000 (nsqd's default)
    gobench   --mem-queue-size=1000000 (Go's bench.sh)
    disk      --mem-queue-size=0 (every message through the disk queues)
    durable   --mem-queue-size=0 --sync-every=1 (nothing acknowledged lost to SIGKILL)

Two more rows, each run once per server: publish -> deliver latency at 10,000 msgs/s with 10
channels (``bench_latency.py``), and the worst round trip of an innocent client beside one
misbehaving connection (``bench_fairness.py`` rows, ``--fairness-rows``).

``--before-src DIR`` adds a column for the nsqpy whose ``src`` is DIR (``git archive <commit>
src | tar -x -C /tmp/before``): its daemons run with ``PYTHONPATH=DIR``, alternating with the
others, so "before" and "after" share the run's conditions.

Go's binaries (nsqd, nsqlookupd, bench_writer, bench_reader) come from ``--go-bin``, else
``$GO_NSQ_BIN``, else ``build/go-nsq`` (what ``make go-nsq`` builds). Without them the table
has nsqpy's column only, with our Python bench_writer.py/bench_reader.py as the load.

The table holds figures only; the machine (cores, Python, commit, load average before and
after) is printed above it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_nsqd import BENCH, Load, Server, Trial, go_trial

REPO = BENCH.parent
LATENCY_RATE = 10000
LATENCY_CHANNELS = 10


@dataclass(frozen=True)
class Mode:
    label: str
    flags: tuple[str, ...]


MODES: dict[str, Mode] = {
    "default": Mode("`--mem-queue-size=10000` (default)", ("--mem-queue-size=10000",)),
    "gobench": Mode("`--mem-queue-size=1000000` (Go's bench.sh)", ("--mem-queue-size=1000000",)),
    "disk": Mode("`--mem-queue-size=0`", ("--mem-queue-size=0",)),
    "durable": Mode(
        "`--mem-queue-size=0 --sync-every=1`", ("--mem-queue-size=0", "--sync-every=1")
    ),
}
#: Column headers by server kind.
TITLES = {"go": "Go nsqd 1.3", "nsqpy": "nsqpy", "before": "nsqpy before"}


@dataclass
class Setup:
    """Where each server's daemons come from, and the load."""

    go_bin: Path | None
    before_src: Path | None
    kinds: list[str]

    def nsqd(self, kind: str, flags: tuple[str, ...], data: str) -> Server:
        if kind == "go":
            assert self.go_bin is not None
            return Server(kind, [str(self.go_bin / "nsqd"), *flags], data)
        return Server(kind, [sys.executable, "-m", "nsqpy.nsqd", *flags], data, env=self.env(kind))

    def env(self, kind: str) -> dict[str, str] | None:
        if kind != "before" or self.before_src is None:
            return None
        return {**os.environ, "PYTHONPATH": str(self.before_src)}


# ------------------------------------------------------------------------------ throughput


@dataclass
class Cell:
    rate: float
    cpu_us: float
    drained: bool = False

    def text(self) -> str:
        mark = "≥" if self.drained else ""
        return f"{mark}{self.rate:,.0f} ({self.cpu_us:.2f} µs)"


def median_cells(trials: list[Trial]) -> tuple[Cell, Cell]:
    """PUB and SUB of a server's trials: medians; SUB a lower bound if any reader ran dry."""
    pub = Cell(
        statistics.median(t.pub for t in trials), statistics.median(t.pub_cpu_us for t in trials)
    )
    sub = Cell(
        statistics.median(t.sub for t in trials),
        statistics.median(t.sub_cpu_us for t in trials),
        any(t.drained for t in trials),
    )
    return pub, sub


def rotated(kinds: list[str], turn: int) -> list[str]:
    """The servers' order for one turn: each goes first in turn, so none always runs cold."""
    shift = turn % len(kinds)
    return kinds[shift:] + kinds[:shift]


def run_scenario(
    setup: Setup, mode: Mode, load: Load, trials: int, turn: int
) -> dict[str, tuple[Cell, Cell]]:
    runs: dict[str, list[Trial]] = {kind: [] for kind in setup.kinds}
    for trial in range(trials):
        for kind in rotated(setup.kinds, turn + trial):
            with tempfile.TemporaryDirectory() as data:
                result = go_trial(setup.nsqd(kind, mode.flags, data), load)
            runs[kind].append(result)
            progress(
                f"{load.channels:>3} ch, {' '.join(mode.flags):36} {kind:6}: "
                f"PUB {result.pub:10,.0f}/s ({result.pub_cpu_us:.2f} us)  "
                f"SUB {result.sub:10,.0f}/s ({result.sub_cpu_us:.2f} us)"
                f"{' drained' if result.drained else ''}  longest pause "
                f"{f'{result.pause_ms:.1f} ms' if result.pause_ms else '-'}"
                f"  load {os.getloadavg()[0]:.1f}"
            )
    return {kind: median_cells(runs[kind]) for kind in setup.kinds}


# --------------------------------------------------------------------- latency and fairness


def latency_row(setup: Setup, runfor: str) -> dict[str, Cell | str]:
    """Publish -> deliver at LATENCY_RATE msgs/s with LATENCY_CHANNELS channels, one run each."""
    import bench_latency

    args = argparse.Namespace(runfor=runfor, size=200, rdy=2500, channels=LATENCY_CHANNELS)
    cells: dict[str, Cell | str] = {}
    for kind in setup.kinds:
        with tempfile.TemporaryDirectory() as data:
            found = bench_latency.run_once(setup.nsqd(kind, (), data), LATENCY_RATE, args)
        progress(f"latency {kind:6}: p50 {found['p50']:.2f} ms  p99 {found['p99']:.2f} ms")
        cells[kind] = f"{found['p50']:.2f} / {found['p99']:.2f} ms"
        cells[f"{kind}:ratio"] = Cell(found["p99"], 0.0)
    return cells


def fairness_rows(setup: Setup, rows: str, duration: float) -> list[tuple[str, dict[str, Any]]]:
    """``bench_fairness.py`` rows: the innocent client's worst round trip per probe."""
    import bench_fairness

    go = setup.go_bin
    args = bench_fairness.build_parser().parse_args([])
    args.go_nsqd = str(go / "nsqd") if go else ""
    args.go_nsqlookupd = str(go / "nsqlookupd") if go else ""
    args.duration = duration
    keys = bench_fairness.selected_rows(rows)
    extras: dict[str, Any] = {}
    if "2" in keys:
        extras["deflate"] = bench_fairness.deflate_payload()
    auth = bench_fairness.AuthServer() if "10" in keys else None
    if auth is not None:
        extras["auth_port"] = auth.port
    found: list[tuple[str, dict[str, Any]]] = []
    try:
        for index, key in enumerate(keys):
            cells: dict[str, Any] = {}
            for kind in rotated(setup.kinds, index):
                before = str(setup.before_src) if kind == "before" else ""
                run_args = argparse.Namespace(**{**vars(args), "nsqpy_src": before})
                daemon_kind = "go" if kind == "go" else "nsqpy"
                measured = bench_fairness.run_row(key, daemon_kind, run_args, extras)
                worst = {
                    name: max(probe["times"] or [0.0]) * 1e3
                    for name, probe in sorted(measured.probes.items())
                }
                shown = ", ".join(f"{name} {ms:.1f} ms" for name, ms in worst.items())
                progress(f"fairness {key} {kind:6}: worst {shown}")
                cells[kind] = " / ".join(f"{ms:.1f}" for ms in worst.values()) + " ms"
                cells[f"{kind}:ratio"] = Cell(max(worst.values(), default=0.0), 0.0)
                cells["probes"] = " / ".join(worst)
            found.append((f"{key}. {bench_fairness.ROWS[key].title}", cells))
    finally:
        if auth is not None:
            auth.close()
    return found


# ---------------------------------------------------------------------------------- table


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


class Table:
    """One markdown table: a label column, a "what" column, then each server and ratios."""

    def __init__(self, kinds: list[str]) -> None:
        self.kinds = kinds
        # Ratios are against Go's column when there is one, else "nsqpy / before".
        self.base = "go" if "go" in kinds else ("before" if "before" in kinds else "")
        headers = ["scenario", "figure"]
        for kind in kinds:
            headers.append(TITLES[kind])
            if self.base and kind != self.base:
                headers.append(f"{TITLES[kind]} / {TITLES[self.base]}")
        self.lines = ["| " + " | ".join(headers) + " |", "|---" * len(headers) + "|"]

    def add(
        self, label: str, what: str, cells: dict[str, Any], value: Callable[[Any], float]
    ) -> None:
        row = [label, what]
        for kind in self.kinds:
            cell = cells[kind]
            row.append(cell.text() if isinstance(cell, Cell) else str(cell))
            if self.base and kind != self.base:
                mine = cells.get(f"{kind}:ratio", cell)
                base = cells.get(f"{self.base}:ratio", cells[self.base])
                row.append(f"**{ratio(value(mine), value(base))}**")
        self.lines.append("| " + " | ".join(row) + " |")


def machine_line(go_bin: Path | None) -> str:
    commit = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    go = "no Go binaries"
    if go_bin is not None:
        version = subprocess.run(
            [str(go_bin / "nsqd"), "--version"], capture_output=True, text=True, check=False
        )
        go = (version.stdout or version.stderr).strip() or "Go nsqd (version unknown)"
    return (
        f"{os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}, nsqpy at {commit or 'unknown commit'}, {go}"
    )


GO_TOOLS = ("nsqd", "nsqlookupd", "bench_writer", "bench_reader")


def find_go_bin(given: str) -> Path | None:
    """Go's binaries: ``--go-bin``, else ``$GO_NSQ_BIN``, else ``build/go-nsq`` if built."""
    named = given or os.environ.get("GO_NSQ_BIN", "")
    candidate = Path(named) if named else REPO / "build" / "go-nsq"
    missing = [tool for tool in GO_TOOLS if not (candidate / tool).is_file()]
    if not missing:
        return candidate.resolve()
    if named:
        raise SystemExit(f"{named} lacks Go's {', '.join(missing)}")
    return None


def without_go() -> str:
    """Why there is no Go column, or SystemExit when Go could be had in a minute."""
    if shutil.which("go"):
        raise SystemExit(
            "Go's nsqd and bench tools not found: `make go-nsq` builds them into build/go-nsq "
            "(then `make bench`), or pass --nsqpy-only for nsqpy's column alone"
        )
    return "Go is not installed"


def loads(averages: tuple[float, float, float]) -> str:
    return " ".join(f"{value:.2f}" for value in averages)


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--go-bin", default="", help="directory of Go's nsqd and bench tools")
    parser.add_argument("--before-src", default="", help="an older nsqpy's src, as a column")
    parser.add_argument(
        "--nsqpy-only", action="store_true", help="no Go column (our Python tools as the load)"
    )
    parser.add_argument("--channels", default="1,10,100", help="channel counts, e.g. 1,10")
    parser.add_argument("--modes", default=",".join(MODES), help=f"subset of {','.join(MODES)}")
    parser.add_argument("--runfor", default="4s", help="the writer's and the reader's duration")
    parser.add_argument("--trials", type=int, default=1, help="runs per server (median)")
    parser.add_argument(
        "--latency-runfor", default="5s", help="the latency row's run ('' skips it)"
    )
    parser.add_argument(
        "--fairness-rows", default="1,3", help="bench_fairness.py rows ('' skips them)"
    )
    parser.add_argument("--fairness-duration", type=float, default=5.0, help="seconds per row")
    args = parser.parse_args(argv)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {','.join(sorted(unknown))}: choose from {','.join(MODES)}")
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    go_bin = None if args.nsqpy_only else find_go_bin(args.go_bin)
    why = ""
    if go_bin is None:
        why = "--nsqpy-only" if args.nsqpy_only else without_go()
    before = Path(args.before_src).resolve() if args.before_src else None
    if before is not None and not (before / "nsqpy").is_dir():
        raise SystemExit(f"--before-src {before} holds no nsqpy package (want a tree's src/)")
    kinds = (["go"] if go_bin else []) + ["nsqpy"] + (["before"] if before else [])
    setup = Setup(go_bin, before, kinds)
    load_before = os.getloadavg()
    table = Table(kinds)
    turn = 0
    for mode_name in args.modes.split(","):
        mode = MODES[mode_name]
        for channels in [int(n) for n in args.channels.split(",")]:
            load = Load(
                str(go_bin) if go_bin else None,
                runfor=args.runfor,
                writer_runfor=args.runfor,
                channels=channels,
                readers="all",
            )
            cells = run_scenario(setup, mode, load, args.trials, turn)
            turn += 1
            label = f"{channels} channel{'s' if channels > 1 else ''}, {mode.label}"
            pubs = {kind: pub for kind, (pub, _) in cells.items()}
            subs = {kind: sub for kind, (_, sub) in cells.items()}
            table.add(label, "PUB msgs/s", pubs, lambda cell: cell.rate)
            table.add(label, "SUB msgs/s", subs, lambda cell: cell.rate)
    if args.latency_runfor:
        label = f"publish -> deliver, {LATENCY_RATE:,} msgs/s, {LATENCY_CHANNELS} channels"
        table.add(label, "p50 / p99", latency_row(setup, args.latency_runfor), lambda c: c.rate)
    if args.fairness_rows:
        for title, found in fairness_rows(setup, args.fairness_rows, args.fairness_duration):
            what = f"worst {found['probes']}"
            table.add(f"fairness {title}", what, found, lambda c: c.rate)
    print(f"Machine: {machine_line(go_bin)}")
    load_after = os.getloadavg()
    print(f"Load average (1, 5, 15 min): before {loads(load_before)}, after {loads(load_after)}")
    if why:
        print(f"No Go column ({why}): the load is our Python bench_writer.py/bench_reader.py.")
    print(
        f"\n`bench/bench_table.py --runfor {args.runfor} --trials {args.trials}`: "
        "msgs/s (µs of nsqd CPU per message); SUB is summed over one reader per channel; "
        "≥ marks a SUB whose reader emptied its channel (a lower bound); a throughput ratio "
        "above 1 is faster; the latency ratio compares p99s and the fairness ratio the worst "
        "round trips, where below 1 is better.\n"
    )
    print("\n".join(table.lines))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
