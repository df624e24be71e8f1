"""The ``nsqadmin`` command: Go's flags, start-up errors, config file and ``/config``."""

from __future__ import annotations

import socket
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from nsqpy.testing import start_nsqadmin

from .conftest import Cluster, StartAdmin, api, http


def run(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nsqpy.nsqadmin", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_version() -> None:
    done = run("--version")
    assert done.returncode == 0
    assert done.stdout.startswith("nsqadmin v1.3.0 (built w/python")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((), "--nsqd-http-address or --lookupd-http-address required"),
        (
            ("--nsqd-http-address=127.0.0.1:4151", "--lookupd-http-address=127.0.0.1:4161"),
            "use --nsqd-http-address or --lookupd-http-address not both",
        ),
        (
            ("--nsqd-http-address=127.0.0.1:4151", "--http-client-tls-cert=/x.pem"),
            "--http-client-tls-key must be specified with --http-client-tls-cert",
        ),
        (
            ("--nsqd-http-address=127.0.0.1:4151", "--http-client-tls-key=/x.key"),
            "--http-client-tls-cert must be specified with --http-client-tls-key",
        ),
        (
            ("--nsqd-http-address=127.0.0.1:4151", "--allow-config-from-cidr=nope"),
            "failed to parse --allow-config-from-cidr (nope)",
        ),
        (("--lookupd-http-address=nohost",), "failed to resolve --lookupd-http-address (nohost)"),
        (
            ("--nsqd-http-address=127.0.0.1:4151", "--http-client-tls-root-ca-file=/no/ca.pem"),
            "failed to read TLS root CA file /no/ca.pem",
        ),
    ],
)
def test_start_up_errors(args: tuple[str, ...], error: str) -> None:
    done = run("--http-address=127.0.0.1:0", *args)
    assert done.returncode == 1
    assert "[nsqadmin] " in done.stderr
    assert f"FATAL: failed to instantiate nsqadmin - {error}" in done.stderr


def test_listen_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run(f"--http-address=127.0.0.1:{port}", "--nsqd-http-address=127.0.0.1:4151")
    assert done.returncode == 1
    assert f"failed to instantiate nsqadmin - listen (127.0.0.1:{port}) failed" in done.stderr


def test_bad_flags_are_usage_errors() -> None:
    done = run("--bogus")
    assert done.returncode == 2
    assert "flag provided but not defined: -bogus" in done.stderr
    done = run("--statsd-interval=soon")
    assert done.returncode == 2
    assert 'invalid value "soon" for flag -statsd-interval' in done.stderr
    help_text = run("--help").stderr
    for flag in ("-lookupd-http-address", "-admin-user", "-proxy-graphite", "-poll-interval"):
        assert flag in help_text


def test_logs_in_go_format(start_admin: StartAdmin) -> None:
    admin = start_admin()
    first = admin.log_lines[0]
    assert first.startswith("[nsqadmin] ") and " INFO: nsqadmin v1.3.0 (built w/python" in first
    assert f"INFO: HTTP: listening on 127.0.0.1:{admin.http_port}" in admin.log


def test_config_file(cluster: Cluster, tmp_path: Path) -> None:
    config = tmp_path / "nsqadmin.cfg"
    config.write_text(
        f'nsqlookupd_http_addresses = ["{cluster.lookupd_address}"]\n'
        'admin_users = ["alice"]\n'
        'acl_http_header = "X-User"\n'
        "http_client_request_timeout = 3000\n"
    )
    admin = start_nsqadmin(f"--config={config}")
    try:
        assert api(admin, "GET", "/config/nsqlookupd_http_addresses") == (
            200,
            [cluster.lookupd_address],
        )
        assert api(admin, "GET", "/config/admin_users") == (200, ["alice"])
        assert api(admin, "GET", "/config/acl_http_header") == (200, "X-User")
        assert api(admin, "GET", "/config/http_client_request_timeout") == (200, 3_000_000_000)
    finally:
        admin.stop()


