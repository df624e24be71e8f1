"""nsqadmin's pages in a real browser (Debian's Chromium via Playwright) on a live cluster.

One cluster (conftest's ``cluster``: nsqlookupd + two nsqd), one browser and one nsqadmin for
the module; tests that need other flags start their own nsqadmin. Every test fails on any
JavaScript error the pages log. The screenshots land in docs/images/nsqadmin/.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from playwright.sync_api import Browser, expect

from nsqpy.testing import DaemonProcess, start_nsqadmin, start_nsqd
from tests.raw_v2 import NsqConn

from ..raw_v2 import wait_until
from .browser_support import PHONE, FakeGraphite, Watched, chromium, number
from .conftest import Cluster, api, http

pytestmark = pytest.mark.browser

expect.set_options(timeout=20_000)


@dataclass
class World:
    """The topics the module's tests look at (names are unique to this run)."""

    busy: str  # both nsqd; channels archive + metrics; a consumer on metrics (nsqd #0)
    quiet: str  # nsqd #1 only; channel mailer, paused
    ghost: str  # known to nsqlookupd only (created there, no producer)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


def admin_for(cluster: Cluster, *flags: str, mode: str = "lookupd") -> DaemonProcess:
    args = list(flags)
    if not any(flag.startswith("--poll-interval") for flag in flags):
        args.append("--poll-interval=200ms")
    if mode == "lookupd":
        args.append(f"--lookupd-http-address={cluster.lookupd_address}")
    else:
        args += [f"--nsqd-http-address={a}" for a in cluster.nsqd_addresses]
    return start_nsqadmin(*args)


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Iterator[DaemonProcess]:
    running = admin_for(cluster)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def world(cluster: Cluster, admin: DaemonProcess) -> Iterator[World]:
    busy, quiet, ghost = cluster.new_topic("busy"), cluster.new_topic("quiet"), cluster.new_topic()
    for node in (0, 1):
        make_channels(cluster, busy, node, "archive", "metrics")
    cluster.pub(busy, b"a" * 50, node=0, count=30)
    cluster.pub(busy, b"b" * 50, node=1, count=20)
    consumer = NsqConn(cluster.nsqds[0].tcp_address)
    # This connection never reads, so it answers no heartbeat: the longest interval nsqd allows
    # (60 s; it hangs up after two missed) keeps it listed for the whole module.
    consumer.identify(
        client_id="worker-1", hostname="box-1", user_agent="metrics/1.0", heartbeat_interval=60000
    )
    consumer.sub(busy, "metrics")  # RDY 0: connected, takes nothing, so the depths hold
    make_channels(cluster, quiet, 1, "mailer")
    cluster.pub(quiet, b"q", node=1, count=5)
    assert cluster.nsqd_post(1, f"/channel/pause?topic={quiet}&channel=mailer") == 200
    lookupd = cluster.lookupd.http_url
    assert http(f"{lookupd}/topic/create?topic={ghost}", "POST")[0] == 200
    assert http(f"{lookupd}/channel/create?topic={ghost}&channel=later", "POST")[0] == 200
    cluster.wait_registered(busy, 2)
    cluster.wait_registered(quiet, 1)
    wait_polled(admin, busy, "archive", "metrics")
    wait_polled(admin, quiet, "mailer")
    yield World(busy, quiet, ghost)
    consumer.close()


@pytest.fixture
def watched(browser: Browser, admin: DaemonProcess) -> Iterator[Watched]:
    page = Watched(browser, admin.http_url)
    yield page
    page.assert_no_errors()
    page.close()


def make_channels(cluster: Cluster, topic: str, node: int, *channels: str) -> None:
    assert cluster.nsqd_post(node, f"/topic/create?topic={topic}") == 200
    for channel in channels:
        cluster.create_channel(topic, channel, node)


def queued(cluster: Cluster, topic: str) -> int:
    """Messages waiting in a topic over the cluster: its queues plus its channels'."""
    total = 0
    for node in range(len(cluster.nsqds)):
        stats = cluster.topic_stats(node, topic) or {}
        total += stats.get("depth", 0)
        total += sum(c["depth"] for c in stats.get("channels") or [])
    return total


def channel_total(cluster: Cluster, topic: str, channel: str, key: str) -> int:
    found = [cluster.channel_stats(n, topic, channel) for n in range(len(cluster.nsqds))]
    return sum(c[key] for c in found if c)


def counter_total(admin: DaemonProcess) -> int:
    status, body = api(admin, "GET", "/api/counter")
    assert status == 200
    return sum(s["message_count"] for s in body["stats"].values())


def wait_polled(admin: DaemonProcess, topic: str, *channels: str) -> None:
    """Until nsqadmin's poller has history for the topic and channels (so a page opened now
    shows live figures: a series it has not seen yet has no points)."""

    def known(query: str) -> bool:
        status, body = api(admin, "GET", f"/api/history?{query}")
        return status == 200 and bool(body["points"])

    queries = [f"topic={topic}"] + [f"topic={topic}&channel={c}" for c in channels]
    wait_until(
        lambda: all(known(q) for q in queries), what=f"nsqadmin to poll {topic}", timeout=20.0
    )


# --------------------------------------------------------------------------- read-only pages


