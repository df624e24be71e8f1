"""The one client for NSQ's HTTP API (Go: ``internal/http_api/api_request.go``).

nsqadmin, the utilities, nsqd's lookup code and the client library all ask nsqlookupd and nsqd
through :class:`ApiClient`::

    client = ApiClient(connect_timeout=2.0, request_timeout=5.0)
    topics = await client.get_v1(api_url("127.0.0.1:4161", "topics"))
    await client.post_v1(api_url("127.0.0.1:4151", "topic/pause", topic="t"))
    await client.close()

Every request asks for the V1 answer (``Accept: application/vnd.nsq; version=1.0``). A failure
raises :class:`RequestError` worded as Go's net/http words it (``Get "<url>": dial tcp
127.0.0.1:1: connect: connection refused``, ``got response 404 Not Found "{...}"``), so logs and
nsqadmin's messages read as Go's. A ``403`` that names an ``https_port`` (nsqd with
``--tls-required``) is asked again over HTTPS, as Go's client does.

The Spark driver is plain blocking code: :func:`request_v1_sync` serves it with the same headers
and body decoding over urllib.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote_plus, urlsplit, urlunsplit

import aiohttp

from ..protocol.errors import go_quote
from .net import join_host_port

#: The Accept header that asks nsqd and nsqlookupd for their V1 (unwrapped) answers.
ACCEPT_V1 = "application/vnd.nsq; version=1.0"
V1_REQUEST_HEADERS = {"Accept": ACCEPT_V1}


class RequestError(Exception):
    """One HTTP request failed; ``str()`` is Go's error text for it. ``status`` and ``body``
    are the daemon's answer when it gave one (0 and b"" when it could not be reached)."""

    def __init__(self, text: str, status: int = 0, body: bytes = b"") -> None:
        super().__init__(text)
        self.status = status
        self.body = body

    @property
    def api_message(self) -> str:
        """The ``message`` of a V1 JSON error body (``""`` if it has none)."""
        try:
            decoded = json.loads(self.body)
        except ValueError:
            return ""
        return str(decoded.get("message", "")) if isinstance(decoded, dict) else ""


# --------------------------------------------------------------------------- URLs


def query_string(**params: str) -> str:
    """``key=value&...`` with values escaped as Go's ``url.QueryEscape``."""
    return "&".join(f"{key}={quote_plus(value, safe='')}" for key, value in params.items())


def api_url(address: str, path: str, **params: str) -> str:
    """The URL of ``path`` on the daemon at ``address`` (``host:port``, or a URL base)."""
    base = address if "://" in address else f"http://{address}"
    query = query_string(**params)
    return f"{base.rstrip('/')}/{path}" + (f"?{query}" if query else "")


# --------------------------------------------------------------------------- Go's wording


def go_dial_error(address: str, exc: BaseException) -> str:
    """A failed dial in Go's words (``dial tcp <address>: connect: connection refused``), so
    logs and fatal errors read as Go's tools' do rather than as Python exception reprs."""
    if isinstance(exc, TimeoutError):
        return f"dial tcp {address}: i/o timeout"
    if isinstance(exc, socket.gaierror):
        host = address.rpartition(":")[0].strip("[]")
        return f"dial tcp: lookup {host}: {_lower_first(exc.strerror or str(exc))}"
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"dial tcp {address}: connect: {_lower_first(os.strerror(exc.errno))}"
    return f"dial tcp {address}: {exc}"


def go_http_error(exc: BaseException) -> str:
    """An HTTP client failure in the words of Go's net/http (what follows ``Get "<url>": ``)."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return f"tls: failed to verify certificate: {exc.certificate_error}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return go_dial_error(join_host_port(exc.host, exc.port or 0), exc.os_error)
    if isinstance(exc, TimeoutError):
        return "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    return str(exc) or type(exc).__name__


def _lower_first(text: str) -> str:
    """Go's syscall error texts are the C library's, lower-cased (``connection refused``)."""
    return text[:1].lower() + text[1:]


def _status_error(status: int, reason: str, body: bytes) -> RequestError:
    text = body.decode("utf-8", "replace")
    return RequestError(f"got response {status} {reason} {go_quote(text)}", status, body)


def decode_v1(url: str, body: bytes) -> Any:
    """A V1 answer's JSON; :class:`RequestError` if it is not JSON."""
    try:
        return json.loads(body)
    except ValueError as exc:
        raise RequestError(f"invalid character in response from {url}: {exc}") from None


# --------------------------------------------------------------------------- the client


class ApiClient:
    """Go's ``http_api.Client``: V1 GET/POST with connect and request deadlines and TLS.

    ``connect_timeout`` None leaves connecting bounded by ``request_timeout`` alone. The
    session (one connection pool) is made on first use and lives until :meth:`close`.
    ``dns_cache`` False looks a name up for every connection and ``keep_alive`` False opens a
    connection per request: a daemon whose name moves to another address (nsqio/nsq#1233) is
    asked at its new one, not through a cached lookup or a kept-alive connection.
    """

    def __init__(
        self,
        connect_timeout: float | None = 2.0,
        request_timeout: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        *,
        dns_cache: bool = True,
        keep_alive: bool = True,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.ssl_context = ssl_context
        self.dns_cache = dns_cache
        self.keep_alive = keep_alive
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(
                total=self.request_timeout, sock_connect=self.connect_timeout
            )
            connector = aiohttp.TCPConnector(
                limit=100,
                ssl=self.ssl_context or True,
                use_dns_cache=self.dns_cache,
                force_close=not self.keep_alive,
            )
            self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get_v1(self, url: str) -> Any:
        """GET ``url``: its decoded JSON answer."""
        return decode_v1(url, await self.request("GET", url))

    async def post_v1(self, url: str) -> None:
        await self.request("POST", url)

    async def request(self, method: str, url: str) -> bytes:
        """The body of a 200 answer; any other outcome raises :class:`RequestError`."""
        verb = method.capitalize()
        for _ in range(2):  # the second round is the HTTPS retry
            try:
                async with self.session().request(
                    method, url, headers=V1_REQUEST_HEADERS
                ) as response:
                    body = await response.read()
                    status, reason = response.status, response.reason or ""
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise RequestError(f'{verb} "{url}": {go_http_error(exc)}') from None
            if status == 200:
                return body
            if status == 403 and not url.startswith("https"):
                url = _https_url(url, body)
                continue
            raise _status_error(status, reason, body)
        raise RequestError(f'{verb} "{url}": too many redirects')


def _https_url(url: str, body: bytes) -> str:
    try:
        port = int(json.loads(body)["https_port"])
    except (ValueError, KeyError, TypeError):
        raise _status_error(403, "Forbidden", body) from None
    parts = urlsplit(url)
    netloc = join_host_port(parts.hostname or "", port)
    return urlunsplit(("https", netloc, parts.path, parts.query, ""))


# --------------------------------------------------------------------------- blocking callers


def request_v1_sync(url: str, timeout: float, method: str = "GET") -> tuple[int, Any]:
    """A blocking V1 request for code outside the event loop (the Spark driver): the status
    and the decoded JSON body (None when it is empty, or when an error answer is not JSON).
    Raises OSError when the daemon cannot be reached, ValueError when a 200 is not JSON."""
    request = urllib.request.Request(url, headers=V1_REQUEST_HEADERS, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"null")
        except ValueError:
            return exc.code, None
