"""nsqd + nsqlookupd black-box: Go's TestCluster and its ephemeral clean-up test (here including
the lookupd side), channel pre-creation (a new topic gets the channels lookupd knows for it),
runtime ``PUT /config/nsqlookupd_tcp_addresses`` and the tombstone-then-delete flow.

Real ``python -m nsqpy.nsqd`` and ``python -m nsqpy.nsqlookupd`` processes on free loopback
ports; lookupd is read over raw HTTP with the V1 ``Accept`` header, as Go's tests do. Every wait
polls with a deadline; the only fixed pause is a short "nothing else arrives" window.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd, start_nsqlookupd

from ..raw_v2 import (
    HttpResponse,
    channel_stats,
    http_ok,
    http_request,
    q,
    topic_stats,
    unique,
    wait_for,
)
from .conftest import connect, create_channel, create_topic, http_pub

V1_ACCEPT = {"Accept": "application/vnd.nsq; version=1.0"}
GO_ZERO_TIME_NS = -6795364578871345152
HOSTNAME = socket.gethostname()
#: Go sleeps 350 ms; a loaded 2-core CI box gets more slack, polled.
PUSH_DEADLINE = 3.0
PEER_ID = re.compile(r"127\.0\.0\.1:\d+")

StartLookupd = Callable[..., DaemonProcess]
StartNsqd = Callable[..., DaemonProcess]


# --------------------------------------------------------------------------- daemons


@pytest.fixture
def start_lookupd() -> Iterator[StartLookupd]:
    """Start nsqlookupds (``--broadcast-address=127.0.0.1``); stop them after the test."""
    started: list[DaemonProcess] = []

    def start(*flags: str) -> DaemonProcess:
        daemon = start_nsqlookupd(*flags)
        started.append(daemon)
        return daemon

    yield start
    crashed = [d.log for d in started if d.proc is not None and d.proc.poll() is not None]
    for daemon in started:
        daemon.stop()
    assert not crashed, "nsqlookupd died during the test:\n" + "\n\n".join(crashed)


@pytest.fixture
def start_nsqd_with(tmp_path: Path) -> Iterator[StartNsqd]:
    """Start nsqds (``--broadcast-address=127.0.0.1``) registered with the given lookupds."""
    started: list[DaemonProcess] = []

    def start(*lookupds: DaemonProcess) -> DaemonProcess:
        data_path = tmp_path / f"nsqd{len(started)}"
        data_path.mkdir()
        flags = [f"--lookupd-tcp-address={tcp_addr(lookupd)}" for lookupd in lookupds]
        daemon = start_nsqd(data_path, *flags)
        started.append(daemon)
        return daemon

    yield start
    crashed = [d.log for d in started if d.proc is not None and d.proc.poll() is not None]
    for daemon in started:
        daemon.stop()
    assert not crashed, "nsqd died during the test:\n" + "\n\n".join(crashed)


def tcp_addr(daemon: DaemonProcess) -> str:
    host, port = daemon.tcp_address
    return f"{host}:{port}"


# --------------------------------------------------------------------------- lookupd reads


def v1_get(lookupd: DaemonProcess, path: str) -> HttpResponse:
    return http_request(lookupd, "GET", path, headers=V1_ACCEPT)


def v1_json(lookupd: DaemonProcess, path: str) -> Any:
    resp = v1_get(lookupd, path)
    assert resp.status == 200, (path, resp.status, resp.body)
    return resp.json()


def debug(lookupd: DaemonProcess) -> dict[str, list[dict[str, Any]]]:
    data: dict[str, list[dict[str, Any]]] = v1_json(lookupd, "/debug")
    return data


def lookup(lookupd: DaemonProcess, topic: str) -> dict[str, Any] | None:
    """``/lookup?topic=`` as JSON, or None for Go's 404 ``TOPIC_NOT_FOUND``."""
    resp = v1_get(lookupd, f"/lookup?{q(topic=topic)}")
    if resp.status == 404:
        assert resp.body == b'{"message":"TOPIC_NOT_FOUND"}'
        return None
    assert resp.status == 200, resp.body
    result: dict[str, Any] = resp.json()
    return result


