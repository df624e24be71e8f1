"""/stats in Go's JSON shape and text layout (nsqd/stats.go, nsqd/http.go printStats)."""

from __future__ import annotations

import asyncio
import gc
import random
import resource
import time
from typing import TYPE_CHECKING, Any

from .. import NSQ_VERSION
from ..internal.durations import format_duration
from ..internal.http_api import go_json
from .collector import PAUSES

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .channel import Channel
    from .nsqd import NSQD
    from .topic import Topic

#: Samples kept per half window; enough for stable tail percentiles at bounded memory.
E2E_SAMPLES_PER_HALF = 4096


class E2EStream:
    """End-to-end latency percentiles over a rolling window made of two halves.

    Go keeps two biased-quantile streams and resets the older one every window/2. We keep two
    bounded reservoir samples with the same rotation; quantiles are computed when queried.
    """

    __slots__ = ("_count", "_current", "_previous", "_rotated_at", "_seen", "half", "quantiles")

    def __init__(self, window: float, quantiles: list[float]) -> None:
        self.half = window / 2
        self.quantiles = sorted(quantiles, reverse=True)
        self._current: list[int] = []
        self._previous: list[int] = []
        self._seen = 0
        self._count = 0
        self._rotated_at = time.monotonic()

    def insert(self, value_ns: int) -> None:
        now = time.monotonic()
        if now - self._rotated_at >= self.half:
            self._previous, self._current = self._current, []
            self._seen = 0
            self._rotated_at = now
        self._count += 1
        self._seen += 1
        if len(self._current) < E2E_SAMPLES_PER_HALF:
            self._current.append(value_ns)
        else:
            slot = random.randrange(self._seen)
            if slot < E2E_SAMPLES_PER_HALF:
                self._current[slot] = value_ns

    def samples(self) -> list[int]:
        return self._current + self._previous

    def count(self) -> int:
        return len(self._current) + len(self._previous)


def e2e_result(streams: list[E2EStream], quantiles: list[float]) -> dict[str, Any]:
    if not quantiles or not streams:  # Go: a nil stream's Result() is empty
        return {"count": 0, "percentiles": None}
    samples: list[int] = []
    for stream in streams:
        samples.extend(stream.samples())
    samples.sort()
    percentiles = []
    for q in sorted(quantiles, reverse=True):
        if samples:
            index = min(len(samples) - 1, max(0, round(q * len(samples)) - 1))
            value = float(samples[index])
        else:
            value = 0.0  # Go's stream answers 0 when it holds no samples
        percentiles.append({"quantile": q, "value": value})
    return {"count": len(samples), "percentiles": percentiles}


def channel_stats(nsqd: NSQD, channel: Channel, include_clients: bool) -> dict[str, Any]:
    clients = None
    if include_clients:
        clients = [c.stats() for c in sorted(channel.clients.values(), key=lambda c: c.id)]
    quantiles = nsqd.options.e2e_processing_latency_percentiles
    e2e = [channel.e2e] if channel.e2e is not None else []
    stats = {
        "channel_name": channel.name,
        "depth": channel.depth(),
        "backend_depth": channel.backend.depth(),
        "in_flight_count": len(channel.in_flight),
        "deferred_count": len(channel.deferred),
        "message_count": channel.message_count,
        "requeue_count": channel.requeue_count,
        "timeout_count": channel.timeout_count,
        "client_count": len(channel.clients),
        "clients": clients,
        "paused": channel.paused,
        "e2e_processing_latency": e2e_result(e2e, quantiles),
    }
    if channel.max_attempts or channel.dead_letter_count:  # nsqpy dead-lettering: extra keys
        stats["max_attempts"] = channel.max_attempts
        stats["dead_letter_count"] = channel.dead_letter_count
    bounded = nsqd.queue_limits.describe(channel)  # nsqpy --max-queue-bytes: extra keys
    if bounded is not None:
        stats.update(bounded)
    return stats


def topic_stats(
    nsqd: NSQD, topic: Topic, channel_filter: str, include_clients: bool
) -> dict[str, Any] | None:
    out: list[dict[str, Any]] = []
    for _ in _topic_stats_steps(nsqd, topic, channel_filter, include_clients, out):
        pass
    return out[0] if out else None


def _topic_stats_steps(
    nsqd: NSQD, topic: Topic, channel_filter: str, include_clients: bool, out: list[dict[str, Any]]
) -> Iterator[None]:
    """:func:`topic_stats`, appended to ``out``, yielding after each channel."""
    channels = sorted(topic.channels.values(), key=lambda c: c.name)
    if channel_filter:
        channels = [c for c in channels if c.name == channel_filter]
        if not channels:
            return
    channel_list = []
    for channel in channels:
        channel_list.append(channel_stats(nsqd, channel, include_clients))
        yield
    quantiles = nsqd.options.e2e_processing_latency_percentiles
    streams = [c.e2e for c in topic.channels.values() if c.e2e is not None]
    stats = {
        "topic_name": topic.name,
        "channels": channel_list,
        "depth": topic.depth(),
        "backend_depth": topic.backend.depth(),
        "message_count": topic.message_count,
        "message_bytes": topic.message_bytes,
        "paused": topic.paused,
        "e2e_processing_latency": e2e_result(streams, quantiles),
    }
    bounded = nsqd.queue_limits.describe(topic)  # nsqpy --max-queue-bytes: extra keys
    if bounded is not None:
        stats.update(bounded)
    out.append(stats)


