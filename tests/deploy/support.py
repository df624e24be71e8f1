"""Helpers for the deployment-file tests: where the files are, and daemons started from a
command line taken from one of them."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nsqpy.testing import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]
CONTRIB = ROOT / "contrib"
UNITS = CONTRIB / "systemd"
KUBERNETES = ROOT / "deploy" / "kubernetes"
#: where this installation's console scripts (nsqd, nsqlookupd, nsqadmin) are
BIN = Path(sys.executable).parent
DAEMONS = ("nsqd", "nsqlookupd", "nsqadmin")
EXPECT = {"nsqd": ["TCP", "HTTP"], "nsqlookupd": ["TCP", "HTTP"], "nsqadmin": ["HTTP"]}


class CommandDaemon(DaemonProcess):
    """A daemon started from a full command line (a unit's ExecStart, a container's command
    and args) rather than ``python -m``; ``wrap`` may prefix it (tests/hosts_namespace.py)."""

    def __init__(
        self,
        argv: Sequence[str],
        expect: Sequence[str],
        wrap: Callable[[Sequence[str]], list[str]] | None = None,
    ) -> None:
        super().__init__(argv[0], argv[1:], expect)
        self.argv = list(argv)
        self.wrap = wrap

    def command(self) -> list[str]:
        return self.wrap(self.argv) if self.wrap is not None else list(self.argv)


def get(daemon: DaemonProcess, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(daemon.http_url + path, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(daemon: DaemonProcess, path: str) -> Any:
    status, body = get(daemon, path)
    assert status == 200, (path, status, body)
    return json.loads(body)


def post(daemon: DaemonProcess, path: str, body: bytes = b"") -> None:
    request = urllib.request.Request(daemon.http_url + path, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200
