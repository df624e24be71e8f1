"""The run's report: text for people, JSON for tools, and a PNG plot (matplotlib, from the
``chaos`` extra) of acknowledged and delivered messages over time with the faults shaded."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from .checker import CheckResult

FAULT_COLOURS = {
    "kill-nsqd": "tab:red",
    "pause-nsqd": "tab:purple",
    "partition-nsqd": "tab:orange",
    "degrade-link": "tab:olive",
    "kill-lookupd": "tab:brown",
    "disk-full": "tab:cyan",
}


def build_report(
    meta: dict[str, Any], faults: list[dict[str, Any]], result: CheckResult
) -> dict[str, Any]:
    return {
        "run": meta,
        "faults_by_class": dict(Counter(f["kind"] for f in faults if f.get("healed"))),
        "faults": faults,
        "check": result.as_dict(),
    }


def format_text(report: dict[str, Any]) -> str:
    run, check = report["run"], report["check"]
    lines = [
        f"chaos run {run['prefix']} seed={run['seed']} duration={run['duration']}s "
        f"daemons={run['daemons']}",
        f"  nsqd flags: {' '.join(run['nsqd_flags'])}",
        f"  link faults: {run['link_faults']}",
        "faults injected: "
        + (", ".join(f"{k} x{v}" for k, v in sorted(report["faults_by_class"].items())) or "none"),
        f"PUBs attempted {check['attempted']}: acknowledged {check['acknowledged']}, "
        f"refused {check['refused']}, unknown {check['unknown']}",
        f"delivered {check['delivered_unique']} distinct ({check['deliveries']} deliveries), "
        f"duplicated {check['duplicated']}, unknown-outcome delivered "
        f"{check['unknown_delivered']}, refused-but-delivered {check['refused_but_delivered']}",
        f"lost (acknowledged, never delivered): {check['lost']}"
        + (f" e.g. {check['lost_numbers'][:10]}" if check["lost"] else ""),
        "lost, by the fault under way at their acknowledgement (or the next within 10 s): "
        + (", ".join(f"{k} {v}" for k, v in sorted(check["lost_by_fault"].items())) or "-"),
        f"unexpected (delivered, never published): {check['unexpected']}",
        "recovery (heal -> first delivery from that node):",
    ]
    for row in check["recovery"]:
        seconds = "never" if row["seconds"] is None else f"{row['seconds']:.2f}s"
        lines.append(f"  {row['kind']:<15} {row['target']:<9} {seconds}")
    lines.append("result: " + ("VALID" if check["valid"] else "INVALID"))
    return "\n".join(lines)


def write_report(out: Path, report: dict[str, Any]) -> str:
    text = format_text(report)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.txt").write_text(text + "\n")
    return text


def plot(
    out_png: Path,
    start: float,
    pubs: list[dict[str, Any]],
    recvs: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    title: str,
) -> bool:
    """Cumulative acknowledged and delivered (distinct) messages over time, faults shaded.
    Returns False when matplotlib is not installed (``pip install nsqpy[chaos]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    acked = sorted(e["t"] - start for e in pubs if e["op"] == "pub" and e["outcome"] == "ok")
    seen: set[int] = set()
    delivered = []
    for e in sorted((e for e in recvs if e["op"] == "recv"), key=lambda e: e["t"]):
        if e.get("n") is not None and e["n"] not in seen:
            seen.add(e["n"])
            delivered.append(e["t"] - start)
    fig, ax = plt.subplots(figsize=(11, 4.5), dpi=100)
    ax.step(acked, range(1, len(acked) + 1), where="post", label="acknowledged", color="k")
    ax.step(
        delivered,
        range(1, len(delivered) + 1),
        where="post",
        label="delivered (distinct)",
        color="tab:green",
        linestyle="--",
    )
    shown: set[str] = set()
    for fault in faults:
        if fault.get("started") is None:
            continue
        end = fault.get("healed") or fault["started"]
        kind = fault["kind"]
        ax.axvspan(
            fault["started"] - start,
            end - start,
            alpha=0.25,
            color=FAULT_COLOURS.get(kind),
            label=None if kind in shown else kind,
        )
        shown.add(kind)
    ax.set_xlabel("seconds since the workload started")
    ax.set_ylabel("messages")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return True