def producer_ports(lookupd: DaemonProcess, topic: str) -> list[int]:
    """TCP ports of the producers ``/lookup`` lists for ``topic`` (sorted; [] if unknown)."""
    found = lookup(lookupd, topic)
    return sorted(p["tcp_port"] for p in (found or {}).get("producers", []))


def nodes(lookupd: DaemonProcess) -> list[dict[str, Any]]:
    producers: list[dict[str, Any]] = v1_json(lookupd, "/nodes")["producers"]
    return producers


def node_topics(lookupd: DaemonProcess, nsqd: DaemonProcess) -> dict[str, bool] | None:
    """``topic -> tombstoned`` of ``nsqd``'s ``/nodes`` entry, or None if it is not listed."""
    for node in nodes(lookupd):
        if node["tcp_port"] == nsqd.tcp_port:
            return dict(zip(node["topics"], node["tombstones"], strict=True))
    return None


def debug_producers(lookupd: DaemonProcess, key: str) -> list[int]:
    """TCP ports of the producers ``/debug`` has under ``key`` (absent key: [])."""
    return sorted(record["tcp_port"] for record in debug(lookupd).get(key, []))


def compact(value: Any) -> bytes:
    """Go's ``json.Marshal`` output for plain ASCII values."""
    return json.dumps(value, separators=(",", ":")).encode()


def peer_info(nsqd: DaemonProcess, remote_address: str) -> dict[str, Any]:
    """Go's ``PeerInfo`` JSON, in its struct field order, as an nsqd 1.3.0 registers it."""
    return {
        "remote_address": remote_address,
        "hostname": HOSTNAME,
        "broadcast_address": "127.0.0.1",
        "tcp_port": nsqd.tcp_port,
        "http_port": nsqd.http_port,
        "version": "1.3.0",
    }


def debug_record(nsqd: DaemonProcess, peer_id: str, last_update: int) -> dict[str, Any]:
    """One ``/debug`` producer as Go 1.3.0 prints it (a map: keys sorted)."""
    return {
        "broadcast_address": "127.0.0.1",
        "hostname": HOSTNAME,
        "http_port": nsqd.http_port,
        "id": peer_id,
        "last_update": last_update,
        "tcp_port": nsqd.tcp_port,
        "tombstoned": False,
        "tombstoned_at": GO_ZERO_TIME_NS,
        "version": "1.3.0",
    }


def has_keys(*keys: str) -> Callable[[dict[str, Any]], bool]:
    return lambda data: all(key in data for key in keys)


def lacks_keys(*keys: str) -> Callable[[dict[str, Any]], bool]:
    return lambda data: not any(key in data for key in keys)


# --------------------------------------------------------------------------- scenario 73


def test_cluster_registration_is_json_exact_and_delete_unregisters(
    start_lookupd: StartLookupd, start_nsqd_with: StartNsqd
) -> None:
    lookupd = start_lookupd()
    nsqd = start_nsqd_with(lookupd)
    topic = unique("cluster_test")
    create_topic(nsqd, topic)
    http_ok(nsqd, "POST", f"/channel/create?{q(topic=topic, channel='ch')}")
    topic_key, channel_key = f"topic:{topic}:", f"channel:{topic}:ch"

    data = wait_for(
        lambda: debug(lookupd),
        has_keys(topic_key, channel_key),
        PUSH_DEADLINE,
        "nsqd to push its topic and channel",
    )
    assert set(data) == {"client::", channel_key, topic_key}
    [client] = data["client::"]
    peer_id = client["id"]
    assert PEER_ID.fullmatch(peer_id), peer_id
    for key in ("client::", topic_key, channel_key):
        [record] = data[key]
        assert list(record) == sorted(record)
        assert record == debug_record(nsqd, peer_id, record["last_update"])
    resp = v1_get(lookupd, "/debug")
    assert resp.body == compact(data)  # compact, and keys in the order checked above

    found = v1_get(lookupd, f"/lookup?{q(topic=topic)}")
    assert found.status == 200
    assert found.body == compact({"channels": ["ch"], "producers": [peer_info(nsqd, peer_id)]})
    assert v1_get(lookupd, "/nodes").body == compact(
        {"producers": [{**peer_info(nsqd, peer_id), "tombstones": [False], "topics": [topic]}]}
    )
    assert v1_get(lookupd, f"/channels?{q(topic=topic)}").body == b'{"channels":["ch"]}'

    http_ok(nsqd, "POST", f"/topic/delete?{q(topic=topic)}")
    wait_for(
        lambda: v1_get(lookupd, f"/lookup?{q(topic=topic)}").body,
        lambda body: body == b'{"channels":["ch"],"producers":[]}',
        PUSH_DEADLINE,
        "the topic's producer to go",
    )
    after = debug(lookupd)
    assert sorted(after) == ["client::"]  # keys without producers are not shown
    assert after["client::"] == [client | {"last_update": after["client::"][0]["last_update"]}]
    # the nsqd stays connected, with no topics
    assert v1_get(lookupd, "/nodes").body == compact(
        {"producers": [{**peer_info(nsqd, peer_id), "tombstones": [], "topics": []}]}
    )


