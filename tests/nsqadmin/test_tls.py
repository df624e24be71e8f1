"""nsqadmin in front of an nsqd that requires TLS: Go's client follows the ``403`` with
``https_port`` to HTTPS, trusting ``--http-client-tls-root-ca-file`` (or skipping checks)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd
from nsqpy.testing.certs import Certs, make_certificates

from .conftest import StartAdmin, api

TOPIC = "secured"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certificates(tmp_path_factory.mktemp("certs"), "nsqadmin test CA")


@pytest.fixture(scope="module")
def tls_nsqd(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[DaemonProcess]:
    nsqd = start_nsqd(
        tmp_path_factory.mktemp("tls-nsqd"),
        "--https-address=127.0.0.1:0",
        f"--tls-cert={certs.cert}",
        f"--tls-key={certs.key}",
        "--tls-required=true",
        https=True,
    )
    try:
        host, port = nsqd.addresses["HTTPS"]
        request = urllib.request.Request(
            f"https://{host}:{port}/pub?topic={TOPIC}", data=b"m", method="POST"
        )
        with urllib.request.urlopen(request, context=certs.client_context(), timeout=10) as r:
            assert r.status == 200
        yield nsqd
    finally:
        nsqd.stop()


def test_https_upstream_with_root_ca(
    start_admin: StartAdmin, tls_nsqd: DaemonProcess, certs: Certs
) -> None:
    admin = start_admin(
        f"--nsqd-http-address={tls_nsqd.http}",
        f"--http-client-tls-root-ca-file={certs.ca}",
        mode="none",
    )
    assert api(admin, "GET", "/api/topics") == (200, {"topics": [TOPIC], "message": ""})
    status, body = api(admin, "GET", f"/api/topics/{TOPIC}")
    assert (status, body["message_count"]) == (200, 1)


def test_https_upstream_insecure_skip_verify(
    start_admin: StartAdmin, tls_nsqd: DaemonProcess
) -> None:
    admin = start_admin(
        f"--nsqd-http-address={tls_nsqd.http}",
        "--http-client-tls-insecure-skip-verify",
        mode="none",
    )
    assert api(admin, "GET", "/api/topics") == (200, {"topics": [TOPIC], "message": ""})


def test_https_upstream_untrusted(start_admin: StartAdmin, tls_nsqd: DaemonProcess) -> None:
    admin = start_admin(f"--nsqd-http-address={tls_nsqd.http}", mode="none")
    status, body = api(admin, "GET", "/api/topics")
    assert status == 502
    assert body["message"].startswith("UPSTREAM_ERROR: failed to query any nsqd: ")
    assert "certificate" in body["message"].lower()


def test_client_certificate_files_must_load(tmp_path: Path, start_admin: StartAdmin) -> None:
    missing = tmp_path / "none.pem"
    with pytest.raises(RuntimeError, match="failed to LoadX509KeyPair"):
        start_admin(
            f"--http-client-tls-cert={missing}", f"--http-client-tls-key={missing}", mode="nsqd"
        )
