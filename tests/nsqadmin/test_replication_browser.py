"""nsqadmin's node page shows a replicating nsqd's peers (Debian's Chromium via Playwright):
a Replication table from the node's /stats, absent for an nsqd without --replica-peer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from nsqpy.testing import DaemonProcess, start_nsqadmin, start_nsqd

from ..nsqd.test_replication_visible import Pair, linked, publish_three
from ..raw_v2 import wait_until
from .browser_support import Watched, chromium

pytestmark = pytest.mark.browser


@pytest.fixture
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


def test_node_page_shows_the_replication_peers(browser: Browser, tmp_path: Path) -> None:
    (tmp_path / "pair").mkdir()
    (tmp_path / "plain").mkdir()
    pair = Pair(tmp_path / "pair")
    plain: DaemonProcess | None = None
    admin: DaemonProcess | None = None
    try:
        wait_until(lambda: all(linked(pair, i) for i in (0, 1)), 15.0, "both links up")
        publish_three(pair)
        plain = start_nsqd(tmp_path / "plain")
        nodes = [*pair.nodes, plain]
        admin = start_nsqadmin(*(f"--nsqd-http-address={n.http}" for n in nodes))
        watched = Watched(browser, admin.http_url)
        try:
            page = watched.open(f"/nodes/{pair.nodes[1].http}")
            summary = page.locator("#replication-summary")
            expect(summary).to_contain_text(pair.address(1))
            expect(summary).to_contain_text("acks 2")
            row = page.locator(f"#replication tr[data-peer='{pair.address(0)}']")
            expect(row).to_contain_text("connected")
            expect(row.locator("td").nth(4)).to_have_text("3")  # copies held for node 0
            expect(row.locator("td").nth(5)).to_have_text("0")  # none taken over
            watched.screenshot("node-replication")

            page = watched.open(f"/nodes/{plain.http}")
            expect(page.locator("main")).to_contain_text("No topics exist on this node.")
            expect(page.locator("#replication")).to_have_count(0)
            expect(page.locator("#replication-summary")).to_have_count(0)
            watched.assert_no_errors()
        finally:
            watched.close()
    finally:
        for process in (admin, plain):
            if process is not None:
                process.kill()
        pair.stop()
