"""History's arithmetic on hand-made polls (no network): rates, trend, bounds, forgetting."""

from __future__ import annotations

from nsqpy.internal.clusterinfo import Failure
from nsqpy.nsqadmin.history import (
    OVERVIEW_POINTS,
    RATE_WINDOW,
    TREND_POLLS,
    History,
    Poll,
    sample_topics,
)


def poll(at: float, nodes: dict[str, list[dict[str, object]]], failures: int = 0) -> Poll:
    return Poll(
        at=at,
        nodes={node: sample_topics({"topics": topics}) for node, topics in nodes.items()},
        node_count=len(nodes) + failures,
        node_failures=[Failure(f"dead:{i}", "connection refused") for i in range(failures)],
        lookupd_count=0,
        lookupd_failures=[],
    )


def topic(
    name: str, messages: int, depth: int, channels: list[dict[str, object]]
) -> dict[str, object]:
    return {"topic_name": name, "message_count": messages, "depth": depth, "channels": channels}


def channel(name: str, messages: int, depth: int, in_flight: int = 0) -> dict[str, object]:
    return {
        "channel_name": name,
        "message_count": messages,
        "depth": depth,
        "in_flight_count": in_flight,
        "deferred_count": 0,
        "client_count": 1,
    }


def test_rates_are_per_second_deltas_summed_over_nodes() -> None:
    history = History(interval=2.0, points=10)
    history.record(poll(100.0, {"a": [topic("t", 10, 0, [channel("c", 10, 5)])]}))
    history.record(
        poll(
            102.0,
            {
                "a": [topic("t", 30, 0, [channel("c", 30, 5, in_flight=1)])],
                "b": [topic("t", 50, 0, [channel("c", 50, 50)])],  # new node: no delta yet
            },
        )
    )
    row = history.overview()["topics"][0]
    assert row["rate_in"] == 10.0  # (30 - 10) / 2 s, node a only
    assert row["rate_out"] == 9.5  # finished: (30-5-1) - (10-5) = 19 over 2 s
    assert row["channel_depth"] == 55 and row["producer_count"] == 2
    assert row["depth_trend"] == 25.0  # backlog 5 -> 55 over 2 s
    points = history.topic_points("t")
    assert points is not None and [p["t"] for p in points] == [100_000, 102_000]
    channel_points = history.channel_points("t", "c")
    assert channel_points is not None and channel_points[-1]["rate_in"] == 10.0
    node_points = history.node_points("a")
    assert node_points is not None and node_points[-1]["rate_in"] == 10.0


def test_counter_going_down_is_not_a_negative_rate() -> None:
    history = History(interval=1.0, points=10)
    history.record(poll(1.0, {"a": [topic("t", 100, 0, [])]}))
    history.record(poll(2.0, {"a": [topic("t", 3, 0, [])]}))  # the node restarted
    assert history.overview()["topics"][0]["rate_in"] == 0.0


def test_history_is_bounded_and_forgets_deleted_topics() -> None:
    history = History(interval=1.0, points=3)
    for second in range(10):
        history.record(poll(float(second), {"a": [topic("kept", second, 0, [])]}))
    points = history.topic_points("kept")
    assert points is not None and len(points) == 3
    history.record(poll(10.0, {"a": [topic("gone", 0, 0, [])]}))
    assert history.topic_points("kept") is not None  # within the window still
    for second in range(11, 16):
        history.record(poll(float(second), {"a": []}))
    assert history.topic_points("kept") is None and history.topic_points("gone") is None


def test_unreachable_nodes_in_the_overview() -> None:
    history = History(interval=1.0, points=3)
    assert history.overview()["updated_at"] == 0
    history.record(poll(5.0, {"a": []}, failures=1))
    overview = history.overview()
    assert overview["updated_at"] == 5000
    assert overview["nodes"] == {
        "total": 2,
        "reachable": 1,
        "unreachable": [{"address": "dead:0", "error": "connection refused"}],
    }
    assert overview["message"] == "WARNING: connection refused"


def steady_polls(history: History, start: int, count: int, depth: int) -> None:
    """``count`` polls one second apart in which nothing is published and the backlog holds."""
    for second in range(start, start + count):
        history.record(poll(float(second), {"a": [topic("t", 50, 0, [channel("c", 50, depth)])]}))