def test_a_lone_topic_registers_without_a_channel_key(
    start_lookupd: StartLookupd, start_nsqd_with: StartNsqd
) -> None:
    lookupd = start_lookupd()
    nsqd = start_nsqd_with(lookupd)
    topic = unique("lone")
    http_pub(nsqd, topic, b"m")
    data = wait_for(lambda: debug(lookupd), has_keys(f"topic:{topic}:"), PUSH_DEADLINE)
    assert set(data) == {"client::", f"topic:{topic}:"}
    assert v1_get(lookupd, f"/channels?{q(topic=topic)}").body == b'{"channels":[]}'
    assert producer_ports(lookupd, topic) == [nsqd.tcp_port]


# --------------------------------------------------------------------------- scenario 75


def test_ephemeral_topic_and_channel_go_with_their_last_client(
    start_lookupd: StartLookupd, start_nsqd_with: StartNsqd
) -> None:
    lookupd = start_lookupd()
    nsqd = start_nsqd_with(lookupd)
    topic, channel = unique("ephemeral_topic") + "#ephemeral", "ch1#ephemeral"
    topic_key, channel_key = f"topic:{topic}:", f"channel:{topic}:{channel}"

    with connect(nsqd) as consumer:
        consumer.identify()
        consumer.sub(topic, channel)
        wait_for(lambda: debug(lookupd), has_keys(topic_key, channel_key), PUSH_DEADLINE)
        assert json.loads(v1_get(lookupd, "/topics").body)["topics"] == [topic]
        assert lookup(lookupd, topic) == {
            "channels": [channel],
            "producers": [peer_info(nsqd, debug(lookupd)[topic_key][0]["id"])],
        }
        consumer.rdy(1)
        http_pub(nsqd, topic, b"an_ephemeral_message")
        message = consumer.expect_message()
        assert message.body == b"an_ephemeral_message"
        consumer.fin(message.id)

    # Go: within 100 ms of the client going, channel and topic are gone from nsqd ...
    wait_for(lambda: topic_stats(nsqd, topic), lambda t: t is None, 2.0, "nsqd to delete them")
    # ... and lookupd drops both registrations with their last producer
    wait_for(lambda: debug(lookupd), lacks_keys(topic_key, channel_key), PUSH_DEADLINE)
    assert v1_get(lookupd, "/topics").body == b'{"topics":[]}'
    assert v1_get(lookupd, f"/channels?{q(topic=topic)}").body == b'{"channels":[]}'
    assert lookup(lookupd, topic) is None


def test_ephemeral_channel_of_a_normal_topic_goes_alone(
    start_lookupd: StartLookupd, start_nsqd_with: StartNsqd
) -> None:
    lookupd = start_lookupd()
    nsqd = start_nsqd_with(lookupd)
    topic = unique("normal")
    with connect(nsqd) as consumer:
        consumer.identify()
        consumer.sub(topic, "tmp#ephemeral")
        wait_for(lambda: debug(lookupd), has_keys(f"channel:{topic}:tmp#ephemeral"))
    wait_for(
        lambda: lookup(lookupd, topic),
        lambda found: found is not None and found["channels"] == [],
        PUSH_DEADLINE,
        "the ephemeral channel registration to go",
    )
    assert producer_ports(lookupd, topic) == [nsqd.tcp_port]  # the topic stays registered
    assert topic_stats(nsqd, topic) is not None


