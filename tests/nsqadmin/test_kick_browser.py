"""The channel page's Kick button (nsqpy, nsqio/nsq#418) in Debian's Chromium: confirm, then the
client is gone from nsqd's /stats and its in-flight messages are requeued on their timeout."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from nsqpy.testing import DaemonProcess
from tests.raw_v2 import ConnectionClosed, NsqConn

from ..raw_v2 import wait_until
from .browser_support import Watched, chromium
from .conftest import Cluster, StartAdmin

pytestmark = pytest.mark.browser

expect.set_options(timeout=20_000)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


def wait_hung_up(conn: NsqConn, timeout: float = 10.0) -> None:
    """Until nsqd closes ``conn``; redeliveries that arrive first are read and dropped."""
    with pytest.raises(ConnectionClosed):
        for _ in range(1000):
            conn.read_frame(timeout)


def test_kick_button_disconnects_the_client_and_requeues(
    browser: Browser, cluster: Cluster, start_admin: StartAdmin
) -> None:
    topic = cluster.new_topic("kickui")
    cluster.create_channel(topic, "jobs", 0)
    cluster.pub(topic, b"job", node=0, count=5)
    cluster.wait_registered(topic, 1)
    stuck = NsqConn(cluster.nsqds[0].tcp_address)
    # msg_timeout 10 s: long enough that none times out while the page loads on a busy machine,
    # short enough that the requeue after the kick is seen within the test
    stuck.identify(
        client_id="stuck-worker", hostname="box-9", user_agent="jobs/2.0", msg_timeout=10_000
    )
    stuck.sub(topic, "jobs")
    stuck.rdy(3)
    for _ in range(3):
        stuck.expect_message()
    channel = lambda: cluster.channel_stats(0, topic, "jobs")  # noqa: E731
    wait_until(lambda: channel()["in_flight_count"] == 3, what="3 messages in flight", timeout=20.0)
    admin: DaemonProcess = start_admin()
    watched = Watched(browser, admin.http_url)
    try:
        page = watched.open(f"/topics/{topic}/jobs")
        row = page.locator("#clients tr[data-client=stuck-worker]")
        expect(row).to_contain_text("box-9:")
        expect(row).to_contain_text("jobs/2.0")
        page.locator("#clients button[data-action=kick]").click()
        page.locator("dialog.confirm").wait_for()
        watched.screenshot("confirm-kick", full_page=False)
        address = "{}:{}".format(*stuck.sock.getsockname()[:2])
        node = cluster.nsqd_address(0)
        watched.confirm("Kick client", "box-9", "(stuck-worker)", address, node, "3 in-flight")
        wait_hung_up(stuck)
        expect(page.locator("#main")).to_contain_text("No clients connected to this channel")
        expect(page.locator("#toast")).to_contain_text(f"Kicked client {address} off {node}.")
        assert channel()["clients"] == []
        # As on any disconnect: requeued when their timeout fires, and deliverable again.
        wait_until(
            lambda: channel()["timeout_count"] == 3, timeout=30, what="the 3 in-flight requeued"
        )
        after = channel()
        assert (after["in_flight_count"], after["depth"]) == (0, 5)
        page.reload()
        watched.wait_rendered()
        expect(page.locator("#channel-nodes tr.total [data-col=depth]")).to_have_text("5")
        expect(page.locator("#channel-nodes tr.total [data-col=in_flight_count]")).to_have_text("0")
        watched.screenshot("channel-after-kick")
        watched.assert_no_errors()
    finally:
        watched.close()