def test_topics_page_answers_what_is_backing_up(
    watched: Watched, cluster: Cluster, world: World
) -> None:
    page = watched.open("/")
    row = page.locator(f"tr[data-topic='{world.busy}']")
    expect(row.locator("[data-col=queued]")).to_have_text(f"{queued(cluster, world.busy)}")
    expect(row.locator("[data-col=channel_count]")).to_have_text("2")
    expect(row.locator("[data-col=client_count]")).to_have_text("1")
    expect(row.locator("[data-col=producer_count]")).to_have_text("2")
    quiet = page.locator(f"tr[data-topic='{world.quiet}']")
    expect(quiet.locator("[data-col=queued]")).to_have_text("5")
    # A topic only nsqlookupd knows is listed, labelled, never an error.
    expect(page.locator(f"tr[data-topic='{world.ghost}']")).to_contain_text("no producers")
    expect(page.locator("#nodes-reached")).to_contain_text("2 of 2 nodes")
    watched.screenshot("topics")

    # Sort by what is queued, biggest first; then filter by name (both kept in the URL).
    page.click("th[data-sort=queued]")
    values = [number(t) for t in page.locator("#topics tbody [data-col=queued]").all_inner_texts()]
    assert values == sorted(values, reverse=True), values
    assert "sort=queued" in page.url
    page.fill("#topic-filter", world.quiet)
    expect(page.locator("#topics tbody tr")).to_have_count(1)
    expect(page.locator("#topic-count")).to_contain_text("1 of")
    assert f"q={world.quiet}" in page.url


def test_topic_page_numbers_match_the_daemons(
    watched: Watched, cluster: Cluster, world: World
) -> None:
    page = watched.open(f"/topics/{world.busy}")
    expect(page.locator("#topic-nodes tr[data-node]")).to_have_count(2)
    for node in (0, 1):
        stats = cluster.topic_stats(node, world.busy)
        assert stats is not None
        row = page.locator(f"#topic-nodes tr[data-node='{cluster.nsqd_address(node)}'] td")
        expect(row.nth(1)).to_have_text(f"{stats['depth']:,}")
        expect(row.nth(3)).to_have_text(f"{stats['message_count']:,}")
        expect(row.nth(4)).to_have_text("2")
    total = page.locator("#topic-nodes tr.total td")
    expect(total.nth(0)).to_have_text("Total:")
    expect(total.nth(3)).to_have_text("50")
    archive = channel_total(cluster, world.busy, "archive", "depth")
    expect(page.locator("#channels tr[data-channel=archive] [data-col=depth]")).to_have_text(
        f"{archive}"
    )
    expect(page.locator("#channels tr[data-channel=metrics] [data-col=client_count]")).to_have_text(
        "1"
    )
    expect(page.locator(".stat[data-stat=queued] .value")).to_have_text(
        f"{queued(cluster, world.busy)}"
    )
    watched.screenshot("topic")

    # Go showed a 502 page here; the topic only lookupd knows gets the friendly notice.
    page = watched.open(f"/topics/{world.ghost}")
    expect(page.locator("#main")).to_contain_text("No producers exist for this topic.")


def test_channel_page_lists_clients(watched: Watched, cluster: Cluster, world: World) -> None:
    page = watched.open(f"/topics/{world.quiet}/mailer")
    expect(page.locator("#channel-nodes tr[data-node]")).to_contain_text("paused")
    expect(page.locator("button[data-action=unpause]")).to_have_text("UnPause Channel")

    page = watched.open(f"/topics/{world.busy}/metrics")
    depth = channel_total(cluster, world.busy, "metrics", "depth")
    expect(page.locator("#channel-nodes tr.total [data-col=depth]")).to_have_text(f"{depth}")
    client = page.locator("#clients tr[data-client=worker-1]")
    expect(client).to_contain_text("box-1:")
    expect(client).to_contain_text("(worker-1)")
    expect(client).to_contain_text("metrics/1.0")
    expect(client).to_contain_text(cluster.nsqd_address(0))
    # These nsqd have no --enable-inspect and no --max-attempts: no section, no columns.
    expect(page.locator("#inspect")).to_have_count(0)
    expect(page.locator("#channel-nodes")).not_to_contain_text("Dead-Lettered")
    watched.screenshot("channel")


def test_nodes_and_node_pages(watched: Watched, cluster: Cluster, world: World) -> None:
    page = watched.open("/nodes")
    expect(page.locator("h2")).to_have_text("NSQd Nodes (2)")
    for node in (0, 1):
        row = page.locator(f"#nodes tr[data-node='{cluster.nsqd_address(node)}']")
        expect(row.locator("td").nth(2)).to_have_text(str(cluster.nsqds[node].tcp_port))
        conns = row.locator(".conn-count")
        expect(conns).to_have_text("1")
        # Connected to 1 of 1 lookupd: not orange (Go's was always orange).
        expect(conns).not_to_have_class(re.compile("btn-warning"))
        expect(row).to_contain_text(world.busy)
    row = page.locator(f"#nodes tr[data-node='{cluster.nsqd_address(0)}']")
    row.locator(".conn-count").click()
    expect(row).to_contain_text(cluster.lookupd_address)
    watched.screenshot("nodes")

    page = watched.open(f"/nodes/{cluster.nsqd_address(0)}")
    topics = cluster.stats(0)["topics"]
    clients = sum(len(c.get("clients") or []) for t in topics for c in t["channels"] or [])
    # Go's summary left the topic count blank.
    summary = page.locator("#node-summary")
    expect(summary).to_contain_text(f"{len(topics)} Topics")
    expect(summary).to_contain_text(f"{clients} Clients")
    expect(page.locator(f"#node-topics tr[data-topic='{world.busy}']")).to_contain_text("30")
    expect(page.locator(f"tr[data-channel='{world.busy}/metrics']")).to_be_visible()
    expect(page.locator("#node-topics")).to_contain_text("box-1")
    watched.screenshot("node")

    # As Go: a page whose data cannot be fetched is replaced by the API's error.
    watched.expect_console("status of 404")
    watched.page.goto(watched.base_url + "/nodes/127.0.0.1:1")
    expect(watched.page.locator("#error")).to_have_text("NODE_NOT_FOUND")


