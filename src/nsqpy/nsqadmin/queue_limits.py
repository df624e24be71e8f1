"""nsqd's bounded-queue figures (``--max-queue-bytes``; nsqd/queue_limits.py) in nsqadmin's
topic and channel stats: passed on only where nsqd gives them, so a queue without the feature
keeps exactly Go's keys, and summed over nodes in the cluster aggregates."""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]

#: Summed over nodes; ``max_queue_bytes`` aggregates as the highest cap.
SUMS = ("queue_bytes", "queue_dropped_count", "queue_refused_count")


def queue_limit_keys(data: Json) -> Json:
    if "max_queue_bytes" not in data:
        return {}
    out: Json = {
        "max_queue_bytes": data.get("max_queue_bytes", 0),
        "queue_full_policy": data.get("queue_full_policy", ""),
    }
    out.update({key: data.get(key, 0) for key in SUMS})
    return out


def queue_limit_add(total: Json, node_stats: Json) -> None:
    """One node's figures into the cluster aggregate (the highest cap, the sums; the policy,
    or ``mixed`` when nodes differ)."""
    if "max_queue_bytes" not in node_stats:
        return
    first = "max_queue_bytes" not in total
    total["max_queue_bytes"] = max(total.get("max_queue_bytes", 0), node_stats["max_queue_bytes"])
    policy = node_stats["queue_full_policy"]
    if not first and total.get("queue_full_policy") != policy:
        policy = "mixed"
    total["queue_full_policy"] = policy
    for key in SUMS:
        total[key] = total.get(key, 0) + node_stats[key]
