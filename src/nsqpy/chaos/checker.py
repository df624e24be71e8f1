"""The checker: Jepsen's total-queue idea over the producers' and the consumer's histories.

- **lost**: acknowledged (PUB answered OK) but never delivered, whatever became of the nsqd
  that acknowledged it (killed, or its data path deleted);
- **duplicated**: delivered more than once (allowed: NSQ is at-least-once), counted; those
  delivered by two or more nsqds apart (a replica's takeover, or a PUB stored twice);
- **unexpected**: delivered but never published (not even attempted): must be 0;
- **recovery**: for each healed fault, the time from the heal to the next delivery.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def read_history(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a history file (a killed writer may leave half a line)."""
    events: list[dict[str, Any]] = []
    if not path.exists():
        return events
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


@dataclass
class CheckResult:
    attempted: int = 0
    acknowledged: int = 0
    refused: int = 0
    unknown: int = 0
    delivered_unique: int = 0
    deliveries: int = 0
    lost: int = 0
    duplicated: int = 0
    duplicated_across_nsqds: int = 0
    unexpected: int = 0
    refused_but_delivered: int = 0
    unknown_delivered: int = 0
    lost_numbers: list[int] = field(default_factory=list)
    unexpected_sample: list[Any] = field(default_factory=list)
    lost_by_fault: dict[str, int] = field(default_factory=dict)
    recovery: list[dict[str, Any]] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        # a run in which nothing was acknowledged tested nothing
        return self.acknowledged > 0 and self.lost == 0 and self.unexpected == 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "valid": self.valid}


def check(
    pubs: Iterable[dict[str, Any]],
    recvs: Iterable[dict[str, Any]],
    faults: Iterable[dict[str, Any]] = (),
) -> CheckResult:
    result = CheckResult()
    faults = list(faults)
    invoked: set[int] = set()
    outcome: dict[int, str] = {}
    answered_at: dict[int, float] = {}
    for event in pubs:
        if event["op"] == "invoke":
            invoked.add(event["n"])
        elif event["op"] == "pub":
            outcome[event["n"]] = event["outcome"]
            answered_at[event["n"]] = event["t"]
    times: dict[str, list[float]] = {"": []}
    counts: Counter[int] = Counter()
    delivered_by: dict[int, set[str]] = {}
    for event in recvs:
        if event["op"] != "recv":
            continue
        result.deliveries += 1
        times[""].append(event["t"])
        times.setdefault(event.get("nsqd") or "?", []).append(event["t"])
        number = event.get("n")
        if number is None or number not in invoked:
            result.unexpected += 1
            if len(result.unexpected_sample) < 20:
                result.unexpected_sample.append(number if number is not None else event["body"])
            continue
        counts[number] += 1
        delivered_by.setdefault(number, set()).add(event.get("nsqd") or "?")
    result.attempted = len(invoked)
    by_outcome = Counter(outcome.values())
    result.acknowledged = by_outcome["ok"]
    result.refused = by_outcome["refused"]
    # a PUB whose outcome was never written (the producer was stopped mid-call) is unknown too
    result.unknown = by_outcome["unknown"] + len(invoked - outcome.keys())
    result.delivered_unique = len(counts)
    result.duplicated = sum(1 for c in counts.values() if c > 1)
    result.duplicated_across_nsqds = sum(1 for by in delivered_by.values() if len(by) > 1)
    lost = sorted(n for n, o in outcome.items() if o == "ok" and n not in counts)
    result.lost = len(lost)
    result.lost_numbers = lost
    result.lost_by_fault = dict(Counter(blame(answered_at[n], faults) for n in lost))
    result.refused_but_delivered = sum(
        1 for n, o in outcome.items() if o == "refused" and n in counts
    )
    result.unknown_delivered = sum(
        1 for n in invoked if outcome.get(n, "unknown") == "unknown" and n in counts
    )
    result.recovery = recovery_times(faults, {k: sorted(v) for k, v in times.items()})
    return result


#: a message acknowledged this long before a fault began may still be in that nsqd's hands
BLAME_LOOKBACK = 10.0


def blame(acknowledged_at: float, faults: list[dict[str, Any]]) -> str:
    """The fault a lost message is put down to: the one under way when it was acknowledged,
    else the first to begin within BLAME_LOOKBACK seconds after ("none": neither)."""
    started = [f for f in faults if f.get("started") is not None]
    active = [
        f for f in started if f["started"] <= acknowledged_at <= (f.get("healed") or f["started"])
    ]
    if active:
        return str(max(active, key=lambda f: f["started"])["kind"])
    soon = [f for f in started if 0 < f["started"] - acknowledged_at <= BLAME_LOOKBACK]
    return str(min(soon, key=lambda f: f["started"])["kind"]) if soon else "none"


def recovery_times(
    faults: Iterable[dict[str, Any]], delivery_times: dict[str, list[float]]
) -> list[dict[str, Any]]:
    """Seconds from each heal to the first delivery after it (None: none followed). For a
    fault on an nsqd, the first delivery *from that nsqd*: the others deliver throughout, so
    only its own messages say when consumers reached it again."""
    rows = []
    for fault in faults:
        healed = fault.get("healed")
        if healed is None or fault["kind"] == "kill-spark":  # not on the consumers' path
            continue
        times = delivery_times.get(fault.get("address") or "", [])
        i = bisect.bisect_right(times, healed)
        after = times[i] - healed if i < len(times) else None
        rows.append(
            {
                "kind": fault["kind"],
                "target": fault["target"],
                "data_lost": fault.get("data_lost", ""),
                "seconds": None if after is None else round(after, 3),
            }
        )
    return rows
