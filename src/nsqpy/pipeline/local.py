"""A local NSQ cluster for the demo and the benchmark: nsqlookupd, N nsqd and (optionally)
nsqadmin, as child processes in their own sessions (so Ctrl-C reaches only the parent, which
stops them in order).

The usual ports (4160/4161 for nsqlookupd, 4150/4151, 4250/4251... for the nsqd, 4171 for
nsqadmin) are used when free, otherwise any free port. Daemon logs go to files, not to the
terminal. The daemons are :class:`nsqpy.testing.DaemonProcess` instances.
"""

from __future__ import annotations

from pathlib import Path

from ..testing import DaemonProcess, preferred_port

__all__ = ["LocalNSQ"]

_START_TIMEOUT = 20.0


def _daemon(module: str, args: list[str], log_path: Path, expect: list[str]) -> DaemonProcess:
    return DaemonProcess(module, args, expect, log_path=log_path, new_session=True)


class LocalNSQ:
    """nsqlookupd plus ``nsqd_count`` nsqd registered with it, data under ``work_dir``."""

    def __init__(
        self,
        work_dir: Path,
        nsqd_count: int = 2,
        extra_nsqd_flags: list[str] | None = None,
        admin: bool = False,
    ):
        self.work_dir = work_dir
        self.nsqd_count = nsqd_count
        self.extra_nsqd_flags = extra_nsqd_flags or []
        self.with_admin = admin
        self.lookupd: DaemonProcess | None = None
        self.nsqds: list[DaemonProcess] = []
        self.admin: DaemonProcess | None = None

    def start(self) -> LocalNSQ:
        logs = self.work_dir / "logs"
        tcp, http = preferred_port(4160), preferred_port(4161)
        self.lookupd = _daemon(
            "nsqpy.nsqlookupd",
            [
                f"--tcp-address=127.0.0.1:{tcp}",
                f"--http-address=127.0.0.1:{http}",
                "--broadcast-address=127.0.0.1",
            ],
            logs / "nsqlookupd.log",
            ["TCP", "HTTP"],
        ).start(_START_TIMEOUT)
        try:
            # the others need only lookupd's address: start them side by side
            if self.with_admin:
                self.admin = _daemon(
                    "nsqpy.nsqadmin",
                    [
                        f"--http-address=127.0.0.1:{preferred_port(4171)}",
                        f"--lookupd-http-address={self.lookupd.http}",
                    ],
                    logs / "nsqadmin.log",
                    ["HTTP"],
                ).launch()
            for i in range(self.nsqd_count):
                data = self.work_dir / f"nsqd{i + 1}"
                data.mkdir(parents=True, exist_ok=True)
                tcp, http = preferred_port(4150 + 100 * i), preferred_port(4151 + 100 * i)
                nsqd = _daemon(
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
                    ["TCP", "HTTP"],
                )
                self.nsqds.append(nsqd.launch())
            for daemon in [*self.nsqds, *([self.admin] if self.admin else [])]:
                daemon.wait_ready(_START_TIMEOUT)
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

    @property
    def admin_url(self) -> str:
        """nsqadmin's URL (with ``admin=True``)."""
        assert self.admin is not None
        return self.admin.http_url

    def stop(self) -> None:
        if self.admin is not None:
            self.admin.stop()
        for nsqd in self.nsqds:
            nsqd.stop()
        if self.lookupd is not None:
            self.lookupd.stop()

    def __enter__(self) -> LocalNSQ:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
