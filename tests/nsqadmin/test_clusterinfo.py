"""``nsqpy.internal.clusterinfo`` as a library, with no web layer, against a real cluster."""

from __future__ import annotations

import pytest

from nsqpy.internal.api_client import ApiClient
from nsqpy.internal.clusterinfo import ClusterInfo, UpstreamError
from nsqpy.internal.clusterinfo_types import http_address

from .conftest import Cluster


async def test_query_and_aggregate(cluster: Cluster) -> None:
    topic = cluster.new_topic("lib")
    for node, count in ((0, 2), (1, 5)):
        cluster.create_channel(topic, "c", node)
        cluster.pub(topic, b"m", node, count)
    cluster.wait_registered(topic, 2)
    lookupds = [cluster.lookupd_address]
    async with ClusterInfo(ApiClient(connect_timeout=2, request_timeout=5)) as ci:
        topics = await ci.get_lookupd_topics(lookupds)
        assert topic in topics.value and topics.failures == []
        producers = await ci.get_topic_producers(topic, lookupds, [])
        assert sorted(http_address(p) for p in producers.value) == sorted(cluster.nsqd_addresses)
        stats = await ci.get_nsqd_stats(producers.value, topic, "", include_clients=False)
        assert sum(t["message_count"] for t in stats.value.topics) == 7
        channel = stats.value.channels["c"]
        assert (channel["node"], channel["depth"], len(channel["nodes"])) == ("*", 7, 2)
        failures = await ci.topic_channel_action("channel/pause", topic, "c", lookupds, [])
        assert failures == []
    assert cluster.channel_stats(0, topic, "c")["paused"] is True


async def test_partial_and_total_failure(cluster: Cluster) -> None:
    async with ClusterInfo() as ci:
        partial = await ci.get_lookupd_topics([cluster.lookupd_address, "127.0.0.1:1"])
        assert [f.address for f in partial.failures] == ["127.0.0.1:1"]
        assert "connection refused" in partial.error_text
        with pytest.raises(UpstreamError, match="failed to query any nsqlookupd: ") as caught:
            await ci.get_lookupd_topics(["127.0.0.1:1"])
        assert [f.address for f in caught.value.failures] == ["127.0.0.1:1"]
