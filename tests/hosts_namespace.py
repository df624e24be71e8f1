"""A process with its own ``/etc/hosts``, which a test rewrites while the process runs.

The process starts in a private mount namespace (``unshare --mount``, which needs root: CI runs
as root) with a temporary file bind-mounted over ``/etc/hosts``. The C library reads that file on
every lookup, so rewriting it (in place: the bind mount follows the inode) changes what a name
resolves to for that process, and for no other process on the machine. This is the real
resolver path, no hook inside nsqpy::

    hosts = HostsFile(tmp_path / "hosts", {"lookupd.nsqpy.test": "127.0.0.1"})
    nsqd = NamespacedDaemon(hosts, "nsqpy.nsqd", [...], ["TCP", "HTTP"]).start()
    hosts.set("lookupd.nsqpy.test", "::1")   # the next lookup by nsqd sees ::1

Names under ``.test`` (RFC 2606) never reach a real DNS server.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nsqpy.testing import DaemonProcess

_BIND_AND_EXEC = 'mount --bind "$0" /etc/hosts && exec "$@"'


class HostsFile:
    def __init__(self, path: Path, names: dict[str, str]) -> None:
        self.path = path
        self.names = dict(names)
        self._write()

    def set(self, name: str, address: str) -> None:
        self.names[name] = address
        self._write()

    def _write(self) -> None:
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [f"{address} {name}" for name, address in self.names.items()]
        # write_text truncates and rewrites the same inode, which the bind mount shows
        self.path.write_text("\n".join(lines) + "\n")

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in a new mount namespace that sees this file as /etc/hosts."""
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            _BIND_AND_EXEC,
            str(self.path),
            *argv,
        ]


class NamespacedDaemon(DaemonProcess):
    """A daemon (``python -m <module>``) that resolves names through ``hosts``."""

    def __init__(
        self, hosts: HostsFile, module: str, args: Sequence[str], expect: Sequence[str]
    ) -> None:
        super().__init__(module, args, expect)
        self.hosts = hosts

    def command(self) -> list[str]:
        return self.hosts.wrap(super().command())
