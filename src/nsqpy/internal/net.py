"""Listening sockets and addresses as Go's net package handles them (shared by the daemons)."""

from __future__ import annotations

import contextlib
import os
import socket


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
        host, port = str(sockname[0]), sockname[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
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
