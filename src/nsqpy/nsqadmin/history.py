"""Rates and history without Graphite: a poller and a bounded in-memory history (nsqpy only).

Every ``--poll-interval`` the :class:`Poller` asks each lookupd for ``/nodes`` and ``/topics``
(lookupd mode) and each nsqd for one ``/stats?format=json&include_clients=false``; nothing else
(nsqd mode asks each nsqd's ``/info`` once, to learn the name it goes by on the node pages).
:class:`History` turns consecutive polls into rates and keeps the last ``--history-points``
points per topic, per channel and per node.

* ``rate_in``: messages/s published to a topic (its ``message_count`` delta); a channel's is
  what its topic received on the nodes that have the channel.
* ``rate_out``: messages/s that left a channel, finished (the delta of ``message_count - depth -
  in_flight - deferred``); a topic's is the sum over its channels.
* ``depth_trend``: how fast a topic's backlog changes, in messages/s over the last
  :data:`TREND_POLLS` polls, the backlog being the topic's depth plus its channels' (a paused
  channel's growing queue must stand out even though the topic's own depth stays 0). A rise
  counts only when sustained: every backlog of the newer half of those polls above every one
  of the older half, so a backlog swinging under a batch consumer is not "growing".

Every rate, on every page, is one computation: the messages counted over the last
:data:`RATE_WINDOW` seconds of polls (at least one poll interval) divided by the time those
polls span. A history point carries the rate as of its poll, and an overview row carries its
topic's newest point, so the topics list, the topic page, the channel page and the node page
show the same figure for the same poll.

Deltas are taken per node, from nodes answering both polls, so one node missing a poll does
not make a rate jump; a counter that goes down (a restarted or emptied node) counts as 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..internal import clusterinfo as ci
from ..internal import lg
from ..internal.api_client import RequestError
from ..internal.clusterinfo_types import http_address, producer_from_info

Json = dict[str, Any]

#: Rates are averaged over the polls of the last this many seconds (one interval at least):
#: one interval alone makes a bursty producer's rate jump between 0 and twice its average.
RATE_WINDOW = 10.0
#: ``depth_trend`` compares the newest point with the one this many polls before (one minute
#: at the default 5 s): a backlog that stopped growing stops being flagged within that.
TREND_POLLS = 12
#: An overview row carries at most this many points of its topic's history (evenly spread
#: over the whole history, the newest included): enough for the topics list's sparkline.
OVERVIEW_POINTS = 60


@dataclass
class ChannelSample:
    depth: int
    backend_depth: int
    in_flight: int
    deferred: int
    message_count: int
    client_count: int
    paused: bool

    @property
    def gone(self) -> int:
        """Messages that left the channel for good (finished, or emptied)."""
        return self.message_count - self.depth - self.in_flight - self.deferred


@dataclass
class TopicSample:
    depth: int
    backend_depth: int
    message_count: int
    paused: bool
    channels: dict[str, ChannelSample]


@dataclass
class Poll:
    """One poll of the cluster: per node, its topics; and who did not answer."""

    at: float
    nodes: dict[str, dict[str, TopicSample]]
    node_count: int
    node_failures: list[ci.Failure]
    lookupd_count: int
    lookupd_failures: list[ci.Failure]
    lookupd_topics: list[str] = field(default_factory=list)
    # lookupd mode: topic -> (producing nodes, tombstoned nodes)
    registrations: dict[str, tuple[int, int]] | None = None


def sample_topics(stats: Json) -> dict[str, TopicSample]:
    """The counters of one nsqd's ``/stats?format=json``."""
    topics: dict[str, TopicSample] = {}
    for topic in stats.get("topics") or []:
        channels = {
            c.get("channel_name", ""): ChannelSample(
                depth=c.get("depth", 0),
                backend_depth=c.get("backend_depth", 0),
                in_flight=c.get("in_flight_count", 0),
                deferred=c.get("deferred_count", 0),
                message_count=c.get("message_count", 0),
                client_count=c.get("client_count", 0),
                paused=bool(c.get("paused", False)),
            )
            for c in topic.get("channels") or []
        }
        topics[topic.get("topic_name", "")] = TopicSample(
            depth=topic.get("depth", 0),
            backend_depth=topic.get("backend_depth", 0),
            message_count=topic.get("message_count", 0),
            paused=bool(topic.get("paused", False)),
            channels=channels,
        )
    return topics