def test_counter_counts_up_and_down(
    watched: Watched, cluster: Cluster, admin: DaemonProcess
) -> None:
    topic = cluster.new_topic("count")
    make_channels(cluster, topic, 0, "a", "b")
    cluster.pub(topic, b"c", node=0, count=10)
    page = watched.open("/counter")
    digits = page.locator("#counter-digits")

    def shows(total: int) -> None:
        expect(digits).to_have_attribute("data-target", str(total))
        expect(digits).to_have_attribute("data-value", str(total))  # the animation arrived
        assert number(digits.inner_text().replace("\n", "")) == total

    wait_until(lambda: counter_total(admin) > 0, what="the counter's first numbers", timeout=20.0)
    shows(counter_total(admin))
    watched.screenshot("counter")
    before = counter_total(admin)
    # Deleting a channel takes its message_count away: the counter must go down (Go's stuck).
    assert cluster.nsqd_post(0, f"/channel/delete?topic={topic}&channel=b") == 200
    wait_until(lambda: counter_total(admin) == before - 10, what="the total to drop", timeout=20.0)
    shows(before - 10)
    expect(page.locator("#counter-rate")).to_contain_text("went away")
    cluster.pub(topic, b"c", node=0, count=4)
    wait_until(lambda: counter_total(admin) == before - 6, what="the total to rise", timeout=20.0)
    shows(before - 6)


def test_rates_appear_and_refresh_can_pause(
    watched: Watched, cluster: Cluster, admin: DaemonProcess, world: World
) -> None:
    topic = cluster.new_topic("live")
    make_channels(cluster, topic, 0, "sink")  # nobody reads it: a backlog that grows
    stop = threading.Event()

    def produce() -> None:
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            cluster.pub(topic, b"r", node=0, count=5)
            stop.wait(0.05)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        wait_polled(admin, topic, "sink")
        page = watched.open("/")
        row = page.locator(f"tr[data-topic='{topic}']")
        row.wait_for()
        wait_until(
            lambda: number(row.locator("[data-col=rate_in]").inner_text()) > 0,
            what="a msgs/s figure on the topics list",
            timeout=20.0,
        )
        expect(row).to_have_class(re.compile("growing"))
        expect(page.locator("#backlog")).to_contain_text(topic)
        expect(row.locator("svg.spark polyline")).to_have_count(1)
        expect(page.locator("#refresh-text")).to_have_text(re.compile(r"updated \d+s ago"))
        watched.screenshot("topics-live")

        page = watched.open(f"/topics/{topic}")
        rate_in = page.locator(".stat[data-stat=rate_in] .value")
        wait_until(
            lambda: number(rate_in.inner_text()) > 0,
            what="msgs/s in on the topic page",
            timeout=20.0,
        )
        expect(page.locator(".stat[data-stat=queued] svg polyline")).to_have_count(1)
        channel_rate = page.locator("#channels tr[data-channel=sink] [data-col=rate_in]")
        wait_until(
            lambda: number(channel_rate.inner_text()) > 0, what="a channel's msgs/s", timeout=20.0
        )

        page = watched.open(f"/topics/{topic}/sink")
        wait_until(
            lambda: number(page.locator(".stat[data-stat=rate_in] .value").inner_text()) > 0,
            what="msgs/s in on the channel page",
            timeout=20.0,
        )
        page = watched.open(f"/nodes/{cluster.nsqd_address(0)}")
        wait_until(
            lambda: number(page.locator(".stat[data-stat=rate_in] .value").inner_text()) > 0,
            what="msgs/s in on the node page",
            timeout=20.0,
        )

        # The page refreshes itself; Pause stops that, Resume starts it again.
        start = watched.renders()
        watched.wait_rendered(start + 1)
        page.click("#refresh-toggle")
        expect(page.locator("#refresh-text")).to_contain_text("paused")
        paused_at = watched.renders()
        page.wait_for_timeout(2500)  # over two refresh periods (1 s each at this poll rate)
        assert watched.renders() == paused_at
        page.click("#refresh-toggle")
        watched.wait_rendered(paused_at + 1)
    finally:
        stop.set()
        producer.join(10)


# --------------------------------------------------------------------------- actions


