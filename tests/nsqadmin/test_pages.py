"""Page routes (the settings injected into the template), static assets and Graphite mode."""

from __future__ import annotations

import base64
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import DaemonProcess

from ..raw_v2 import wait_until
from .conftest import Cluster, FakeGraphite, StartAdmin, api, http

TEMPLATE = "<html><script>window.NSQADMIN = __NSQADMIN_CONFIG__;</script></html>\n"
PAGES = ["/", "/topics", "/topics/t", "/topics/t/c", "/nodes", "/nodes/h:1", "/counter", "/lookup"]


@pytest.fixture
def dev_dir(tmp_path: Path) -> Path:
    """A ``--dev-static-dir`` with a test template and a few assets."""
    (tmp_path / "index.html").write_text(TEMPLATE)
    (tmp_path / "app.js").write_text("console.log('hi');\n")
    (tmp_path / "css").mkdir()
    (tmp_path / "css" / "site.css").write_text("body{}\n")
    (tmp_path / "font.woff2").write_bytes(b"wOF2")
    (tmp_path.parent / "secret.txt").write_text("not for you")
    return tmp_path


def page_config(raw: bytes) -> dict[str, Any]:
    text = raw.decode()
    start = text.index("window.NSQADMIN = ") + len("window.NSQADMIN = ")
    return dict(json.loads(text[start : text.index(";</script>")]))


def test_every_page_route_serves_the_template(
    cluster: Cluster, start_admin: StartAdmin, dev_dir: Path
) -> None:
    admin = start_admin(f"--dev-static-dir={dev_dir}")
    for page in PAGES:
        status, raw, headers = http(admin.http_url + page)
        assert status == 200, page
        assert headers["Content-Type"].startswith("text/html")
        config = page_config(raw)
        assert config == {
            "version": "1.3.0",
            "base_path": "/",
            "graphite_url": "",
            "graph_enabled": False,
            "statsd_counter_format": "stats.counters.%s.count",
            "statsd_gauge_format": "stats.gauges.%s",
            "statsd_interval": 60,
            "statsd_prefix": "nsq.%s",
            "nsqlookupd": [cluster.lookupd_address],
            "is_admin": True,
            "user": "",
            "poll_interval_ms": 200,
            "history_points": 360,
        }


def test_page_settings_follow_the_flags_and_the_request(
    cluster: Cluster, start_admin: StartAdmin, dev_dir: Path
) -> None:
    admin = start_admin(
        f"--dev-static-dir={dev_dir}",
        "--base-path=/ops/",
        "--admin-user=alice",
        "--statsd-prefix=</script><b>&",
        "--statsd-interval=10s",
        "--graphite-url=http://graphite.example",
        "--poll-interval=2s",
        "--history-points=30",
    )
    status, raw, _ = http(admin.http_url + "/ops/topics")
    assert status == 200
    assert b"</script><b>" not in raw
    assert b"\\u003c/script\\u003e\\u003cb\\u003e\\u0026" in raw  # safe inside <script>
    config = page_config(raw)
    assert config["base_path"] == "/ops"
    assert config["statsd_prefix"] == "</script><b>&"
    assert (config["statsd_interval"], config["graph_enabled"]) == (10, True)
    assert config["graphite_url"] == "http://graphite.example"
    assert (config["poll_interval_ms"], config["history_points"]) == (2000, 30)
    assert (config["is_admin"], config["user"]) == (False, "")
    _, raw, _ = http(admin.http_url + "/ops/", headers={"X-Forwarded-User": "alice"})
    assert (page_config(raw)["is_admin"], page_config(raw)["user"]) == (True, "alice")
    _, raw, _ = http(admin.http_url + "/ops", headers={"X-Forwarded-User": "mallory"})
    assert (page_config(raw)["is_admin"], page_config(raw)["user"]) == (False, "mallory")


def test_poller_off_says_so(start_admin: StartAdmin, dev_dir: Path) -> None:
    admin = start_admin(f"--dev-static-dir={dev_dir}", "--poll-interval=0")
    config = page_config(http(admin.http_url + "/")[1])
    assert (config["poll_interval_ms"], config["history_points"]) == (0, 0)


def test_static_assets(start_admin: StartAdmin, dev_dir: Path) -> None:
    admin = start_admin(f"--dev-static-dir={dev_dir}")
    status, body, headers = http(admin.http_url + "/static/app.js")
    assert (status, body) == (200, b"console.log('hi');\n")
    assert "javascript" in headers["Content-Type"]
    status, body, headers = http(admin.http_url + "/static/css/site.css")
    assert (status, headers["Content-Type"]) == (200, "text/css")
    status, body, headers = http(admin.http_url + "/fonts/font.woff2")
    assert (status, body) == (200, b"wOF2")
    for path in ("/static/nope.js", "/static/..%2fsecret.txt", "/static/%2e%2e/secret.txt"):
        assert api(admin, "GET", path) == (404, {"message": "NOT_FOUND"}), path


