"""The nsqadmin daemon as a library (Go: nsqadmin/nsqadmin.go).

    admin = NSQAdmin(Options(http_address="127.0.0.1:0", nsqlookupd_http_addresses=[...]))
    await admin.start()
    ...  # admin.real_http_address
    await admin.stop()

The constructor checks the options as Go's ``New`` does and raises :class:`ConfigError` with
Go's message; ``start`` opens the listener (``ListenError``) and starts the poller and the
notification sender.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from .. import version_line
from ..internal import lg
from ..internal.api_client import ApiClient
from ..internal.clusterinfo import ClusterInfo
from ..internal.daemon import ServiceContext
from ..internal.http_server import start_app
from ..internal.net import format_address, listen_socket, split_host_port
from .history import History, Poller
from .http import AdminHTTP, normalize_base_path
from .inspect_auth import SecretInspectingClusterInfo
from .options import Options


class ConfigError(Exception):
    """Options Go's nsqadmin refuses at start-up (``failed to instantiate nsqadmin - ...``)."""


def version_string() -> str:
    return version_line("nsqadmin")


def _check_address(flag: str, address: str) -> None:
    """Go's ``net.ResolveTCPAddr`` check of an upstream address."""
    try:
        host, port = split_host_port(address)
        socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"failed to resolve --{flag} ({address}) - {exc}") from None


def client_ssl_context(opts: Options) -> ssl.SSLContext:
    """The TLS configuration for HTTPS upstreams (Go: ``httpClientTLSConfig``)."""
    context = ssl.create_default_context()
    if opts.http_client_tls_insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if opts.http_client_tls_cert and opts.http_client_tls_key:
        try:
            context.load_cert_chain(opts.http_client_tls_cert, opts.http_client_tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"failed to LoadX509KeyPair {opts.http_client_tls_cert}, "
                f"{opts.http_client_tls_key} - {exc}"
            ) from None
    if opts.http_client_tls_root_ca_file:
        try:
            with open(opts.http_client_tls_root_ca_file, "rb") as handle:
                pem = handle.read()
        except OSError as exc:
            raise ConfigError(
                f"failed to read TLS root CA file {opts.http_client_tls_root_ca_file} - {exc}"
            ) from None
        try:
            context.load_verify_locations(cadata=pem.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError):
            raise ConfigError(
                f"failed to AppendCertsFromPEM {opts.http_client_tls_root_ca_file}"
            ) from None
    return context


def validate(opts: Options) -> None:
    """Go's checks in ``nsqadmin.New``, in Go's order."""
    if not opts.nsqd_http_addresses and not opts.nsqlookupd_http_addresses:
        raise ConfigError("--nsqd-http-address or --lookupd-http-address required")
    if opts.nsqd_http_addresses and opts.nsqlookupd_http_addresses:
        raise ConfigError("use --nsqd-http-address or --lookupd-http-address not both")
    if opts.http_client_tls_cert and not opts.http_client_tls_key:
        raise ConfigError("--http-client-tls-key must be specified with --http-client-tls-cert")
    if opts.http_client_tls_key and not opts.http_client_tls_cert:
        raise ConfigError("--http-client-tls-cert must be specified with --http-client-tls-key")
    for address in opts.nsqlookupd_http_addresses:
        _check_address("lookupd-http-address", address)
    for address in opts.nsqd_http_addresses:
        _check_address("nsqd-http-address", address)
    if opts.proxy_graphite:
        parts = urlsplit(opts.graphite_url)
        if not parts.scheme or not parts.netloc:
            raise ConfigError(
                f"failed to parse --graphite-url ({opts.graphite_url}) - "
                "missing protocol scheme or host"
            )
    if opts.allow_config_from_cidr:
        try:
            if "/" not in opts.allow_config_from_cidr:
                raise ValueError("missing prefix length")
            ipaddress.ip_network(opts.allow_config_from_cidr, strict=False)
        except ValueError:
            raise ConfigError(
                f"failed to parse --allow-config-from-cidr ({opts.allow_config_from_cidr}) - "
                f"invalid CIDR address: {opts.allow_config_from_cidr}"
            ) from None
    if opts.history_points < 1:
        raise ConfigError(f"--history-points must be at least 1 (got {opts.history_points})")
    if opts.poll_interval < 0:
        raise ConfigError("--poll-interval must not be negative")


