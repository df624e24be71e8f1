"""The run's report: text for people, JSON for tools, and a PNG plot (matplotlib, from the
``chaos`` extra) of acknowledged and delivered messages over time with the faults shaded."""

from __future__ import annotations

import json
import statistics
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
    "node-lost": "tab:pink",
    "kill-spark": "tab:gray",
}


def build_report(
    meta: dict[str, Any], faults: list[dict[str, Any]], result: CheckResult
) -> dict[str, Any]:
    return {
        "run": meta,
        "faults_by_class": dict(Counter(f["kind"] for f in faults if f.get("healed"))),
        "faults": faults,
        "check": result.as_dict(),
        "recovery_by_class": recovery_summary(result.recovery),
    }


def format_text(report: dict[str, Any]) -> str:
    run, check = report["run"], report["check"]
    lines = [
        f"chaos run {run['prefix']} seed={run['seed']} duration={run['duration']}s "
        f"daemons={run['daemons']}",
        f"  nsqd flags: {' '.join(run['nsqd_flags'])}",
        f"  link faults: {run['link_faults']}",
        f"  replication: {run.get('replication', 'none')}",
        "faults injected: "
        + (", ".join(f"{k} x{v}" for k, v in sorted(report["faults_by_class"].items())) or "none"),
        "data lost (node-lost: killed, data path emptied, restarted empty): "
        + (", ".join(data_lost_rows(report["faults"], run.get("started"))) or "-"),
        f"PUBs attempted {check['attempted']}: acknowledged {check['acknowledged']}, "
        f"refused {check['refused']}, unknown {check['unknown']}",
        f"delivered {check['delivered_unique']} distinct ({check['deliveries']} deliveries), "
        f"duplicated {check['duplicated']} "
        f"({check.get('duplicated_across_nsqds', 0)} by two or more nsqds), "
        "unknown-outcome delivered "
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
        data_lost = f"  (data lost: {row['data_lost']})" if row.get("data_lost") else ""
        lines.append(f"  {row['kind']:<15} {row['target']:<9} {seconds}{data_lost}")
    lines.append("recovery by class (count, median, max, never):")
    for kind, row in recovery_summary(check["recovery"]).items():
        lines.append(
            f"  {kind:<15} {row['count']:>3}  {row['median']:>6.2f}s {row['max']:>6.2f}s"
            f"  {row['never']}"
        )
    lines.append("result: " + ("VALID" if check["valid"] else "INVALID"))
    return "\n".join(lines)


def data_lost_rows(faults: list[dict[str, Any]], started: float | None) -> list[str]:
    """``nsqd3 at +18.6s`` for each fault that emptied a node's data path."""
    rows = []
    for fault in faults:
        if not fault.get("data_lost"):
            continue
        at = fault.get("started")
        when = f" at +{at - started:.1f}s" if at is not None and started is not None else ""
        rows.append(f"{fault['data_lost']}{when}")
    return rows


def recovery_summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by_kind: dict[str, list[float | None]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], []).append(row["seconds"])
    summary = {}
    for kind, values in sorted(by_kind.items()):
        seen = [v for v in values if v is not None]
        summary[kind] = {
            "count": len(values),
            "median": statistics.median(seen) if seen else float("nan"),
            "max": max(seen) if seen else float("nan"),
            "never": len(values) - len(seen),
        }
    return summary


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
    """Above: cumulative acknowledged and delivered (distinct) messages. Below: acknowledged
    but not yet delivered (a partition's backlog, and at the end the lost). Faults shaded.
    Returns False when matplotlib is not installed (``pip install nsqpy[chaos]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    acked_at = {e["n"]: e["t"] - start for e in pubs if e["op"] == "pub" and e["outcome"] == "ok"}
    first_delivery: dict[int, float] = {}
    for e in recvs:
        if e["op"] == "recv" and e.get("n") is not None:
            first_delivery.setdefault(e["n"], e["t"] - start)
    acked = sorted(acked_at.values())
    delivered = sorted(first_delivery.values())
    # an acknowledged message counts as waiting from its ack until its first delivery
    changes = sorted(
        [(t, 1) for t in acked]
        + [(max(first_delivery[n], t), -1) for n, t in acked_at.items() if n in first_delivery]
    )
    times, waiting, count = [0.0], [0], 0
    for t, step in changes:
        count += step
        times.append(t)
        waiting.append(count)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, 6), dpi=100, sharex=True, height_ratios=[3, 2]
    )
    top.step(acked, range(1, len(acked) + 1), where="post", label="acknowledged", color="k")
    top.step(
        delivered,
        range(1, len(delivered) + 1),
        where="post",
        label="delivered (distinct)",
        color="tab:green",
        linestyle="--",
    )
    bottom.step(times, waiting, where="post", color="tab:blue", linewidth=0.8)
    _shade_faults(top, faults, start, label=True)
    _shade_faults(bottom, faults, start, label=False)
    top.set_ylabel("messages")
    top.set_title(title)
    top.legend(loc="upper left", fontsize=8, ncol=2)
    bottom.set_ylabel("acknowledged,\nnot yet delivered")
    bottom.set_xlabel("seconds since the workload started")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return True


def _shade_faults(ax: Any, faults: list[dict[str, Any]], start: float, *, label: bool) -> None:
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
            label=None if kind in shown or not label else kind,
        )
        shown.add(kind)