def test_ephemeral_registration_stays_until_its_last_producer_leaves(
    start_lookupd: StartLookupd, start_nsqd_with: StartNsqd
) -> None:
    lookupd = start_lookupd()
    first, second = start_nsqd_with(lookupd), start_nsqd_with(lookupd)
    topic, channel = unique("shared") + "#ephemeral", "ch#ephemeral"
    channel_key = f"channel:{topic}:{channel}"
    both = sorted([first.tcp_port, second.tcp_port])

    with connect(first) as on_first, connect(second) as on_second:
        for consumer in (on_first, on_second):
            consumer.identify()
            consumer.sub(topic, channel)
        wait_for(lambda: debug_producers(lookupd, channel_key), lambda p: p == both)
        on_first.close()
        wait_for(
            lambda: debug_producers(lookupd, channel_key),
            lambda ports: ports == [second.tcp_port],
            PUSH_DEADLINE,
            "the first nsqd to unregister",
        )
        assert lookup(lookupd, topic) == {
            "channels": [channel],
            "producers": [peer_info(second, debug(lookupd)[channel_key][0]["id"])],
        }
        assert json.loads(v1_get(lookupd, f"/channels?{q(topic=topic)}").body) == {
            "channels": [channel]
        }
    wait_for(lambda: lookup(lookupd, topic), lambda found: found is None, PUSH_DEADLINE)
    assert lacks_keys(f"topic:{topic}:", channel_key)(debug(lookupd))
    assert v1_get(lookupd, f"/channels?{q(topic=topic)}").body == b'{"channels":[]}'


# --------------------------------------------------------------------------- pre-creation


def test_new_topic_precreates_the_channels_lookupd_knows(
    start_lookupd: StartLookupd, start_nsqd_with: StartNsqd
) -> None:
    lookupd = start_lookupd()
    first, second = start_nsqd_with(lookupd), start_nsqd_with(lookupd)
    topic = unique("precreate")
    create_channel(first, topic, "archive")
    create_channel(first, topic, "tail#ephemeral")  # never subscribed, so it stays
    wait_for(
        lambda: v1_json(lookupd, f"/channels?{q(topic=topic)}")["channels"],
        lambda channels: sorted(channels) == ["archive", "tail#ephemeral"],
        PUSH_DEADLINE,
        "lookupd to learn both channels",
    )
    # second must also have told lookupd its HTTP address is worth asking: it has, on connect
    wait_for(lambda: len(nodes(lookupd)), lambda n: n == 2, PUSH_DEADLINE)

    http_pub(second, topic, b"first message")
    # (Go's /pub answers after the pre-creation; nsqpy's may answer just before it)
    created = wait_for(
        lambda: topic_stats(second, topic),
        lambda t: t is not None and bool(t["channels"]),
        what="the pre-created channel",
    )
    assert created is not None
    assert [c["channel_name"] for c in created["channels"]] == ["archive"]
    # the message went to the pre-created channel, not left on the topic for a later one
    archive = wait_for(
        lambda: channel_stats(second, topic, "archive"),
        lambda c: c is not None and c["message_count"] == 1 and c["depth"] == 1,
    )
    assert archive is not None
    assert topic_stats(second, topic)["depth"] == 0  # type: ignore[index]

    with connect(second) as late:
        late.identify()
        late.sub(topic, "late")
        late.rdy(1)
        late.expect_nothing(0.3, allow_heartbeats=True)
    with connect(second) as consumer:
        consumer.identify()
        consumer.sub(topic, "archive")
        consumer.rdy(1)
        message = consumer.expect_message()
        assert message.body == b"first message"
        assert message.attempts == 1
        consumer.fin(message.id)
    assert channel_stats(second, topic, "tail#ephemeral") is None
    assert channel_stats(second, topic, "late")["message_count"] == 0  # type: ignore[index]


# --------------------------------------------------------------------------- runtime config


def put_lookupds(nsqd: DaemonProcess, *lookupds: DaemonProcess) -> bytes:
    body = compact([tcp_addr(lookupd) for lookupd in lookupds])
    echoed = http_ok(nsqd, "PUT", "/config/nsqlookupd_tcp_addresses", body)
    assert echoed == body
    assert http_ok(nsqd, "GET", "/config/nsqlookupd_tcp_addresses") == body
    return body