class NSQAdmin(ServiceContext):
    """One nsqadmin: the HTTP server, the cluster client, the poller and the notifier."""

    def __init__(self, options: Options | None = None, *, logger: lg.Logger | None = None):
        opts = dataclasses.replace(options) if options is not None else Options()
        self.logger = logger or lg.Logger(opts.log_prefix, opts.log_level)
        validate(opts)
        ssl_context = client_ssl_context(opts)
        opts.base_path = normalize_base_path(opts.base_path)
        self.options = opts
        self.base_path = opts.base_path
        self.hostname = socket.gethostname()
        client = ApiClient(
            opts.http_client_connect_timeout, opts.http_client_request_timeout, ssl_context
        )
        self.ci = (
            SecretInspectingClusterInfo(client, self.logger, opts.nsqd_auth_secret)
            if opts.nsqd_auth_secret
            else ClusterInfo(client, self.logger)
        )
        self.history = History(opts.poll_interval, opts.history_points)
        quiet = ClusterInfo(self.ci.client)  # the poller's queries are not logged one by one
        self.poller = Poller(
            quiet,
            self.history,
            opts.poll_interval,
            opts.nsqlookupd_http_addresses,
            opts.nsqd_http_addresses,
            self.logger,
        )
        self.real_http_address: tuple[str, int] = ("", 0)
        self._notifications: asyncio.Queue[dict[str, Any]] | None = None
        self._notifier: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self._http_text = ""

    async def start(self) -> None:
        self.logger.info(version_string())
        sock = listen_socket(self.options.http_address)
        self.real_http_address = sock.getsockname()[:2]
        self._http_text = format_address(self.real_http_address)
        self._notifications = asyncio.Queue()
        self._notifier = asyncio.get_running_loop().create_task(self._send_notifications())
        self._runner = await start_app(
            AdminHTTP(self).make_app(), sock, self.logger, shutdown_timeout=1.0
        )
        self.logger.info(f"HTTP: listening on {self._http_text}")
        self.poller.start()

    async def stop(self) -> None:
        await self.poller.stop()
        runner, self._runner = self._runner, None
        if runner is not None:
            self.logger.info(f"HTTP: closing {self._http_text}")
            await runner.cleanup()
        notifier, self._notifier = self._notifier, None
        if notifier is not None:
            await self._drain_notifications(notifier)
        await self.ci.client.close()

    async def _drain_notifications(self, notifier: asyncio.Task[None]) -> None:
        """Send what is queued (briefly), then stop the sender."""
        if self._notifications is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._notifications.join(), 2.0)
        notifier.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await notifier

    # ------------------------------------------------------------------ runtime changes

    def set_lookupd_addresses(self, addresses: list[str]) -> None:
        """``PUT /config/nsqlookupd_http_addresses``."""
        self.options = dataclasses.replace(self.options, nsqlookupd_http_addresses=addresses)
        self.poller.lookupds = list(addresses)

    def set_log_level(self, level: int) -> None:
        self.options = dataclasses.replace(self.options, log_level=level)
        self.logger.level = level

    def unreachable_nodes(self) -> list[dict[str, Any]]:
        return self.history.unreachable_nodes()

    # ------------------------------------------------------------------ notifications

    def notify(self, record: dict[str, Any]) -> None:
        if self._notifications is not None:
            self._notifications.put_nowait(record)

    async def _send_notifications(self) -> None:
        assert self._notifications is not None
        queue = self._notifications
        opts = self.options
        timeout = aiohttp.ClientTimeout(
            total=opts.http_client_request_timeout, sock_connect=opts.http_client_connect_timeout
        )
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                record = await queue.get()
                try:
                    await self._post_notification(session, record)
                finally:
                    queue.task_done()

    async def _post_notification(
        self, session: aiohttp.ClientSession, record: dict[str, Any]
    ) -> None:
        endpoint = self.options.notification_http_endpoint
        self.logger.info(f"POSTing notification to {endpoint}")
        body = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()
        try:
            async with session.post(
                endpoint, data=body, headers={"Content-Type": "application/json"}
            ) as response:
                await response.read()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.logger.error(f"failed to POST notification - {exc}")