Stats = tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]


def get_stats(nsqd: NSQD, topic_filter: str, channel_filter: str, include_clients: bool) -> Stats:
    """(topics, producers) with Go's null/empty rules."""
    result: list[Stats] = []
    for _ in _stats_steps(nsqd, topic_filter, channel_filter, include_clients, result):
        pass
    return result[0]


#: Longest stretch a stats snapshot runs on the event loop before it lets other work in.
SNAPSHOT_SLICE = 0.002


async def get_stats_sliced(
    nsqd: NSQD, topic_filter: str, channel_filter: str, include_clients: bool
) -> Stats:
    """:func:`get_stats` in slices of at most about ``SNAPSHOT_SLICE`` seconds, yielding to
    the loop between them: with 1,000 channels a scrape must not hold publishers back.
    Figures are read as the walk reaches them, so they are not all of one instant, which
    a poller comparing successive scrapes never needed (Go's /stats is not atomic either)."""
    result: list[Stats] = []
    await run_sliced(_stats_steps(nsqd, topic_filter, channel_filter, include_clients, result))
    return result[0]


def _stats_steps(
    nsqd: NSQD,
    topic_filter: str,
    channel_filter: str,
    include_clients: bool,
    result: list[Stats],
) -> Iterator[None]:
    if topic_filter:
        topic = nsqd.topics.get(topic_filter)
        if topic is None:
            result.append((None, None))
            return
        topics = [topic]
    else:
        topics = sorted(nsqd.topics.values(), key=lambda t: t.name)
    topic_list: list[dict[str, Any]] = []
    for topic in topics:
        yield from _topic_stats_steps(nsqd, topic, channel_filter, include_clients, topic_list)
    producers: list[dict[str, Any]] | None = None
    if include_clients:
        producers = []
        for client in sorted(nsqd.clients.values(), key=lambda c: c.id):
            if client.pub_counts and (not topic_filter or topic_filter in client.pub_counts):
                producers.append(client.stats(topic_filter))
                yield
        producers = producers or None
    result.append((topic_list, producers))