def test_put_config_adds_and_removes_lookupds_at_runtime(
    start_lookupd: StartLookupd, start_nsqd_with: StartNsqd
) -> None:
    old, new = start_lookupd(), start_lookupd()
    nsqd = start_nsqd_with(old)
    topic = unique("runtime")
    create_channel(nsqd, topic, "ch")
    wait_for(lambda: producer_ports(old, topic), lambda p: p == [nsqd.tcp_port], PUSH_DEADLINE)
    assert lookup(new, topic) is None
    assert nodes(new) == []

    put_lookupds(nsqd, old, new)
    found = wait_for(
        lambda: lookup(new, topic),
        lambda found: found is not None and len(found["producers"]) == 1,
        PUSH_DEADLINE,
        "the added lookupd to get the existing registrations",
    )
    assert found is not None
    assert found["channels"] == ["ch"]
    assert found["producers"][0]["tcp_port"] == nsqd.tcp_port
    assert node_topics(new, nsqd) == {topic: False}

    put_lookupds(nsqd, new)
    wait_for(lambda: nodes(old), lambda n: n == [], PUSH_DEADLINE, "the removed lookupd to drop us")
    # the connection went; the (non-ephemeral) keys stay without producers
    assert lookup(old, topic) == {"channels": ["ch"], "producers": []}
    assert node_topics(new, nsqd) == {topic: False}

    later = unique("after_removal")
    create_topic(nsqd, later)
    wait_for(lambda: producer_ports(new, later), lambda p: p == [nsqd.tcp_port], PUSH_DEADLINE)
    assert lookup(old, later) is None

    put_lookupds(nsqd)
    assert http_ok(nsqd, "GET", "/config/nsqlookupd_tcp_addresses") == b"[]"
    wait_for(lambda: nodes(new), lambda n: n == [], PUSH_DEADLINE, "the last lookupd to drop us")


# --------------------------------------------------------------------------- tombstones


def tombstone(lookupd: DaemonProcess, topic: str, nsqd: DaemonProcess) -> None:
    node = f"127.0.0.1:{nsqd.http_port}"
    assert http_ok(lookupd, "POST", f"/topic/tombstone?{q(topic=topic, node=node)}") == b""


def test_tombstone_then_delete_removes_the_producer_for_good(
    start_lookupd: StartLookupd, start_nsqd_with: StartNsqd
) -> None:
    lookupd = start_lookupd("--tombstone-lifetime=1s")
    doomed, kept = start_nsqd_with(lookupd), start_nsqd_with(lookupd)
    both = sorted([doomed.tcp_port, kept.tcp_port])
    topic, control = unique("tombstoned"), unique("control")
    for nsqd in (doomed, kept):
        create_channel(nsqd, topic, "ch")
        create_topic(nsqd, control)
    wait_for(
        lambda: [producer_ports(lookupd, topic), producer_ports(lookupd, control)],
        lambda ports: ports == [both, both],
    )

    # nsqadmin's flow: tombstone the topic's producer on lookupd, then delete it on that nsqd
    tombstone(lookupd, topic, doomed)
    tombstone(lookupd, control, doomed)
    assert producer_ports(lookupd, topic) == [kept.tcp_port]
    assert producer_ports(lookupd, control) == [kept.tcp_port]
    assert node_topics(lookupd, doomed) == {topic: True, control: True}
    assert node_topics(lookupd, kept) == {topic: False, control: False}

    http_ok(doomed, "POST", f"/topic/delete?{q(topic=topic)}")
    wait_for(
        lambda: node_topics(lookupd, doomed),
        lambda topics: topics == {control: True},
        PUSH_DEADLINE,
        "the deleted topic's UNREGISTER",
    )
    # once the tombstone lifetime is over, the untouched producer comes back ...
    wait_for(lambda: producer_ports(lookupd, control), lambda p: p == both, 5.0, "tombstone expiry")
    # ... but the deleted one is gone for good
    found = lookup(lookupd, topic)
    assert found is not None
    assert [p["tcp_port"] for p in found["producers"]] == [kept.tcp_port]
    assert found["channels"] == ["ch"]  # kept still has it
    assert node_topics(lookupd, doomed) == {control: False}
    assert topic_stats(doomed, topic) is None
