"""Driving nsqadmin's pages in Debian's Chromium through Playwright (no browser download).

    with chromium() as browser:
        page = Watched(browser, admin.http_url)
        page.open("/topics/clicks")
        ...
        page.assert_no_errors()

Every page is watched for JavaScript errors: ``console.error`` messages and uncaught exceptions
(``pageerror``). A test that expects the browser to log an HTTP error (a 403 it provokes) says
so with ``expect_console``.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from playwright.sync_api import Browser, ConsoleMessage, Error, Page, sync_playwright

from . import conftest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Every test run takes its screenshots; they land in docs/ only when asked
# (NSQADMIN_SCREENSHOTS=docs/images/nsqadmin), so that a test run leaves the checkout clean.
SCREENSHOTS = Path(
    os.environ.get("NSQADMIN_SCREENSHOTS") or Path(tempfile.gettempdir()) / "nsqadmin-screenshots"
)
DESKTOP = {"width": 1100, "height": 760}
PHONE = {"width": 400, "height": 760}
# Generous: the machine is shared; Playwright polls, so a fast page passes fast.
WAIT_MS = 20_000


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Watched:
    """One browser page on one nsqadmin, recording every console error and page error."""

    def __init__(
        self,
        browser: Browser,
        base_url: str,
        viewport: dict[str, int] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.context = browser.new_context(
            viewport=viewport or DESKTOP,  # type: ignore[arg-type]
            extra_http_headers=headers or {},
        )
        self.context.set_default_timeout(WAIT_MS)
        self.page: Page = self.context.new_page()
        self.errors: list[str] = []
        self.allowed: list[re.Pattern[str]] = []
        self.page.on("console", self._on_console)
        self.page.on("pageerror", self._on_page_error)
        # Chrome's "Failed to load resource" console errors do not name the URL: keep them here.
        self.failed_requests: list[str] = []
        self.page.on(
            "response",
            lambda r: (
                self.failed_requests.append(f"{r.status} {r.request.method} {r.url}")
                if r.status >= 400
                else None
            ),
        )

    def _on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(f"console.error: {message.text}")

    def _on_page_error(self, error: Error) -> None:
        self.errors.append(f"pageerror: {error}")

    def expect_console(self, pattern: str) -> None:
        """An error the test provokes on purpose (e.g. a 403 it asks for) is not a failure."""
        self.allowed.append(re.compile(pattern))

    def assert_no_errors(self) -> None:
        unexpected = [e for e in self.errors if not any(p.search(e) for p in self.allowed)]
        assert unexpected == [], (unexpected, self.failed_requests)

    def open(self, path: str) -> Page:
        """Go to ``path`` and wait until the page has rendered its data once."""
        self.page.goto(self.base_url + path)
        self.wait_rendered()
        return self.page

    def wait_rendered(self, at_least: int = 1) -> None:
        self.page.wait_for_function(
            "n => Number(document.getElementById('main').dataset.renders) >= n", arg=at_least
        )

    def renders(self) -> int:
        value = self.page.get_attribute("#main", "data-renders")
        return int(value or 0)

    def confirm(self, *expected_texts: str) -> str:
        """Check the open confirm dialog says each text, press its action button; its text."""
        dialog = self.page.locator("dialog.confirm")
        dialog.wait_for()
        text = dialog.inner_text()
        for expected in expected_texts:
            assert expected in text, (expected, text)
        dialog.locator("[data-confirm]").click()
        dialog.wait_for(state="detached")
        return text

    def cancel(self) -> None:
        dialog = self.page.locator("dialog.confirm")
        dialog.locator("button[value=cancel]").click()
        dialog.wait_for(state="detached")

    def screenshot(self, name: str, full_page: bool = True) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        return path

    def close(self) -> None:
        self.context.close()


def number(text: str) -> float:
    """``"1,234"`` -> 1234; ``"12.5"`` -> 12.5; a dash -> 0."""
    cleaned = text.strip().replace(",", "")
    return float(cleaned) if cleaned and cleaned not in {"-", "\u2013"} else 0.0


def line_png(width: int = 120, height: int = 20) -> bytes:
    """A PNG of a rising blue line on a transparent ground: what the stand-in Graphite draws."""
    rows = []
    for y in range(height):
        row = bytearray([0])  # filter: none
        for x in range(width):
            on_line = abs((height - 1 - y) - (x * (height - 1)) // (width - 1)) <= 1
            row += bytes([51, 122, 183, 255]) if on_line else bytes(4)
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


class FakeGraphite(conftest.FakeGraphite):
    """A stand-in Graphite for the pages' images: ``/render`` answers PNGs, or JSON
    datapoints for ``format=json``."""

    def render(self, query: dict[str, list[str]]) -> tuple[bytes, str]:
        if query.get("format") == ["json"]:
            body = b'[{"target": "x", "datapoints": [[%f, 1700000000]]}]' % self.value
            return body, "application/json"
        return line_png(), "image/png"
