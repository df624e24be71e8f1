"""nsqadmin's pages and assets: the single-page app's HTML (with its config), ``/static``,
``/fonts`` and ``/ping``."""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Any

from aiohttp import web

from .. import NSQ_VERSION
from ..internal.http_api import ApiError, go_json, plain_text
from .context import AdminContext

PACKAGE_DIR = Path(__file__).parent

STATIC_DIR = PACKAGE_DIR / "static"

TEMPLATE_PATH = PACKAGE_DIR / "templates" / "index.html"

CONFIG_PLACEHOLDER = "__NSQADMIN_CONFIG__"

PAGE_ROUTES = (
    "/",
    "/topics",
    "/topics/{topic}",
    "/topics/{topic}/{channel}",
    "/nodes",
    "/nodes/{node}",
    "/counter",
    "/lookup",
)

_EXTRA_TYPES = {
    ".map": "application/json",
    ".svg": "image/svg+xml",
    ".woff": "application/font-woff",
    ".ttf": "application/font-sfnt",
    ".eot": "application/vnd.ms-fontobject",
    ".woff2": "application/font-woff2",
}


def script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element (``<``, ``>``, ``&`` as ``\\u003c`` ...)."""
    return go_json(value).decode()


class PageHandlers(AdminContext):
    """The routes a browser loads: every page is the one template, the app routes in JS."""

    def page_config(self, request: web.Request) -> dict[str, Any]:
        opts = self.opts
        poll_ms = round(opts.poll_interval * 1000)
        return {
            "version": NSQ_VERSION,
            "base_path": self.base,
            "graphite_url": "" if opts.proxy_graphite else opts.graphite_url,
            "graph_enabled": bool(opts.graphite_url),
            "statsd_counter_format": opts.statsd_counter_format,
            "statsd_gauge_format": opts.statsd_gauge_format,
            "statsd_interval": int(opts.statsd_interval),
            "statsd_prefix": opts.statsd_prefix,
            "nsqlookupd": list(opts.nsqlookupd_http_addresses),
            "is_admin": self.is_admin(request),
            "user": self.admin_user(request),
            "poll_interval_ms": poll_ms,
            "history_points": opts.history_points if poll_ms else 0,
        }

    def template_path(self) -> Path:
        if self.opts.dev_static_dir:
            dev = Path(self.opts.dev_static_dir) / "index.html"
            if dev.is_file():
                return dev
        return TEMPLATE_PATH

    async def index(self, request: web.Request) -> web.Response:
        path = self.template_path()
        try:
            template = path.read_text(encoding="utf-8")
        except OSError as exc:
            self.logger.error(f"failed to read template {path} - {exc}")
            return web.Response(
                status=500,
                text=f"nsqadmin: the page template {path} is missing ({exc.strerror})\n",
                content_type="text/plain",
            )
        page = template.replace(CONFIG_PLACEHOLDER, script_json(self.page_config(request)))
        return web.Response(text=page, content_type="text/html", charset="utf-8")

    async def ping(self, request: web.Request) -> web.Response:
        return plain_text("OK")

    async def static_asset(self, request: web.Request) -> web.Response:
        name = request.match_info["asset"]
        root = Path(self.opts.dev_static_dir) if self.opts.dev_static_dir else STATIC_DIR
        root = root.resolve()
        target = _asset_file(root, name)
        if target is None:
            raise ApiError(404, "NOT_FOUND")
        self.logger.debug(f"serving static asset {name!r} from {root}")
        suffix = target.suffix.lower()
        content_type = mimetypes.guess_type(target.name)[0] or _EXTRA_TYPES.get(suffix)
        response = web.Response(body=target.read_bytes())
        response.headers["Content-Type"] = content_type or "application/octet-stream"
        return response


def _asset_file(root: Path, name: str) -> Path | None:
    """The file ``name`` names under ``root``, or None (Go: 404) for anything else: a path
    leaving ``root``, a control character (a NUL makes the OS calls raise), a name too long
    for the file system."""
    if any(ord(char) < 0x20 or char == "\x7f" for char in name):
        return None
    try:
        target = (root / name).resolve()
        if target.is_relative_to(root) and target.is_file():
            return target
    except (OSError, ValueError):
        pass
    return None