def test_channel_actions_through_buttons(
    watched: Watched, cluster: Cluster, admin: DaemonProcess, world: World
) -> None:
    topic = cluster.new_topic("acts")
    for node in (0, 1):
        make_channels(cluster, topic, node, "work")
    cluster.pub(topic, b"w", node=0, count=7)
    cluster.pub(topic, b"w", node=1, count=3)
    cluster.wait_registered(topic, 2)
    wait_polled(admin, topic, "work")
    # Arrive by a link, as a user does: the topic page's handlers must not outlive it.
    page = watched.open(f"/topics/{topic}")
    page.click("#channels a:has-text('work')")
    page.wait_for_url(re.compile(f"/topics/{topic}/work$"))
    expect(page.locator("#channel-nodes")).to_be_visible()

    def on_both(key: str, value: Any) -> bool:
        return all(
            (cluster.channel_stats(n, topic, "work") or {}).get(key) == value for n in (0, 1)
        )

    page.click("button[data-action=pause]")
    watched.confirm(f"{topic}/work")
    wait_until(
        lambda: on_both("paused", True), what="the channel paused on both nsqd", timeout=20.0
    )
    expect(page.locator("button[data-action=unpause]")).to_have_text("UnPause Channel")

    # A Cancel changes nothing.
    page.click("button[data-action=unpause]")
    watched.cancel()
    assert on_both("paused", True)

    page.click("button[data-action=empty]")
    page.locator("dialog.confirm").wait_for()
    watched.screenshot("confirm-empty", full_page=False)
    watched.confirm(f"{topic}/work", "10 messages (10 in memory + 0 on disk)", "will be lost")
    wait_until(lambda: on_both("depth", 0), what="the channel emptied on both nsqd", timeout=20.0)

    page.click("button[data-action=unpause]")
    watched.confirm(f"{topic}/work")
    wait_until(lambda: on_both("paused", False), what="the channel unpaused", timeout=20.0)
    expect(page.locator("button[data-action=pause]")).to_have_text("Pause Channel")

    page.click("button[data-action=delete]")
    watched.confirm(f"{topic}/work", "0 messages")
    page.wait_for_url(re.compile(f"/topics/{topic}$"))
    wait_until(
        lambda: on_both("depth", None), what="the channel deleted on both nsqd", timeout=20.0
    )


def test_topic_actions_through_buttons(
    watched: Watched, cluster: Cluster, admin: DaemonProcess, world: World
) -> None:
    topic = cluster.new_topic("tacts")
    for node in (0, 1):
        assert cluster.nsqd_post(node, f"/topic/create?topic={topic}") == 200
    cluster.pub(topic, b"t", node=0, count=4)
    cluster.pub(topic, b"t", node=1, count=6)  # no channel: the messages wait at the topic
    cluster.wait_registered(topic, 2)
    wait_polled(admin, topic)
    page = watched.open(f"/topics/{topic}")

    def on_both(key: str, value: Any) -> bool:
        return all((cluster.topic_stats(n, topic) or {}).get(key) == value for n in (0, 1))

    page.click("button[data-action=pause]")
    watched.confirm(topic)
    wait_until(lambda: on_both("paused", True), what="the topic paused on both nsqd", timeout=20.0)
    expect(page.locator("#topic-nodes tr[data-node]").first).to_contain_text("paused")
    page.click("button[data-action=unpause]")
    watched.confirm(topic)
    wait_until(lambda: on_both("paused", False), what="the topic unpaused", timeout=20.0)

    expect(page.locator("#topic-nodes tr.total td").nth(1)).to_have_text("10")
    page.click("button[data-action=empty]")
    watched.confirm(topic, "10 messages", "will be lost")
    wait_until(lambda: on_both("depth", 0), what="the topic emptied", timeout=20.0)

    # Tombstone: the dialog names the topic, the node and what is lost there.
    cluster.pub(topic, b"t", node=1, count=3)
    address = cluster.nsqd_address(1)
    row = page.locator(f"#topic-nodes tr[data-node='{address}']")
    expect(row.locator("td").nth(1)).to_have_text("3")
    row.locator("button[data-action=tombstone]").click()
    watched.confirm(topic, address, "3 messages")
    wait_until(
        lambda: cluster.topic_stats(1, topic) is None,
        what="the topic deleted on nsqd #1",
        timeout=20.0,
    )

    page.click("button[data-action=delete]")
    watched.confirm(topic, "will be lost")
    page.wait_for_url(re.compile(r"/$"))
    wait_until(
        lambda: cluster.topic_stats(0, topic) is None,
        what="the topic deleted on nsqd #0",
        timeout=20.0,
    )


def test_node_page_tombstones_a_topic_through_its_button(
    watched: Watched, cluster: Cluster, admin: DaemonProcess, world: World
) -> None:
    topic = cluster.new_topic("ntomb")
    for node in (0, 1):
        assert cluster.nsqd_post(node, f"/topic/create?topic={topic}") == 200
    cluster.pub(topic, b"t", node=1, count=2)
    cluster.wait_registered(topic, 2)
    wait_polled(admin, topic)
    address = cluster.nsqd_address(1)
    page = watched.open(f"/nodes/{address}")
    page.locator(f"tr[data-topic='{topic}'] button[data-action=tombstone]").click()
    watched.confirm(topic, address, "2 messages")
    wait_until(
        lambda: cluster.topic_stats(1, topic) is None,
        what="the topic deleted on nsqd #1",
        timeout=20.0,
    )
    assert cluster.topic_stats(0, topic) is not None  # only on that node


