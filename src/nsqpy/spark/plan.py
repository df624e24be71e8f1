"""Offsets and read tasks: pure functions, so a restarted query plans exactly what it planned.

NSQ has no replayable offsets. The source's offset is a *tick* (a batch counter) plus the
read plan frozen when the tick was taken::

    {"tick": 7, "topics": {"clicks": {"127.0.0.1:4150": [2, 3100], "127.0.0.1:4250": [1, 900]}}}

``[partitions, messages]`` per nsqd: that many read tasks, which together take at most that
many messages. ``partitions(start, end)`` expands the plan into :class:`ReadTask` values keyed
``t{tick}-{topic}-{nsqd}-r{j}``; the key names the task's staging file, which is what makes a
retried task or a restarted query replay the same rows instead of reading new ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "INITIAL_OFFSET",
    "ReadTask",
    "allocate",
    "make_offset",
    "offset_tick",
    "read_tasks",
    "split_messages",
    "tick_of_key",
]

INITIAL_OFFSET: dict[str, Any] = {"tick": 0, "topics": {}}


@dataclass(frozen=True)
class ReadTask:
    """What one Spark task reads: up to ``messages`` messages from one nsqd, staged as ``key``."""

    key: str
    tick: int
    topic: str
    nsqd: str
    messages: int


def make_offset(tick: int, plan: Mapping[str, Mapping[str, tuple[int, int]]]) -> dict[str, Any]:
    """An offset with keys in a stable order (Spark compares offsets as JSON text)."""
    topics = {
        topic: {nsqd: [int(p), int(m)] for nsqd, (p, m) in sorted(plan[topic].items()) if p > 0}
        for topic in sorted(plan)
    }
    return {"tick": int(tick), "topics": {t: n for t, n in topics.items() if n}}


def offset_tick(offset: Mapping[str, Any]) -> int:
    return int(offset.get("tick", 0))


def safe_name(text: str) -> str:
    """An nsqd address or topic as part of a file name (``:``, ``[``, ``]`` are not portable)."""
    return text.replace("[", "").replace("]", "").replace(":", "_")


def task_key(tick: int, topic: str, nsqd: str, reader: int) -> str:
    return f"t{tick}-{topic}-{safe_name(nsqd)}-r{reader}"


def tick_of_key(key: str) -> int | None:
    """The tick a staging key belongs to, or None if the name is not a task key."""
    if not key.startswith("t"):
        return None
    head = key[1:].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def split_messages(total: int, partitions: int, index: int) -> int:
    """Share ``index`` of ``total`` messages split as evenly as possible in ``partitions``."""
    base, extra = divmod(total, partitions)
    return base + (1 if index < extra else 0)


def read_tasks(start: Mapping[str, Any], end: Mapping[str, Any]) -> list[ReadTask]:
    """The read tasks of the batch (start, end]: the end offset's plan for each new tick."""
    tasks: list[ReadTask] = []
    topics: Mapping[str, Mapping[str, list[int]]] = end.get("topics") or {}
    for tick in range(offset_tick(start) + 1, offset_tick(end) + 1):
        for topic in sorted(topics):
            for nsqd in sorted(topics[topic]):
                partitions, messages = topics[topic][nsqd]
                for j in range(partitions):
                    share = split_messages(messages, partitions, j)
                    if share > 0:
                        key = task_key(tick, topic, nsqd, j)
                        tasks.append(ReadTask(key, tick, topic, nsqd, share))
    return tasks


def allocate(available: Mapping[Any, int], budget: int | None) -> dict[Any, int]:
    """Split ``budget`` messages over sources in proportion to what each has available.

    Deterministic (largest remainder, ties by key order). With no budget, everything.
    """
    total = sum(max(0, n) for n in available.values())
    if budget is None or total <= budget:
        return {key: max(0, n) for key, n in available.items()}
    shares: dict[Any, int] = {}
    remainders: list[tuple[float, int, Any]] = []
    for order, key in enumerate(sorted(available, key=repr)):
        exact = budget * max(0, available[key]) / total
        shares[key] = math.floor(exact)
        remainders.append((exact - shares[key], -order, key))
    left = budget - sum(shares.values())
    for _, _, key in sorted(remainders, reverse=True)[:left]:
        shares[key] += 1
    return shares


def partitions_for(messages: int, readers: int, per_partition: int) -> int:
    """How many read tasks take ``messages``: at least ``readers``, each at most one RDY's worth."""
    if messages <= 0:
        return 0
    return max(min(readers, messages), math.ceil(messages / per_partition))
