"""The one daemon launcher (``nsqpy.testing.DaemonProcess``) as the demo cluster uses it:
log files, preferred ports, nsqadmin in front of the cluster."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from nsqpy.pipeline.local import LocalNSQ
from nsqpy.testing import preferred_port

from ..raw_v2 import wait_until
from .conftest import http


def test_preferred_port_falls_back_when_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert preferred_port(taken.getsockname()[1]) == 0


def test_local_cluster_with_nsqadmin(tmp_path: Path) -> None:
    with LocalNSQ(tmp_path, nsqd_count=1, admin=True) as nsq:
        assert nsq.admin is not None and nsq.lookupd is not None
        assert nsq.admin_url.startswith("http://127.0.0.1:")

        def nodes() -> list[str]:
            status, body, _ = http(nsq.admin_url + "/api/nodes")
            assert status == 200
            return [f"{n['broadcast_address']}:{n['http_port']}" for n in json.loads(body)["nodes"]]

        assert wait_until(
            lambda: nodes() == nsq.nsqd_http, what="the nsqd listed by nsqadmin", timeout=20.0
        )
        procs = [nsq.admin.proc, nsq.lookupd.proc, *(n.proc for n in nsq.nsqds)]
    assert all(p is not None and p.poll() is not None for p in procs)  # all stopped
    logs = tmp_path / "logs"
    for name in ("nsqlookupd.log", "nsqd1.log", "nsqadmin.log"):
        assert "INFO: HTTP: listening on" in (logs / name).read_text(), name
    assert "INFO: HTTP: closing" in (logs / "nsqadmin.log").read_text()