def test_packaged_template_and_assets_are_served(start_admin: StartAdmin) -> None:
    admin = start_admin()
    status, raw, _ = http(admin.http_url + "/topics")
    assert status == 200 and b"__NSQADMIN_CONFIG__" not in raw
    assert page_config(raw)["poll_interval_ms"] == 200
    status, _, headers = http(admin.http_url + "/static/nsqadmin.css")
    assert (status, headers["Content-Type"]) == (200, "text/css")
    status, _, headers = http(admin.http_url + "/static/js/app.js")
    assert status == 200 and "javascript" in headers["Content-Type"]
    assert api(admin, "GET", "/static/does-not-exist.js") == (404, {"message": "NOT_FOUND"})
    status, _, _ = http(admin.http_url + "/static/../http.py")
    assert status == 404


def raw_get(admin: DaemonProcess, target: bytes) -> tuple[bytes, bytes]:
    """``GET target`` sent as given over a socket: the status line and the body."""
    with socket.create_connection(admin.http_address, timeout=10) as sock:
        sock.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], body


MALFORMED_ASSETS = [
    b"/static/%00",
    b"/fonts/%00",
    b"/static/js/%00app.js",
    b"/static/a%00/b",
    b"/static/%01%1b%7f",
    b"/static/%0d%0aINFO:%20forged",
    b"/static/" + b"a" * 5000,  # longer than a file name may be
    b"/static/" + b"a/" * 3000,  # longer than a path may be
    b"/static/../../../etc/passwd",
    b"/static/%2e%2e/%2e%2e/pages.py",
    b"/static/js/..%2f..%2f..%2fpages.py",
]


@pytest.mark.parametrize("dev", [False, True], ids=["packaged", "dev-static-dir"])
def test_malformed_asset_paths_are_not_found_and_logged_escaped(
    start_admin: StartAdmin, dev_dir: Path, dev: bool
) -> None:
    admin = start_admin(*([f"--dev-static-dir={dev_dir}"] if dev else []), "--poll-interval=0")
    for target in MALFORMED_ASSETS:
        status, body = raw_get(admin, target)
        assert status == b"HTTP/1.1 404 Not Found", target
        assert json.loads(body) == {"message": "NOT_FOUND"}, target
    assert raw_get(admin, b"/static/js/app.js" if not dev else b"/static/app.js")[0].endswith(
        b"200 OK"
    )
    wait_until(lambda: "404 GET /static/js/..%2f" in admin.log, what="the access log", timeout=20.0)
    assert "404 GET /static/%00 " in admin.log
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", admin.log), ascii(admin.log)
    assert "forged" not in admin.log.replace("%20forged", "")
    assert "panic" not in admin.log


# --------------------------------------------------------------------------- graphite


@pytest.fixture
def graphite() -> Iterator[FakeGraphite]:
    fake = FakeGraphite(120.0)
    try:
        yield fake
    finally:
        fake.close()


def test_graphite_rate(start_admin: StartAdmin, graphite: FakeGraphite) -> None:
    admin = start_admin(f"--graphite-url=http://{graphite.address}")
    assert api(admin, "GET", "/api/graphite?metric=rate&target=a.b") == (200, {"rate": "2.00"})
    path, query, _ = graphite.requests[-1]
    assert path == "/render"
    assert query == {
        "format": ["json"],
        "from": ["-120sec"],
        "target": ["a.b"],
        "until": ["-60sec"],
    }
    graphite.value = -1.0
    assert api(admin, "GET", "/api/graphite?metric=rate&target=a.b") == (200, {"rate": "N/A"})
    assert api(admin, "GET", "/api/graphite?target=a") == (400, {"message": "INVALID_ARG_METRIC"})
    assert api(admin, "GET", "/api/graphite?metric=rate") == (
        400,
        {"message": "INVALID_ARG_TARGET"},
    )


def test_graphite_rate_without_graphite(start_admin: StartAdmin) -> None:
    admin = start_admin()
    assert api(admin, "GET", "/api/graphite?metric=rate&target=a") == (
        500,
        {"message": "INTERNAL_ERROR"},
    )


def test_graphite_proxy(start_admin: StartAdmin, graphite: FakeGraphite, dev_dir: Path) -> None:
    admin = start_admin(
        "--proxy-graphite",
        f"--graphite-url=http://user:pw@{graphite.address}",
        f"--dev-static-dir={dev_dir}",
    )
    status, body, _ = http(admin.http_url + "/render?target=x&format=json")
    assert status == 200 and json.loads(body)[0]["datapoints"] == [[120.0, 1]]
    path, query, auth = graphite.requests[-1]
    assert (path, query["target"]) == ("/render", ["x"])
    assert auth == "Basic " + base64.b64encode(b"user:pw").decode()
    config = page_config(http(admin.http_url + "/")[1])
    assert (config["graphite_url"], config["graph_enabled"]) == ("", True)
    plain = start_admin()
    assert api(plain, "GET", "/render?target=x") == (404, {"message": "NOT_FOUND"})