def test_lookup_page_creates_and_deletes_with_confirmation(
    watched: Watched, cluster: Cluster, world: World
) -> None:
    topic = cluster.new_topic("made")
    page = watched.open("/lookup")
    expect(page.locator("#lookupd-hosts")).to_contain_text(cluster.lookupd_address)
    expect(page.locator(f"#inactive li[data-topic='{world.ghost}']")).to_contain_text("later")

    page.fill("#create-form input[name=topic]", topic)
    page.fill("#create-form input[name=channel]", "billing")
    page.click("#create-form button[type=submit]")
    watched.confirm(topic, "billing")
    item = page.locator(f"#inactive li[data-topic='{topic}']")
    expect(item).to_contain_text("billing")
    assert topic in cluster.lookupd_json("/topics")["topics"]
    watched.screenshot("lookup")

    watched.expect_console("status of 400")  # the bad name below: the browser logs the 400
    page.fill("#create-form input[name=topic]", "bad topic!")
    page.fill("#create-form input[name=channel]", "")
    page.click("#create-form button[type=submit]")
    watched.confirm("bad topic!")
    expect(page.locator("#toast .alert-danger")).to_contain_text("INVALID_TOPIC")

    def channels() -> list[str]:
        found = cluster.lookupd_json(f"/channels?topic={topic}")
        return list(found["channels"]) if found else []

    delete_channel = f"button[data-delete-topic='{topic}'][data-delete-channel=billing]"
    page.click(delete_channel)
    watched.cancel()
    assert channels() == ["billing"]
    page.click(delete_channel)
    watched.confirm(f"{topic}/billing", "no queued messages are lost")
    wait_until(lambda: channels() == [], what="the channel gone from lookupd", timeout=20.0)
    expect(item).not_to_contain_text("billing")

    page.click(f"button[data-delete-topic='{topic}']:not([data-delete-channel])")
    watched.confirm(topic)
    wait_until(
        lambda: topic not in cluster.lookupd_json("/topics")["topics"],
        what="topic gone",
        timeout=20.0,
    )
    expect(item).to_have_count(0)


# --------------------------------------------------------------------------- access and gaps


def test_non_admin_sees_no_action_buttons_and_is_forbidden(
    browser: Browser, cluster: Cluster, world: World
) -> None:
    guarded = admin_for(cluster, "--admin-user=alice")
    visitor = Watched(browser, guarded.http_url)
    alice = Watched(browser, guarded.http_url, headers={"X-Forwarded-User": "alice"})
    try:
        pages = [
            f"/topics/{world.busy}",
            f"/topics/{world.busy}/metrics",
            f"/nodes/{cluster.nsqd_address(0)}",
            "/lookup",
        ]
        for path in pages:
            page = visitor.open(path)
            expect(page.locator("#main")).to_contain_text(
                "nsqlookupd Host" if path == "/lookup" else world.busy
            )
            for selector in ("[data-action]", "#create-form", "[data-delete-topic]"):
                expect(page.locator(selector)).to_have_count(0)
        visitor.expect_console("status of 403")
        forced = visitor.page.evaluate(
            """async (path) => {
                const r = await fetch(path, {method: "POST",
                    headers: {"Content-Type": "application/json"},
                    body: JSON.stringify({action: "pause"})});
                return [r.status, await r.json()];
            }""",
            f"/api/topics/{world.busy}",
        )
        assert forced == [403, {"message": "FORBIDDEN"}]
        assert not (cluster.topic_stats(0, world.busy) or {}).get("paused")
        visitor.assert_no_errors()

        expect(visitor.page.locator("#read-only")).to_be_visible()
        page = visitor.open(f"/topics/{world.busy}/metrics")
        # a channel page: a note where an admin sees message bodies
        expect(page.locator("#inspect-admin-only")).to_contain_text("admins only")
        expect(page.locator("#inspect")).to_have_count(0)
        visitor.screenshot("non-admin")
        page = alice.open(f"/topics/{world.busy}")
        expect(page.locator("#read-only")).to_have_count(0)
        expect(page.locator("nav .user")).to_have_text("alice")
        expect(page.locator("button[data-action]")).to_have_count(3 + 2)  # + a ✘ per node
        alice.open(f"/topics/{world.busy}/metrics")
        expect(alice.page.locator("#inspect-admin-only")).to_have_count(0)
        alice.assert_no_errors()
    finally:
        visitor.close()
        alice.close()
        guarded.stop()


