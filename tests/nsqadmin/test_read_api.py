"""nsqadmin's read routes against a real cluster, in lookupd and nsqd mode (Go's JSON)."""

from __future__ import annotations

import pytest

from .conftest import Cluster, StartAdmin, api

MODES = ["lookupd", "nsqd"]


def test_ping(start_admin: StartAdmin) -> None:
    admin = start_admin()
    assert api(admin, "GET", "/ping") == (200, "OK")


@pytest.mark.parametrize("mode", MODES)
def test_topics_lists_every_topic_sorted(cluster: Cluster, start_admin: StartAdmin, mode: str) -> None:
    first, second = cluster.new_topic("b"), cluster.new_topic("a")
    cluster.pub(first, node=0)
    cluster.pub(second, node=1)
    cluster.wait_registered(first, 1)
    cluster.wait_registered(second, 1)
    admin = start_admin(mode=mode)
    status, body = api(admin, "GET", "/api/topics")
    assert status == 200
    assert set(body) == {"topics", "message"}
    assert body["message"] == ""
    assert body["topics"] == sorted(body["topics"])
    assert {first, second} <= set(body["topics"])