def test_trend_looks_at_the_last_polls_only() -> None:
    history = History(interval=1.0, points=360)
    for second in range(5):  # the backlog fills: 0, 10, ..., 40 (then 50 below)
        m = 10 * second
        history.record(poll(float(second), {"a": [topic("t", m, 0, [channel("c", m, m)])]}))
    steady_polls(history, 5, 1, 50)
    assert history.overview()["topics"][0]["depth_trend"] == 10.0
    # It stopped growing: within TREND_POLLS polls the trend is flat again, although the
    # first points (backlog 0) are still in the 360-point history.
    steady_polls(history, 6, TREND_POLLS, 50)
    row = history.overview()["topics"][0]
    assert row["depth_trend"] == 0.0 and row["channel_depth"] == 50
    points = history.topic_points("t")
    assert points is not None and points[0]["channel_depth"] == 0


def test_rates_are_averaged_over_the_rate_window() -> None:
    # A producer that publishes 100 messages every other second: 50/s, not 100, 0, 100, 0.
    history = History(interval=1.0, points=100)
    for second in range(40):
        m = 100 * ((second + 1) // 2)
        history.record(poll(float(second), {"a": [topic("t", m, 0, [channel("c", m, 0)])]}))
        if second >= RATE_WINDOW:
            row = history.overview()["topics"][0]
            assert 45.0 <= row["rate_in"] <= 55.0, (second, row["rate_in"])
            assert 45.0 <= row["rate_out"] <= 55.0, (second, row["rate_out"])


def test_every_rate_of_a_poll_is_the_same_computation() -> None:
    history = History(interval=1.0, points=100)
    for second in range(20):
        m = 7 * second * second  # an accelerating producer
        history.record(poll(float(second), {"a": [topic("t", m, 0, [channel("c", m, 3)])]}))
        row = history.overview()["topics"][0]
        topic_point = (history.topic_points("t") or [])[-1]
        channel_point = (history.channel_points("t", "c") or [])[-1]
        node_point = (history.node_points("a") or [])[-1]
        assert row["rate_in"] == topic_point["rate_in"] == channel_point["rate_in"]
        assert row["rate_in"] == node_point["rate_in"]
        assert row["rate_out"] == topic_point["rate_out"] == node_point["rate_out"]
        assert row["history"]["rate_in"][-1] == row["rate_in"]


def test_overview_rows_carry_a_compact_history() -> None:
    history = History(interval=1.0, points=200)
    for second in range(150):
        history.record(poll(float(second), {"a": [topic("t", second, 2, [channel("c", 0, 3)])]}))
    row = history.overview()["topics"][0]
    compact = row["history"]
    assert list(compact) == ["t", "queued", "rate_in", "rate_out"]
    assert len(compact["t"]) == OVERVIEW_POINTS
    assert all(len(values) == OVERVIEW_POINTS for values in compact.values())
    points = history.topic_points("t") or []
    assert compact["t"][0] == points[0]["t"] and compact["t"][-1] == points[-1]["t"]
    assert compact["t"] == sorted(compact["t"])
    assert compact["queued"][-1] == 5  # the topic's 2 plus its channel's 3
    assert compact["rate_in"][-1] == points[-1]["rate_in"] == 1.0


def test_a_channel_made_between_polls_gets_its_topics_rate() -> None:
    # The topic was polled before its channel existed; the channel and 50 messages arrived
    # before the next poll. The channel received those 50: its msgs/s in is the topic's.
    history = History(interval=1.0, points=10)
    history.record(poll(1.0, {"a": [topic("t", 0, 0, [])]}))
    history.record(poll(2.0, {"a": [topic("t", 50, 0, [channel("c", 50, 50)])]}))
    row = history.overview()["topics"][0]
    channel_point = (history.channel_points("t", "c") or [])[-1]
    assert row["rate_in"] == channel_point["rate_in"] == 50.0


def backlog_polls(history: History, backlogs: list[int]) -> None:
    """One poll a second with channel ``c`` holding each backlog in turn."""
    for second, depth in enumerate(backlogs):
        history.record(poll(float(second), {"a": [topic("t", 50, 0, [channel("c", 50, depth)])]}))


def test_a_backlog_that_rises_and_falls_is_not_growing() -> None:
    """A consumer that takes batches (Spark, `make run`) makes the backlog swing: ending on a
    peak must not read as a growing backlog (the topics page would say "Backing up")."""
    history = History(interval=1.0, points=360)
    swings = [200] + [600, 200] * ((TREND_POLLS - 2) // 2) + [400, 600]
    assert len(swings) == TREND_POLLS + 1  # the trend window: from a trough to a peak
    backlog_polls(history, swings)
    assert history.overview()["topics"][0]["depth_trend"] == 0.0


def test_a_backlog_that_keeps_rising_through_its_swings_is_growing() -> None:
    history = History(interval=1.0, points=360)
    backlog_polls(history, [100 * i + (30 if i % 2 else 0) for i in range(TREND_POLLS + 1)])
    assert history.overview()["topics"][0]["depth_trend"] > 0