def test_unreachable_nsqd_is_shown_not_dropped(
    browser: Browser, cluster: Cluster, world: World
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    partial = admin_for(cluster, f"--nsqd-http-address={dead}", mode="nsqd")
    watched = Watched(browser, partial.http_url)
    try:
        page = watched.open("/")
        expect(page.locator("#nodes-reached")).to_contain_text("2 of 3 nodes")
        expect(page.locator(".alert-warning")).to_have_count(1)  # one warning, not Go's two
        expect(page.locator("#warning")).to_contain_text(dead)
        watched.screenshot("partial")

        page = watched.open(f"/topics/{world.busy}")
        expect(
            page.locator(f"#topic-nodes tr.unreachable[data-unreachable='{dead}']")
        ).to_be_visible()
        expect(page.locator("#topic-nodes tr.total td").first).to_have_text("Total (2 of 3 nodes):")
        expect(page.locator(".alert-warning")).to_have_count(1)

        page = watched.open("/nodes")
        expect(page.locator(f"#nodes tr.unreachable[data-node='{dead}']")).to_contain_text(
            "unreachable"
        )
        expect(page.locator("h2")).to_have_text("NSQd Nodes (2 of 3 reachable)")

        page = watched.open("/lookup")  # nsqd mode: no lookupd to show
        expect(page.locator("#main")).to_contain_text("not configured with nsqlookupd hosts")
        watched.assert_no_errors()
    finally:
        watched.close()
        partial.stop()


def test_phone_width_keeps_tables_inside_the_screen(
    browser: Browser, admin: DaemonProcess, world: World
) -> None:
    watched = Watched(browser, admin.http_url, viewport=PHONE)
    try:
        page = watched.open(f"/topics/{world.busy}")
        expect(page.locator("#channels")).to_be_visible()
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"], width  # wide tables scroll inside their own box
        scroller = page.locator(".table-scroll").last
        assert scroller.evaluate("e => e.scrollWidth > e.clientWidth")
        watched.screenshot("mobile")
        watched.assert_no_errors()
    finally:
        watched.close()


def test_graphite_mode_shows_gos_graphs_and_rates(
    browser: Browser, cluster: Cluster, world: World
) -> None:
    graphite = FakeGraphite(value=120.0)
    graphed = admin_for(cluster, f"--graphite-url={graphite.url}", "--statsd-interval=10s")
    watched = Watched(browser, graphed.http_url)
    try:
        page = watched.open("/")
        row = page.locator(f"tr[data-topic='{world.busy}']")
        image = row.locator("img.graphite").first
        src = image.get_attribute("src") or ""
        assert src.startswith(graphite.url + "/render?"), src
        target = f"sumSeries(stats.gauges.nsq.*.topic.{world.busy}.depth)"
        assert parse_qs(urlparse(src).query)["target"] == [f'summarize({target},"10sec","avg")']
        expect(row.locator(".graphite-rate")).to_have_text("12.00")  # 120 per 10 s interval
        watched.screenshot("graphite")

        page = watched.open(f"/topics/{world.busy}")
        expect(page.locator("#topic-nodes tr.graph-row")).to_have_count(3)  # 2 nodes + Total
        expect(page.locator("#topic-nodes .graphite-rate").last).to_have_text("12.00")
        expect(page.locator("#graph-interval")).to_have_value("2h")
        watched.screenshot("graphite-topic")
        watched.assert_no_errors()
    finally:
        watched.close()
        graphed.stop()
        graphite.close()


def test_e2e_latency_columns_and_durations(
    browser: Browser, tmp_path_factory: pytest.TempPathFactory
) -> None:
    nsqd = start_nsqd(
        tmp_path_factory.mktemp("e2e"), "--e2e-processing-latency-percentile=0.99,0.5"
    )
    front = start_nsqadmin(
        f"--nsqd-http-address=127.0.0.1:{nsqd.http_port}", "--poll-interval=200ms"
    )
    watched = Watched(browser, front.http_url)
    try:
        with NsqConn(nsqd.tcp_address) as consumer:
            consumer.identify(client_id="lat", hostname="lat")
            consumer.sub("timed", "done")
            consumer.rdy(10)
            for _ in range(5):
                assert http(f"{nsqd.http_url}/pub?topic=timed", "POST", b"x")[0] == 200
                consumer.fin(consumer.expect_message().id)
            wait_polled(front, "timed", "done")
            page = watched.open("/topics/timed")
            header = page.locator("#topic-nodes tr").nth(1)
            expect(header).to_contain_text("99th")
            expect(header).to_contain_text("50th")
            latency = page.locator("#topic-nodes tr.total td").nth(5)
            wait_until(
                lambda: re.fullmatch(r"[\d.]+(ns|us|ms|s)", latency.inner_text().strip()),
                what="an E2E latency in the topic's Total row",
                timeout=20.0,
            )
            page = watched.open("/topics/timed/done")
            expect(page.locator("#channel-nodes")).to_contain_text("E2E Processing Latency")
        # Go printed 2 min 0.68 s as "2m682.48ms"; the page's formatter says 2m0.68s.
        formatted = page.evaluate(
            """async () => {
                const f = await import(document.querySelector("script[type=module]").src
                    .replace("app.js", "format.js"));
                return [f.duration(120.68e9), f.duration(3723e9), f.duration(41.333e9),
                        f.duration(682800), f.duration(120e9), f.duration(0)];
            }"""
        )
        assert formatted == ["2m0.68s", "1h2m3s", "41.33s", "682.8us", "2m0s", "0ns"]
        watched.assert_no_errors()
    finally:
        watched.close()
        front.stop()
        nsqd.stop()


def test_unreachable_lookupd_is_marked_on_the_lookup_page(
    browser: Browser, cluster: Cluster, world: World
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    partial = admin_for(cluster, f"--lookupd-http-address={dead}")
    watched = Watched(browser, partial.http_url)
    try:
        page = watched.open("/lookup")
        rows = page.locator("#lookupd-hosts tr")
        expect(rows).to_have_count(3)
        expect(page.locator("#lookupd-hosts tr.unreachable")).to_contain_text(dead)
        expect(page.locator("#lookupd-hosts tr.unreachable")).to_contain_text("unreachable")
        expect(page.locator(".alert-warning")).to_have_count(1)
        expect(page.locator(f"#inactive li[data-topic='{world.ghost}']")).to_be_visible()
        watched.assert_no_errors()
    finally:
        watched.close()
        partial.stop()


def test_base_path_deep_links_and_in_app_navigation(
    browser: Browser, cluster: Cluster, world: World
) -> None:
    prefixed = admin_for(cluster, "--base-path=/ops/nsq")
    watched = Watched(browser, prefixed.http_url)
    try:
        page = watched.open(f"/ops/nsq/topics/{world.busy}/metrics")  # a deep link
        expect(page.locator("blockquote")).to_contain_text("metrics")
        page.evaluate("window.sameDocument = true")
        page.click(f".breadcrumb a:has-text('{world.busy}')")
        page.wait_for_url(re.compile(f"/ops/nsq/topics/{world.busy}$"))
        expect(page.locator("#channels tr[data-channel=archive]")).to_be_visible()
        page.click("nav a[data-nav=nodes]")
        page.wait_for_url(re.compile("/ops/nsq/nodes$"))
        expect(page.locator("#nodes tr[data-node]")).to_have_count(2)
        page.go_back()
        page.wait_for_url(re.compile(f"/ops/nsq/topics/{world.busy}$"))
        expect(page.locator("#channels")).to_be_visible()
        assert page.evaluate("window.sameDocument") is True  # pushState, no page loads
        watched.assert_no_errors()
    finally:
        watched.close()
        prefixed.stop()


def test_without_the_poller_pages_show_gos_figures(
    browser: Browser, cluster: Cluster, world: World
) -> None:
    unpolled = admin_for(cluster, "--poll-interval=0")
    watched = Watched(browser, unpolled.http_url)
    try:
        page = watched.open("/")
        expect(page.locator("#poll-note")).to_contain_text("--poll-interval=0")
        row = page.locator(f"tr[data-topic='{world.busy}']")
        expect(row).to_be_visible()
        expect(row).not_to_contain_text("no producers")  # unknown without a poll, not claimed
        page = watched.open(f"/topics/{world.busy}")
        expect(page.locator(".stat[data-stat=none]")).to_contain_text("Live rates are off")
        expect(page.locator("#topic-nodes tr.total td").nth(3)).to_have_text("50")
        watched.assert_no_errors()
    finally:
        watched.close()
        unpolled.stop()


def test_tombstoned_producer_stays_visible_and_labelled(
    watched: Watched, cluster: Cluster, admin: DaemonProcess
) -> None:
    topic = cluster.new_topic("tomb")
    for node in (0, 1):
        make_channels(cluster, topic, node, "keep")
    cluster.pub(topic, b"k", node=1, count=4)
    cluster.wait_registered(topic, 2)
    wait_polled(admin, topic, "keep")
    # As Go's pic 27: tombstoned in lookupd only, so nsqd #1 still holds its 4 messages.
    address = cluster.nsqd_address(1)
    lookupd = cluster.lookupd.http_url
    assert http(f"{lookupd}/topic/tombstone?topic={topic}&node={address}", "POST")[0] == 200

    page = watched.open(f"/topics/{topic}")
    row = page.locator(f"#topic-nodes tr[data-node='{address}']")
    expect(row).to_contain_text("tombstoned")  # Go dropped this row, and its 4 messages
    expect(page.locator("#topic-nodes tr[data-node]")).to_have_count(2)
    page = watched.open("/nodes")
    label = page.locator(f"#nodes tr[data-node='{address}'] a.label-warning")
    expect(label).to_have_text(f"{topic} (tombstoned)")
    page = watched.open("/")
    expect(page.locator(f"tr[data-topic='{topic}']")).to_contain_text("tombstoned on 1")


def test_pages_of_a_topic_the_poller_has_not_met_log_no_error(
    browser: Browser, cluster: Cluster
) -> None:
    # One poll at start, the next in an hour: the topic made after it has no history at all.
    unpolled = admin_for(cluster, "--poll-interval=1h")
    watched = Watched(browser, unpolled.http_url)
    try:
        wait_until(
            lambda: api(unpolled, "GET", "/api/overview")[1]["updated_at"],
            what="a poll",
            timeout=20.0,
        )
        topic = cluster.new_topic("unmet")
        make_channels(cluster, topic, 0, "fresh")
        cluster.pub(topic, b"u", node=0, count=3)
        cluster.wait_registered(topic, 1)
        page = watched.open(f"/topics/{topic}")
        expect(page.locator("#channels tr[data-channel=fresh]")).to_be_visible()
        expect(page.locator(".stat[data-stat=none]")).to_contain_text("next polls")
        page = watched.open(f"/topics/{topic}/fresh")
        expect(page.locator("#channel-nodes tr.total [data-col=depth]")).to_have_text("3")
        page = watched.open(f"/nodes/{cluster.nsqd_address(0)}")
        expect(page.locator(f"#node-topics tr[data-topic='{topic}']")).to_be_visible()
        watched.assert_no_errors()  # a 404 for the unknown series was logged here
    finally:
        watched.close()
        unpolled.stop()


def test_topics_list_gets_its_sparklines_in_one_request(watched: Watched, world: World) -> None:
    requests: list[str] = []
    watched.page.on("request", lambda r: requests.append(urlparse(r.url).path))
    page = watched.open("/")
    watched.wait_rendered(3)  # two refreshes too
    for topic in (world.busy, world.quiet):
        row = page.locator(f"tr[data-topic='{topic}']")
        expect(row.locator("svg.spark polyline")).to_have_count(1)
    api_calls = [path for path in requests if path.startswith("/api/")]
    assert "/api/history" not in api_calls, api_calls  # one per topic per refresh, before
    assert api_calls.count("/api/overview") >= 3


def test_channel_page_shows_what_nsqd_inspection_lists(
    browser: Browser, cluster: Cluster, tmp_path: Path
) -> None:
    nsqd = start_nsqd(tmp_path, "--enable-inspect", "--max-attempts=2", "--msg-timeout=60s")
    admin = start_nsqadmin(f"--nsqd-http-address=127.0.0.1:{nsqd.http_port}", "--poll-interval=1s")
    watched = Watched(browser, admin.http_url)
    consumer = NsqConn(nsqd.tcp_address)
    topic = cluster.new_topic("orders")

    def channel_now() -> dict[str, Any]:
        status, body, _ = http(f"{nsqd.http_url}/stats?format=json&topic={topic}&channel=billing")
        assert status == 200
        return dict(json.loads(body)["topics"][0]["channels"][0])

    def publish(path: str, body: bytes) -> None:
        assert http(nsqd.http_url + path, "POST", body)[0] == 200

    try:
        for path in (
            f"/topic/create?topic={topic}",
            f"/channel/create?topic={topic}&channel=billing",
        ):
            assert http(nsqd.http_url + path, "POST")[0] == 200
        consumer.identify(client_id="billing-1", hostname="biller", heartbeat_interval=60000)
        consumer.sub(topic, "billing")
        consumer.pub(topic, b"poison")
        consumer.rdy(1)
        for _ in range(2):  # attempt 2 is the last allowed: its REQ dead-letters it
            consumer.req(consumer.expect_message().id, 0)
        wait_until(
            lambda: channel_now().get("dead_letter_count") == 1, what="a dead letter", timeout=20.0
        )
        # Published over HTTP: this connection has RDY 1 and receives the first one.
        publish(f"/pub?topic={topic}&defer=600000", b'{"order": 99, "retry": "tomorrow"}')
        orders = [b'{"order": %d, "total": %d.50}' % (n, n * 10) for n in range(1, 4)]
        publish(f"/mpub?topic={topic}", b"\n".join(orders))
        long_body = b'{"order": 4, "lines": [' + b", ".join(b'"item-%03d"' % n for n in range(60))
        publish(f"/pub?topic={topic}", long_body + b"]}")
        held = consumer.expect_message()  # RDY 1: order 1 stays in flight
        assert held.body.startswith(b'{"order": 1')
        before = channel_now()

        page = watched.open(f"/topics/{topic}/billing")
        section = page.locator("#inspect")
        expect(page.locator("#next-messages tr[data-id]")).to_have_count(3)
        expect(page.locator("#next-messages")).to_contain_text('{"order": 2, "total": 20.50}')
        flying = page.locator("#in-flight tr[data-id]")
        expect(flying).to_have_count(1)
        expect(flying).to_contain_text("billing-1")
        expect(flying).to_contain_text('{"order": 1')
        expect(page.locator("#deferred tr[data-id]")).to_contain_text('"retry": "tomorrow"')
        expect(section).to_contain_text("Next messages")
        # nsqd --max-attempts: the limit and what it dead-lettered, per node and in total
        total = page.locator("#channel-nodes tr.total")
        expect(total.locator("[data-col=max_attempts]")).to_have_text("2")
        expect(total.locator("[data-col=dead_letter_count]")).to_have_text("1")

        # A long body: a preview, the rest behind "show more", still open after a refresh.
        row = page.locator("#next-messages tr[data-id]").last
        expect(row.locator("pre")).to_be_hidden()
        row.locator("summary").click()
        expect(row.locator("pre")).to_be_visible()
        expect(row.locator("pre")).to_contain_text('"item-059"]}')
        watched.wait_rendered(watched.renders() + 2)
        expect(page.locator("#next-messages tr[data-id]").last.locator("pre")).to_be_visible()
        watched.screenshot("channel-inspect")

        after = channel_now()  # looking changed nothing
        for key in ("depth", "in_flight_count", "deferred_count", "message_count"):
            assert after[key] == before[key], key
        consumer.fin(held.id)
        consumer.rdy(10)
        got = [consumer.expect_message() for _ in range(3)]
        assert [m.body[:11] for m in got] == [b'{"order": 2', b'{"order": 3', b'{"order": 4']
        assert [m.attempts for m in got] == [1, 1, 1]
        watched.assert_no_errors()
    finally:
        consumer.close()
        watched.close()
        admin.stop()
        nsqd.stop()


def test_bounded_queue_columns(browser: Browser, cluster: Cluster, tmp_path: Path) -> None:
    """nsqd --max-queue-bytes: the queue's bytes against its cap and the drops and refusals,
    on the topic page (its own queue and each channel) and the channel page."""
    nsqd = start_nsqd(tmp_path, "--max-queue-bytes=80", "--queue-full-policy=drop-oldest")
    admin = start_nsqadmin(f"--nsqd-http-address=127.0.0.1:{nsqd.http_port}", "--poll-interval=1s")
    watched = Watched(browser, admin.http_url)
    topic = cluster.new_topic("capped")
    try:
        for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel=c"):
            assert http(nsqd.http_url + path, "POST")[0] == 200
        for n in range(3):  # 40 queue bytes each: the third drops the first
            assert http(f"{nsqd.http_url}/pub?topic={topic}", "POST", b"m%09d" % n)[0] == 200
        page = watched.open(f"/topics/{topic}/c")
        total = page.locator("#channel-nodes tr.total")
        expect(total.locator("[data-col=queue_bytes]")).to_contain_text("80 /")
        expect(total.locator("[data-col=queue_dropped_count]")).to_have_text("1")
        expect(total.locator("[data-col=queue_refused_count]")).to_have_text("0")
        expect(page.locator("#channel-nodes th")).to_contain_text(["Queue Bytes"])
        watched.screenshot("channel-bounded")
        page = watched.open(f"/topics/{topic}")
        row = page.locator("#channels tr[data-channel=c]")
        expect(row.locator("[data-col=queue_dropped_count]")).to_have_text("1")
        expect(page.locator("#topic-nodes tr.total [data-col=queue_bytes]")).to_contain_text("0 /")
        watched.assert_no_errors()
    finally:
        watched.close()
        admin.stop()
        nsqd.stop()