def _delta(now: int, before: int) -> int:
    """A counter's increase; one that went down (a restarted or emptied node) counts 0."""
    return max(0, now - before)


class _RateWindow:
    """Running totals of the messages in and out of one series, and their last few values,
    so a rate is the messages of the window over the time the window spans."""

    def __init__(self, size: int) -> None:
        self.total_in = 0
        self.total_out = 0
        self.samples: deque[tuple[int, int, int]] = deque(maxlen=size)

    def add(self, t_ms: int, msgs_in: int, msgs_out: int) -> tuple[float, float]:
        self.total_in += msgs_in
        self.total_out += msgs_out
        self.samples.append((t_ms, self.total_in, self.total_out))
        t0, in0, out0 = self.samples[0]
        seconds = (t_ms - t0) / 1000
        if seconds <= 0:
            return 0.0, 0.0
        return (self.total_in - in0) / seconds, (self.total_out - out0) / seconds


def _round(value: float) -> float:
    return round(value, 3)


class History:
    """The last ``points`` polls turned into series, and the latest overview."""

    def __init__(self, interval: float, points: int) -> None:
        self.interval_ms = round(interval * 1000)
        self.points = max(1, points)
        self.topics: dict[str, deque[Json]] = {}
        self.channels: dict[tuple[str, str], deque[Json]] = {}
        self.nodes: dict[str, deque[Json]] = {}
        self.last: Poll | None = None
        self._overview_topics: list[Json] = []
        # the polls a rate spans: RATE_WINDOW seconds of them, plus the one it starts from
        self._rate_samples = max(1, math.ceil(RATE_WINDOW / interval)) + 1 if interval > 0 else 2
        self._windows: dict[Any, _RateWindow] = {}

    def _rates(self, key: Any, t_ms: int, msgs_in: int, msgs_out: int) -> tuple[float, float]:
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = _RateWindow(self._rate_samples)
            if self.last is not None:
                # A series first seen now may already count messages (a channel made since the
                # last poll received the topic's): they arrived since that poll.
                window.samples.append((round(self.last.at * 1000), 0, 0))
        rate_in, rate_out = window.add(t_ms, msgs_in, msgs_out)
        return _round(rate_in), _round(rate_out)

    def _series(self, table: dict[Any, deque[Json]], key: Any) -> deque[Json]:
        series = table.get(key)
        if series is None:
            series = table[key] = deque(maxlen=self.points)
        return series

    def record(self, poll: Poll) -> None:
        previous = self.last
        t_ms = round(poll.at * 1000)
        topic_rows: dict[str, Json] = {}
        # (topic, channel) -> [depth, messages in, messages out] of this poll
        channel_totals: dict[tuple[str, str], list[int]] = {}
        for node, topics in poll.nodes.items():
            before = previous.nodes.get(node) if previous is not None else None
            node_depth, node_in, node_out = 0, 0, 0
            for name, sample in topics.items():
                old = before.get(name) if before is not None else None
                msgs_in = _delta(sample.message_count, old.message_count) if old else 0
                row = topic_rows.setdefault(name, _empty_row(name))
                row["producer_count_stats"] += 1
                row["depth"] += sample.depth
                row["backend_depth"] += sample.backend_depth
                row["message_count"] += sample.message_count
                row["paused"] = row["paused"] or sample.paused
                row["msgs_in"] += msgs_in
                node_depth += sample.depth
                node_in += msgs_in
                for channel_name, channel in sample.channels.items():
                    old_channel = old.channels.get(channel_name) if old else None
                    msgs_out = _delta(channel.gone, old_channel.gone) if old_channel else 0
                    row["channel_names"].add(channel_name)
                    row["channel_depth"] += channel.depth
                    row["in_flight_count"] += channel.in_flight
                    row["deferred_count"] += channel.deferred
                    row["client_count"] += channel.client_count
                    row["msgs_out"] += msgs_out
                    totals = channel_totals.setdefault((name, channel_name), [0, 0, 0])
                    totals[0] += channel.depth
                    totals[1] += msgs_in
                    totals[2] += msgs_out
                    node_depth += channel.depth
                    node_out += msgs_out
            rate_in, rate_out = self._rates(("node", node), t_ms, node_in, node_out)
            point = {"t": t_ms, "depth": node_depth, "rate_in": rate_in, "rate_out": rate_out}
            self._series(self.nodes, node).append(point)
        for name in poll.lookupd_topics:
            topic_rows.setdefault(name, _empty_row(name))
        for name, row in topic_rows.items():
            rate_in, rate_out = self._rates(("topic", name), t_ms, row["msgs_in"], row["msgs_out"])
            row["rate_in"], row["rate_out"] = rate_in, rate_out
            point = {"t": t_ms, "depth": row["depth"], "rate_in": rate_in, "rate_out": rate_out}
            point["channel_depth"] = row["channel_depth"]
            self._series(self.topics, name).append(point)
        for key, (depth, msgs_in, msgs_out) in channel_totals.items():
            rate_in, rate_out = self._rates(("channel", *key), t_ms, msgs_in, msgs_out)
            point = {"t": t_ms, "depth": depth, "rate_in": rate_in, "rate_out": rate_out}
            self._series(self.channels, key).append(point)
        self._forget_stale(t_ms)
        self._overview_topics = [
            self._overview_row(row, poll) for _, row in sorted(topic_rows.items())
        ]
        self.last = poll

    def _forget_stale(self, t_ms: int) -> None:
        """Drop the series of topics, channels and nodes not seen for a whole history window
        (deleted ones), so memory stays bounded by what the cluster holds now."""
        window_ms = self.points * max(self.interval_ms, 1)
        tables: tuple[tuple[str, dict[Any, deque[Json]]], ...] = (
            ("topic", self.topics),
            ("channel", self.channels),
            ("node", self.nodes),
        )
        for kind, table in tables:
            for key in [k for k, series in table.items() if t_ms - series[-1]["t"] > window_ms]:
                del table[key]
                window_key = (kind, *key) if kind == "channel" else (kind, key)
                self._windows.pop(window_key, None)

    def _overview_row(self, row: Json, poll: Poll) -> Json:
        name = row["topic_name"]
        if poll.registrations is not None:
            producers, tombstoned = poll.registrations.get(name, (0, 0))
        else:
            producers, tombstoned = row["producer_count_stats"], 0
        return {
            "topic_name": name,
            "depth": row["depth"],
            "memory_depth": row["depth"] - row["backend_depth"],
            "backend_depth": row["backend_depth"],
            "message_count": row["message_count"],
            "in_flight_count": row["in_flight_count"],
            "deferred_count": row["deferred_count"],
            "channel_count": len(row["channel_names"]),
            "client_count": row["client_count"],
            "paused": row["paused"],
            "producer_count": producers,
            "tombstoned_count": tombstoned,
            "rate_in": row["rate_in"],
            "rate_out": row["rate_out"],
            "depth_trend": self._trend(name),
            "channel_depth": row["channel_depth"],
            "history": self._compact(name),
        }

    def _compact(self, topic: str) -> Json:
        """The topic's history for a sparkline in a row: at most OVERVIEW_POINTS points, as
        one list per figure (``t``, ``queued`` = depth + channel depth, ``rate_in``,
        ``rate_out``), spread evenly over the whole history, first and newest included."""
        series = list(self.topics.get(topic) or [])
        if len(series) > OVERVIEW_POINTS:
            step = (len(series) - 1) / (OVERVIEW_POINTS - 1)
            series = [series[round(i * step)] for i in range(OVERVIEW_POINTS)]
        return {
            "t": [p["t"] for p in series],
            "queued": [p["depth"] + p["channel_depth"] for p in series],
            "rate_in": [p["rate_in"] for p in series],
            "rate_out": [p["rate_out"] for p in series],
        }

    def _trend(self, topic: str) -> float:
        series = self.topics.get(topic)
        if not series or len(series) < 2:
            return 0.0
        window = list(itertools.islice(series, max(0, len(series) - 1 - TREND_POLLS), None))
        seconds = (window[-1]["t"] - window[0]["t"]) / 1000
        if seconds <= 0:
            return 0.0
        backlogs = [point["depth"] + point["channel_depth"] for point in window]
        change = backlogs[-1] - backlogs[0]
        older, newer = backlogs[: len(backlogs) // 2], backlogs[len(backlogs) // 2 :]
        if change > 0 and min(newer) <= max(older):
            # it rises and falls (a consumer taking batches): growing only when the newer half
            # of the window stays above everything in the older half
            return 0.0
        return _round(change / seconds)

    # ------------------------------------------------------------------ queries

    def overview(self) -> Json:
        poll = self.last
        failures = [f.as_json() for f in poll.node_failures] if poll else []
        lookupd_failures = [f.as_json() for f in poll.lookupd_failures] if poll else []
        messages = [f["error"] for f in failures + lookupd_failures]
        return {
            "updated_at": round(poll.at * 1000) if poll else 0,
            "poll_interval_ms": self.interval_ms,
            "nodes": {
                "total": poll.node_count if poll else 0,
                "reachable": (poll.node_count - len(failures)) if poll else 0,
                "unreachable": failures,
            },
            "lookupd": {
                "total": poll.lookupd_count if poll else 0,
                "reachable": (poll.lookupd_count - len(lookupd_failures)) if poll else 0,
                "unreachable": lookupd_failures,
            },
            "topics": self._overview_topics,
            "message": "WARNING: " + "; ".join(messages) if messages else "",
        }

    def topic_points(self, topic: str) -> list[Json] | None:
        if self.last is None:
            return []
        series = self.topics.get(topic)
        return list(series) if series is not None else None

    def channel_points(self, topic: str, channel: str) -> list[Json] | None:
        if self.last is None:
            return []
        series = self.channels.get((topic, channel))
        return list(series) if series is not None else None

    def node_points(self, node: str) -> list[Json] | None:
        if self.last is None:
            return []
        series = self.nodes.get(node)
        return list(series) if series is not None else None

    def latest_channels(self) -> dict[tuple[str, str], Json]:
        """Each channel's point from the last poll (channels the last poll did not see are
        left out)."""
        if self.last is None:
            return {}
        t_ms = round(self.last.at * 1000)
        return {key: s[-1] for key, s in self.channels.items() if s and s[-1]["t"] == t_ms}

    def unreachable_nodes(self) -> list[Json]:
        return [f.as_json() for f in self.last.node_failures] if self.last else []


def _empty_row(name: str) -> Json:
    return {
        "topic_name": name,
        "depth": 0,
        "backend_depth": 0,
        "message_count": 0,
        "paused": False,
        "channel_names": set(),
        "channel_depth": 0,
        "in_flight_count": 0,
        "deferred_count": 0,
        "client_count": 0,
        "msgs_in": 0,
        "msgs_out": 0,
        "rate_in": 0.0,
        "rate_out": 0.0,
        "producer_count_stats": 0,
    }


class Poller:
    """Polls the cluster every ``interval`` seconds into ``history`` until stopped."""

    def __init__(
        self,
        cluster: ci.ClusterInfo,
        history: History,
        interval: float,
        lookupds: Sequence[str],
        nsqds: Sequence[str],
        logger: lg.Logger,
    ) -> None:
        self.ci = cluster
        self.history = history
        self.interval = interval
        self.lookupds = list(lookupds)
        self.nsqds = list(nsqds)
        self.logger = logger
        self.polls = 0
        self._names: dict[str, str] = {}  # nsqd mode: configured address -> broadcast:http_port
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.interval > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                self.history.record(await self.poll())
                self.polls += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a poll must never end the poller
                self.logger.error(f"POLLER: poll failed - {exc!r}")
            await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))

    async def poll(self) -> Poll:
        if self.lookupds:
            return await self._poll_lookupd_mode()
        return await self._poll_nsqd_mode()

    async def _stats(self, addresses: Sequence[str]) -> tuple[dict[str, Json], list[ci.Failure]]:
        async def one(address: str) -> tuple[str, Json | ci.Failure]:
            url = f"http://{address}/stats?format=json&include_clients=false"
            try:
                data = await self.ci.client.get_v1(url)
            except RequestError as exc:
                return address, ci.Failure(address, str(exc))
            return address, data if isinstance(data, dict) else {}

        answers = await asyncio.gather(*(one(a) for a in addresses))
        stats = {a: v for a, v in answers if not isinstance(v, ci.Failure)}
        return stats, [v for _, v in answers if isinstance(v, ci.Failure)]

    async def _poll_lookupd_mode(self) -> Poll:
        lookupd_failures: dict[str, ci.Failure] = {}
        producers: list[Json] = []
        topics: list[str] = []
        try:
            found = await self.ci.get_lookupd_producers(self.lookupds)
            producers = found.value
            lookupd_failures.update((f.address, f) for f in found.failures)
        except ci.UpstreamError as exc:
            lookupd_failures.update((f.address, f) for f in exc.failures)
        try:
            listed = await self.ci.get_lookupd_topics(self.lookupds)
            topics = listed.value
            lookupd_failures.update((f.address, f) for f in listed.failures)
        except ci.UpstreamError as exc:
            for failure in exc.failures:
                lookupd_failures.setdefault(failure.address, failure)
        registrations: dict[str, tuple[int, int]] = {}
        for producer in producers:
            for entry in producer["topics"] or []:
                live, dead = registrations.get(entry["topic"], (0, 0))
                if entry["tombstoned"]:
                    registrations[entry["topic"]] = (live, dead + 1)
                else:
                    registrations[entry["topic"]] = (live + 1, dead)
        addresses = [http_address(p) for p in producers]
        stats, failures = await self._stats(addresses)
        return Poll(
            at=time.time(),
            nodes={a: sample_topics(s) for a, s in stats.items()},
            node_count=len(addresses),
            node_failures=failures,
            lookupd_count=len(self.lookupds),
            lookupd_failures=list(lookupd_failures.values()),
            lookupd_topics=topics,
            registrations=registrations,
        )

    async def _node_name(self, address: str) -> str:
        """An nsqd's name on the node pages (``broadcast_address:http_port``), asked once."""
        name = self._names.get(address)
        if name is None:
            try:
                info = await self.ci.client.get_v1(f"http://{address}/info")
                name = http_address(producer_from_info(address, info, []))
            except (RequestError, AttributeError, TypeError):
                return address
            self._names[address] = name
        return name

    async def _poll_nsqd_mode(self) -> Poll:
        stats, failures = await self._stats(self.nsqds)
        nodes = {}
        for address, data in stats.items():
            nodes[await self._node_name(address)] = sample_topics(data)
        return Poll(
            at=time.time(),
            nodes=nodes,
            node_count=len(self.nsqds),
            node_failures=failures,
            lookupd_count=0,
            lookupd_failures=[],
        )