def memory_stats() -> dict[str, int]:
    """Go-runtime keys filled with the nearest Python figures: the pauses are the cycle
    collector's (collector.py), every one of which stops the event loop."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    collections = sum(s["collections"] for s in gc.get_stats())
    return {
        "heap_objects": 0,
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": usage.ru_maxrss * 1024,
        "heap_released_bytes": 0,
        "gc_pause_usec_100": PAUSES.percentile_usec(100),
        "gc_pause_usec_99": PAUSES.percentile_usec(99),
        "gc_pause_usec_95": PAUSES.percentile_usec(95),
        "next_gc_bytes": 0,
        "gc_total_runs": collections,
    }


def _e2e_text(result: dict[str, Any]) -> str:
    if not result["percentiles"]:
        return ""
    parts = []
    for item in result["percentiles"]:
        parts.append(f"{_human_ns(item['value'])}")
    return ", ".join(parts)


def _human_ns(value: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if value >= scale:
            return f"{value / scale:0.1f}{unit}"
    return f"{value:0.1f}ns"


def _client_line(stats: dict[str, Any]) -> str:
    connected = format_duration(max(0, int(time.time()) - stats["connect_ts"]))
    port = stats["remote_address"].rpartition(":")[2]
    ident = f"{stats['hostname']}:{port} {stats['user_agent']}"
    pub_counts = stats.get("pub_counts")
    if pub_counts:
        total = sum(p["count"] for p in pub_counts)
        topics = ",".join(f"{p['topic']}={p['count']}" for p in pub_counts)
        return f"[V2 {ident:<21}] msgs: {total:<8} topics: {topics} connected: {connected}"
    return (
        f"[V2 {ident:<21}] state: {stats['state']} inflt: {stats['in_flight_count']:<4} "
        f"rdy: {stats['ready_count']:<4} fin: {stats['finish_count']:<8} "
        f"re-q: {stats['requeue_count']:<8} msgs: {stats['message_count']:<8} "
        f"connected: {connected}"
    )


def stats_text(
    nsqd: NSQD,
    version_line: str,
    topics: list[dict[str, Any]] | None,
    producers: list[dict[str, Any]] | None,
    memory: dict[str, int] | None,
) -> str:
    out: list[str] = []
    for _ in stats_text_steps(nsqd, version_line, topics, producers, memory, out):
        pass
    return "".join(out)


def stats_text_steps(
    nsqd: NSQD,
    version_line: str,
    topics: list[dict[str, Any]] | None,
    producers: list[dict[str, Any]] | None,
    memory: dict[str, int] | None,
    out: list[str],
) -> Iterator[None]:
    """:func:`stats_text`'s pieces appended to ``out``, yielding after each channel."""
    uptime = format_duration(time.time() - nsqd.start_time)
    start = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(nsqd.start_time))
    start = start[:-2] + ":" + start[-2:] if start[-5] in "+-" else start
    start = start.replace("+00:00", "Z")
    out += [f"{version_line}\n", f"start_time {start}\n", f"uptime {uptime}\n"]
    out.append(f"\nHealth: {nsqd.writes.health}\n")
    if memory is not None:
        out.append("\nMemory:\n")
        out.extend(f"   {key:<25}\t{value}\n" for key, value in memory.items())
    if not topics:
        out.append("\nTopics: None\n")
    else:
        out.append("\nTopics:")
    for t in topics or []:
        prefix = "*P " if t["paused"] else "   "
        out.append(
            f"\n{prefix}[{t['topic_name']:<15}] depth: {t['depth']:<5} "
            f"be-depth: {t['backend_depth']:<5} msgs: {t['message_count']:<8} "
            f"e2e%: {_e2e_text(t['e2e_processing_latency'])}\n"
        )
        for c in t["channels"]:
            prefix = "   *P " if c["paused"] else "      "
            out.append(
                f"{prefix}[{c['channel_name']:<25}] depth: {c['depth']:<5} "
                f"be-depth: {c['backend_depth']:<5} inflt: {c['in_flight_count']:<4} "
                f"def: {c['deferred_count']:<4} re-q: {c['requeue_count']:<5} "
                f"timeout: {c['timeout_count']:<5} msgs: {c['message_count']:<8} "
                f"e2e%: {_e2e_text(c['e2e_processing_latency'])}\n"
            )
            out.extend(f"        {_client_line(client)}\n" for client in c["clients"] or [])
            yield
    if not producers:
        out.append("\nProducers: None\n")
    else:
        out.append("\nProducers:\n")
        out.extend(f"   {_client_line(p)}\n" for p in producers)
    if nsqd.replication is not None:  # nsqpy --replica-peer only: Go's layout above is kept
        out.extend(replication_text(nsqd.replication.stats()))


def replication_text(replication: dict[str, Any]) -> list[str]:
    """The ``Replication:`` block of text /stats: this node, then one line per peer."""
    lines = [
        "\nReplication:\n",
        f"   node: {replication['address']} incarnation: {replication['incarnation']} "
        f"acks: {replication['acks']} seq: {replication['last_seq']}\n",
    ]
    for peer in replication["peers"]:
        lines.append(
            f"   [{peer['address']:<21}] state: {peer['state']:<11} "
            f"acked: {peer['acked_seq']:<8} lag: {peer['lag']:<8} "
            f"held: {peer['held_copies']:<8} taken-over: {peer['taken_over']}\n"
        )
    return lines


def stats_json_steps(body: dict[str, Any], out: list[bytes]) -> Iterator[None]:
    """``go_json(body)`` of a :func:`stats_json` body, one channel at a time: each channel
    and each topic without its channels is encoded alone and spliced into the empty list
    left in its place (the first such key in key order: names and escaped strings before it
    cannot contain it). The same bytes as encoding the whole at once."""
    topics = body["topics"]
    if not topics:
        out.append(go_json(body))
        return
    encoded_topics = []
    for topic in topics:
        channels = []
        for channel in topic["channels"]:
            channels.append(go_json(channel))
            yield
        shell = go_json({**topic, "channels": []})
        encoded_topics.append(_splice(shell, b'"channels":[]', channels))
        yield
    out.append(_splice(go_json({**body, "topics": []}), b'"topics":[]', encoded_topics))


def _splice(shell: bytes, empty: bytes, items: list[bytes]) -> bytes:
    at = shell.index(empty) + len(empty) - 1
    return shell[:at] + b",".join(items) + shell[at:]


async def run_sliced(steps: Iterator[None]) -> None:
    """Run ``steps`` on the loop in slices of about ``SNAPSHOT_SLICE`` seconds."""
    clock = time.perf_counter
    resume = clock() + SNAPSHOT_SLICE
    for _ in steps:
        if clock() >= resume:
            await asyncio.sleep(0)
            resume = clock() + SNAPSHOT_SLICE


def stats_json(
    topics: list[dict[str, Any]] | None,
    producers: list[dict[str, Any]] | None,
    memory: dict[str, int] | None,
    health: str,
    start_time: int,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "version": NSQ_VERSION,
        "health": health,
        "start_time": start_time,
        "topics": topics,
    }
    if memory is not None:
        body["memory"] = memory
    body["producers"] = producers
    return body
