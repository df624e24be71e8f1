"""Listening sockets and addresses as Go's net package handles them (shared by the daemons)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
from collections.abc import Callable

from .lg import RepeatSummary


class ListenError(Exception):
    """A listener could not be opened (Go: ``listen (<addr>) failed - <err>``)."""


def split_host_port(address: str) -> tuple[str, str]:
    """Go's ``net.SplitHostPort``: ``host:port`` or ``[v6]:port``; raises ValueError."""
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise ValueError(f"address {address}: missing ']' in address")
        host, rest = address[1:end], address[end + 1 :]
        if not rest.startswith(":"):
            raise ValueError(f"address {address}: missing port in address")
        return host, rest[1:]
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address}: missing port in address")
    if ":" in host:
        raise ValueError(f"address {address}: too many colons in address")
    return host, port


def join_host_port(host: str, port: int | str) -> str:
    """Go's ``net.JoinHostPort``: ``host:port``, brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_unix_address(address: str) -> bool:
    """Go's ``TypeOfAddr``: anything that is not ``host:port`` is a unix socket path."""
    try:
        split_host_port(address)
    except ValueError:
        return True
    return False


def format_address(sockname: object) -> str:
    """A socket address as Go's ``net.Addr.String()`` prints it (``[::1]:4160`` for IPv6)."""
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        return join_host_port(str(sockname[0]), sockname[1])
    return str(sockname)


def listen_socket(address: str, allow_unix: bool = False) -> socket.socket:
    """A listening socket as Go's ``net.Listen``; SO_REUSEADDR so a restart rebinds at once.

    An empty host listens on every address (IPv4 and IPv6); ``0.0.0.0`` on IPv4 only. With
    ``allow_unix`` a non-``host:port`` address is a unix socket path (nsqd's listeners).
    """
    try:
        if allow_unix and is_unix_address(address):
            return _unix_socket(address)
        host, port_text = split_host_port(address)
        port: int | str = int(port_text) if port_text.isdigit() else port_text
        if not host:
            if socket.has_dualstack_ipv6():
                return socket.create_server(
                    ("", int(port)), family=socket.AF_INET6, dualstack_ipv6=True
                )
            return socket.create_server(("", int(port)))
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        infos.sort(key=lambda info: info[0] != socket.AF_INET)  # Go prefers IPv4
        family, _, _, _, sockaddr = infos[0]
        return socket.create_server(sockaddr, family=family, backlog=socket.SOMAXCONN)
    except (OSError, ValueError) as exc:
        raise ListenError(f"listen ({address}) failed - {exc}") from exc


def _unix_socket(path: str) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(socket.SOMAXCONN)
    return sock


# ------------------------------------------------------------------------ descriptor limits

_NR_OPEN = "/proc/sys/fs/nr_open"  # Linux's ceiling for RLIMIT_NOFILE


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit, as Go's runtime does for every program
    at start (a Go nsqd under soft 1024 / hard 1M can hold 1M connections; a process that
    keeps the soft limit cannot). Returns the (soft, hard) limits now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if target == resource.RLIM_INFINITY:
        try:
            with open(_NR_OPEN) as nr_open:
                target = int(nr_open.read())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def describe_limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


class DescriptorGate:
    """Refuse new TCP clients while the process is close to its descriptor limit.

    A client that would take one of the last ``reserve`` descriptors is accepted and closed at
    once, so the HTTP listener (an operator's ``/stats``), the disk queues' files and the
    metadata writes always find a descriptor. The kernel hands out the lowest free descriptor,
    so the number of a fresh ``dup`` counts the descriptors in use; the check costs two system
    calls per accepted connection. New connections are welcome again as soon as others close.
    """

    __slots__ = ("_spare", "limit", "reserve")

    def __init__(self, reserve: int | None = None) -> None:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.limit = 0 if soft == resource.RLIM_INFINITY else soft
        self.reserve = reserve if reserve is not None else max(16, min(256, self.limit // 16))
        # one descriptor held for the probe (and released with the gate)
        self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def in_use(self) -> int:
        """Descriptors in use (at least: the lowest free number)."""
        try:
            probe = os.dup(self._spare)
        except OSError:  # EMFILE: every one of them
            return self.limit
        os.close(probe)
        return probe

    def full(self) -> bool:
        return self.limit > 0 and self.in_use() >= self.limit - self.reserve

    def close(self) -> None:
        if self._spare >= 0:
            os.close(self._spare)
            self._spare = -1


class RefusedConnection(asyncio.Protocol):
    """The protocol of a connection refused for want of descriptors: closed as it opens."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class Admission:
    """A TCP listener's doorman: admits a connection unless descriptors run short, and says
    so once (then a summary per interval) rather than once per refused connection."""

    __slots__ = ("_summary", "gate")

    def __init__(self, log: Callable[[str, str], None], reserve: int | None = None) -> None:
        self.gate = DescriptorGate(reserve)
        self._summary = RepeatSummary(log)

    def admit(self) -> bool:
        gate = self.gate
        if not gate.full():
            if self._summary.failing("refused"):
                self._summary.recovered("refused", "TCP: accepting new connections again")
            return True
        self._summary.failed(
            "refused",
            f"TCP: refusing new connections - {gate.in_use()} of the {gate.limit} descriptors "
            f"allowed (RLIMIT_NOFILE) are in use; the last {gate.reserve} are kept for HTTP "
            "and files",
            "WARN",
        )
        return False

    def close(self) -> None:
        self.gate.close()


def log_open_files_limit(log: Callable[[str, str], None]) -> None:
    """Raise the descriptor limit (see ``raise_open_files_limit``) and log the one in force."""
    soft, hard = raise_open_files_limit()
    log("INFO", f"NOFILE: descriptor limit {describe_limit(soft)} (hard {describe_limit(hard)})")