def test_config_route(cluster: Cluster, start_admin: StartAdmin) -> None:
    admin = start_admin()
    assert api(admin, "GET", "/config/log_level") == (200, 2)
    assert api(admin, "GET", "/config/http_client_connect_timeout") == (200, 2_000_000_000)
    assert api(admin, "GET", "/config/base_path") == (200, "/")
    assert api(admin, "GET", "/config/allow_config_from_cidr") == (200, "127.0.0.1/8")
    assert api(admin, "GET", "/config/version") == (400, {"message": "INVALID_OPTION"})
    assert api(admin, "GET", "/config/nope") == (400, {"message": "INVALID_OPTION"})
    assert api(admin, "PUT", "/config/log_level", b"debug") == (200, 1)
    assert api(admin, "PUT", "/config/log_level", b"loud") == (400, {"message": "INVALID_VALUE"})
    assert api(admin, "PUT", "/config/log_level", b"") == (413, {"message": "INVALID_VALUE"})
    big = b"x" * (1024 * 1024 + 1)
    assert api(admin, "PUT", "/config/log_level", big) == (413, {"message": "INVALID_VALUE"})
    assert api(admin, "PUT", "/config/statsd_prefix", b"x") == (400, {"message": "INVALID_OPTION"})
    bad = b'{"not": "a list"}'
    assert api(admin, "PUT", "/config/nsqlookupd_http_addresses", bad) == (
        400,
        {"message": "INVALID_VALUE"},
    )
    dead = b'["127.0.0.1:1"]'
    assert api(admin, "PUT", "/config/nsqlookupd_http_addresses", dead) == (200, ["127.0.0.1:1"])
    status, body = api(admin, "GET", "/api/topics")
    assert status == 502 and "127.0.0.1:1" in body["message"]  # the new address is in use
    live = f'["{cluster.lookupd_address}"]'.encode()
    assert api(admin, "PUT", "/config/nsqlookupd_http_addresses", live)[0] == 200
    assert api(admin, "GET", "/api/topics")[0] == 200


def test_config_route_is_limited_to_the_cidr(start_admin: StartAdmin) -> None:
    admin = start_admin("--allow-config-from-cidr=10.0.0.0/8")
    assert api(admin, "GET", "/config/log_level") == (403, {"message": "FORBIDDEN"})
    assert api(admin, "PUT", "/config/log_level", b"debug") == (403, {"message": "FORBIDDEN"})


@pytest.mark.parametrize("flag", ["--base-path=admin/", "--base-path=/admin"])
def test_base_path(cluster: Cluster, start_admin: StartAdmin, flag: str) -> None:
    admin = start_admin(flag)
    assert api(admin, "GET", "/admin/ping") == (200, "OK")
    assert api(admin, "GET", "/admin/api/topics")[0] == 200
    assert api(admin, "GET", "/admin/api/nodes")[0] == 200
    assert api(admin, "GET", "/admin/config/base_path") == (200, "/admin")
    assert api(admin, "GET", "/api/topics") == (404, {"message": "NOT_FOUND"})
    assert api(admin, "GET", "/ping") == (404, {"message": "NOT_FOUND"})
    status, _, _ = http(admin.http_url + "/admin/api/topics", "POST", b'{"topic":"x!"}')
    assert status == 400


def test_gzip_and_deflate_when_asked(start_admin: StartAdmin) -> None:
    admin = start_admin()
    _, plain, headers = http(admin.http_url + "/api/topics")
    assert "Content-Encoding" not in headers
    for coding in ("gzip", "deflate"):
        status, raw, headers = http(
            admin.http_url + "/api/topics", headers={"Accept-Encoding": f"{coding}, br"}
        )
        assert status == 200
        assert headers["Content-Encoding"] == coding
        assert "Accept-Encoding" in headers["Vary"]
        wbits = 16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS
        assert zlib.decompress(raw, wbits) == plain


GO_DEFAULTS = {
    "log_prefix": "[nsqadmin] ",
    "log_level": 2,
    "base_path": "/",
    "dev_static_dir": "",
    "graphite_url": "",
    "proxy_graphite": False,
    "statsd_prefix": "nsq.%s",
    "statsd_counter_format": "stats.counters.%s.count",
    "statsd_gauge_format": "stats.gauges.%s",
    "statsd_interval": 60_000_000_000,
    "nsqd_http_addresses": [],
    "http_client_connect_timeout": 2_000_000_000,
    "http_client_request_timeout": 5_000_000_000,
    "http_client_tls_insecure_skip_verify": False,
    "http_client_tls_root_ca_file": "",
    "http_client_tls_cert": "",
    "http_client_tls_key": "",
    "allow_config_from_cidr": "127.0.0.1/8",
    "notification_http_endpoint": "",
    "acl_http_header": "X-Forwarded-User",
    "admin_users": [],
}


def test_go_defaults(cluster: Cluster) -> None:
    admin = start_nsqadmin(f"--lookupd-http-address={cluster.lookupd_address}")
    try:
        for key, value in GO_DEFAULTS.items():
            assert api(admin, "GET", f"/config/{key}") == (200, value), key
        assert api(admin, "GET", "/config/http_address") == (200, "127.0.0.1:0")
        assert api(admin, "GET", "/config/poll_interval") == (200, 5_000_000_000)
        assert api(admin, "GET", "/config/history_points") == (200, 360)
    finally:
        admin.stop()
