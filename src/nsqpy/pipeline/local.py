"""A local NSQ cluster for the demo and the benchmark: nsqlookupd and N nsqd, as child
processes in their own sessions (so Ctrl-C reaches only the parent, which stops them in order).

The usual ports (4160/4161 for nsqlookupd, 4150/4151, 4250/4251... for the nsqd) are used
when free, otherwise any free port. Daemon logs go to files, not to the terminal.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

__all__ = ["LocalDaemon", "LocalNSQ"]

_LISTENING = re.compile(r"INFO: (TCP|HTTP): listening on (\S+)")


def _port_if_free(port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return 0
    return port


class LocalDaemon:
    """One daemon: started with ``python -m <module>``, addresses read from its log."""

    def __init__(self, module: str, args: list[str], log_path: Path) -> None:
        self.module = module
        self.args = args
        self.log_path = log_path
        self.addresses: dict[str, str] = {}
        self.proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()

    def start(self, timeout: float = 20.0) -> LocalDaemon:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "a")  # noqa: SIM115 - closed by the pump thread
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, args=(self.proc, log), daemon=True).start()
        if not self._ready.wait(timeout) or len(self.addresses) < 2:
            self.stop()
            raise RuntimeError(f"{self.module} did not start; see {self.log_path}")
        return self

    def _pump(self, proc: subprocess.Popen[str], log: IO[str]) -> None:
        assert proc.stderr is not None
        with log:
            for line in proc.stderr:
                log.write(line)
                log.flush()
                match = _LISTENING.search(line)
                if match:
                    self.addresses[match.group(1)] = match.group(2)
                    if len(self.addresses) >= 2:
                        self._ready.set()
        self._ready.set()

    @property
    def tcp(self) -> str:
        return self.addresses["TCP"]

    @property
    def http(self) -> str:
        return self.addresses["HTTP"]

    def stop(self, timeout: float = 15.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # a clean shutdown: nsqd flushes its queues
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


class LocalNSQ:
    """nsqlookupd plus ``nsqd_count`` nsqd registered with it, data under ``work_dir``."""

    def __init__(
        self, work_dir: Path, nsqd_count: int = 2, extra_nsqd_flags: list[str] | None = None
    ):
        self.work_dir = work_dir
        self.nsqd_count = nsqd_count
        self.extra_nsqd_flags = extra_nsqd_flags or []
        self.lookupd: LocalDaemon | None = None
        self.nsqds: list[LocalDaemon] = []

    def start(self) -> LocalNSQ:
        logs = self.work_dir / "logs"
        tcp, http = _port_if_free(4160), _port_if_free(4161)
        self.lookupd = LocalDaemon(
            "nsqpy.nsqlookupd",
            [
                f"--tcp-address=127.0.0.1:{tcp}",
                f"--http-address=127.0.0.1:{http}",
                "--broadcast-address=127.0.0.1",
            ],
            logs / "nsqlookupd.log",
        ).start()
        try:
            for i in range(self.nsqd_count):
                data = self.work_dir / f"nsqd{i + 1}"
                data.mkdir(parents=True, exist_ok=True)
                tcp, http = _port_if_free(4150 + 100 * i), _port_if_free(4151 + 100 * i)
                nsqd = LocalDaemon(
                    "nsqpy.nsqd",
                    [
                        f"--tcp-address=127.0.0.1:{tcp}",
                        f"--http-address=127.0.0.1:{http}",
                        f"--data-path={data}",
                        "--broadcast-address=127.0.0.1",
                        f"--lookupd-tcp-address={self.lookupd.tcp}",
                        *self.extra_nsqd_flags,
                    ],
                    logs / f"nsqd{i + 1}.log",
                )
                self.nsqds.append(nsqd.start())
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def lookupd_http(self) -> str:
        assert self.lookupd is not None
        return self.lookupd.http

    @property
    def nsqd_tcp(self) -> list[str]:
        return [n.tcp for n in self.nsqds]

    @property
    def nsqd_http(self) -> list[str]:
        return [n.http for n in self.nsqds]

    def stop(self) -> None:
        for nsqd in self.nsqds:
            nsqd.stop()
        if self.lookupd is not None:
            self.lookupd.stop()

    def __enter__(self) -> LocalNSQ:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
