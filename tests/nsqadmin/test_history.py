"""History's arithmetic on hand-made polls (no network): rates, trend, bounds, forgetting."""

from __future__ import annotations

from nsqpy.nsqadmin.clusterinfo import Failure
from nsqpy.nsqadmin.history import History, Poll, sample_topics


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
