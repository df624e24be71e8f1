"""AUTH against external auth servers (Go: internal/auth/authorizations.go).

nsqd asks an auth server what a secret may do: ``GET <server>/auth?common_name=&remote_ip=
&secret=&tls=`` (or POST with a JSON body), and caches the answer for its ``ttl`` seconds.

Grant patterns are RE2 expressions, as Go's ``regexp`` reads them: matching is linear in the
name (no backtracking), and what RE2 cannot express (look-arounds, backreferences) makes the
whole answer invalid, as Go's ``regexp.Compile`` check in ``QueryAuthd`` does.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import ssl
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit, urlunsplit

import aiohttp
import re2
from yarl import URL

from ..internal import lg
from ..internal.api_client import ACCEPT_V1
from ..internal.http_api import go_json
from ..protocol import ProtocolError, go_quote
from .errors import NeedsReauth

ACCEPT = ACCEPT_V1  # Go asks the auth server as it asks nsqd (http_api.GETV1)
PERMISSIONS = ("subscribe", "publish")


class AuthError(Exception):
    pass


class AuthConnection(Protocol):
    """What AUTH reads and records on a client connection (ClientV2 is one)."""

    auth_secret: str
    auth_state: AuthState | None

    @property
    def remote_address(self) -> str: ...

    @property
    def tls(self) -> bool: ...

    @property
    def tls_common_name(self) -> str: ...


#: Compiled grant patterns kept across AUTH answers (every re-auth repeats the same few).
PATTERN_CACHE_SIZE = 256
#: Auth answers kept for HTTP callers (one per secret and address), each until its ``ttl``.
HTTP_STATE_CACHE_SIZE = 256


@dataclass
class Authorization:
    topic: Pattern
    channels: list[Pattern]
    permissions: list[str]

    def allows(self, topic: str, channel: str) -> bool:
        wanted = "subscribe" if channel else "publish"
        if wanted not in self.permissions or not self.topic.matches(topic):
            return False
        # Go checks the channel regexes for publish too, against "" (a publish-only grant
        # needs a channel pattern such as ".*")
        return any(pattern.matches(channel) for pattern in self.channels)


class _Searcher(Protocol):
    def search(self, text: bytes) -> object: ...


class Pattern:
    """A grant's topic or channel pattern with Go's ``regexp.MatchString`` semantics: RE2,
    unanchored (a match anywhere in the name counts), over the name's bytes."""

    __slots__ = ("_regexp", "source")

    def __init__(self, source: str, regexp: _Searcher) -> None:
        self.source = source
        self._regexp = regexp

    def matches(self, name: str) -> bool:
        # names reach here validated, but a surrogate-escaped byte must not raise
        return self._regexp.search(name.encode("utf-8", "surrogateescape")) is not None

    def __repr__(self) -> str:
        return f"Pattern({self.source!r})"


@dataclass
class AuthState:
    identity: str = ""
    identity_url: str = ""
    authorizations: list[Authorization] = field(default_factory=list)
    expires: float = 0.0  # monotonic seconds

    def expired(self) -> bool:
        return time.monotonic() >= self.expires

    def allows(self, topic: str, channel: str) -> bool:
        return any(auth.allows(topic, channel) for auth in self.authorizations)

    def may_subscribe_to(self, topic: str) -> bool:
        """Whether some SUB to ``topic`` is granted (a subscription to any one channel
        receives every message the topic holds)."""
        return any(
            "subscribe" in auth.permissions and bool(auth.channels) and auth.topic.matches(topic)
            for auth in self.authorizations
        )


def parse_state(body: bytes) -> AuthState:
    """Validate an auth server's JSON answer as Go does; AuthError on anything wrong."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise AuthError(f"failed to decode response - {exc}") from None
    if not isinstance(data, dict):
        raise AuthError("failed to decode response - not an object")
    authorizations = []
    for entry in data.get("authorizations") or []:
        permissions = [str(p) for p in entry.get("permissions") or []]
        for permission in permissions:
            if permission not in PERMISSIONS:
                raise AuthError(f"unknown permission {permission}")
        topic_pattern = _compile(str(entry.get("topic", "")), "topic")
        channels = [_compile(str(c), "channel") for c in entry.get("channels") or []]
        authorizations.append(Authorization(topic_pattern, channels, permissions))
    ttl = data.get("ttl", 0)
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")
    return AuthState(
        identity=str(data.get("identity", "")),
        identity_url=str(data.get("identity_url", "")),
        authorizations=authorizations,
        expires=time.monotonic() + ttl,
    )


def _compile(pattern: str, what: str) -> Pattern:
    try:
        return compile_pattern(pattern)
    except ValueError as exc:
        raise AuthError(f"unable to compile {what} {go_quote(pattern)} {exc}") from None


def _re2_options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a bad pattern is reported through AuthError, not on stderr
    return options


_OPTIONS = _re2_options()


@functools.lru_cache(maxsize=PATTERN_CACHE_SIZE)
def compile_pattern(pattern: str) -> Pattern:
    """Compile as Go's ``regexp.Compile`` would accept; ValueError names what is wrong."""
    if _has_any_byte_escape(pattern):
        raise ValueError(r"error parsing regexp: invalid escape sequence: `\C`")
    try:
        regexp = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raise ValueError(f"error parsing regexp: {_re2_message(exc)}") from None
    return Pattern(pattern, regexp)


def _has_any_byte_escape(pattern: str) -> bool:
    r"""RE2 in C++ reads ``\C`` as "any byte"; Go's syntax has no such escape and rejects it.
    Text quoted with ``\Q...\E`` is literal in both."""
    i, end = 0, len(pattern)
    while i < end:
        if pattern.startswith("\\Q", i):
            close = pattern.find("\\E", i + 2)
            if close < 0:
                return False
            i = close + 2
        elif pattern[i] == "\\":
            if pattern.startswith("C", i + 1):
                return True
            i += 2
        else:
            i += 1
    return False


def _re2_message(exc: Exception) -> str:
    detail = exc.args[0] if exc.args else ""
    if isinstance(detail, bytes):
        return detail.decode("utf-8", "replace")
    return str(detail)


class AuthClient:
    """Queries the configured auth servers, starting at a random one, first success wins."""

    def __init__(
        self,
        addresses: list[str],
        method: str,
        connect_timeout: float,
        request_timeout: float,
        root_ca_file: str = "",
    ) -> None:
        self.addresses = addresses
        self.method = method
        self._timeout = aiohttp.ClientTimeout(total=request_timeout, connect=connect_timeout)
        self._ssl: ssl.SSLContext | bool = True
        if root_ca_file:
            self._ssl = ssl.create_default_context(cafile=root_ca_file)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def query_any(
        self, remote_ip: str, tls: bool, common_name: str, secret: str
    ) -> AuthState:
        params = {
            "common_name": common_name,
            "remote_ip": remote_ip,
            "secret": secret,
            "tls": "true" if tls else "false",
        }
        errors: list[str] = []
        start = random.randrange(len(self.addresses))
        for i in range(len(self.addresses)):
            address = self.addresses[(start + i) % len(self.addresses)]
            try:
                return await self._query(address, params)
            except (AuthError, aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                errors.append(f"failed to auth against {address} - {exc or type(exc).__name__}")
        raise AuthError("; ".join(errors))

    async def _query(self, address: str, params: dict[str, str]) -> AuthState:
        endpoint = address if "://" in address else f"http://{address}/auth"
        body = await self._request(endpoint, params)
        return parse_state(body)

    async def _request(self, endpoint: str, params: dict[str, str], retried: bool = False) -> bytes:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {"Accept": ACCEPT}
        if self.method == "post":
            # Go's json.Marshal of url.Values: sorted, compact, invalid UTF-8 as U+FFFD
            payload = go_json({k: [_valid_utf8(v)] for k, v in sorted(params.items())})
            headers["Content-Type"] = "application/json"
            request = self._session.post(endpoint, data=payload, headers=headers, ssl=self._ssl)
        else:
            # url.Values.Encode: the secret's own bytes, percent-encoded; encoded=True keeps
            # yarl from un-escaping "/" and "?" on the way out
            query = urlencode([(k, _raw_bytes(v)) for k, v in sorted(params.items())])
            url = URL(f"{endpoint}?{query}", encoded=True)
            request = self._session.get(url, headers=headers, ssl=self._ssl)
        async with request as response:
            body = await response.read()
            status = response.status
        if status == 403 and not retried and endpoint.startswith("http://"):
            https_port = _https_port(body)
            if https_port is not None:
                return await self._request(_to_https(endpoint, https_port), params, True)
        if status != 200:
            raise AuthError(f"got response {status} {body!r}")
        return body


def _raw_bytes(text: str) -> bytes:
    """The bytes a client sent (secrets are decoded with surrogateescape)."""
    return text.encode("utf-8", errors="surrogateescape")


def _valid_utf8(text: str) -> str:
    return _raw_bytes(text).decode("utf-8", errors="replace")


def _https_port(body: bytes) -> int | None:
    try:
        data: Any = json.loads(body)
    except ValueError:
        return None
    port = data.get("https_port") if isinstance(data, dict) else None
    return port if isinstance(port, int) else None


def _to_https(endpoint: str, port: int) -> str:
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(("https", netloc, parts.path, parts.query, parts.fragment))


@dataclass(frozen=True)
class HttpCaller:
    """What nsqd tells the auth server about an HTTP request, as AUTH tells it of a client."""

    remote_ip: str
    tls: bool
    common_name: str
    secret: str


class Authenticator:
    """The AUTH flow of one nsqd: AUTH, lazy re-auth on expiry, and permission checks."""

    def __init__(self, client: AuthClient | None, logger: lg.Logger) -> None:
        self.client = client
        self.logger = logger
        # HTTP requests carry their secret each time: the answer is kept for its ttl, as a
        # connection keeps its AUTH, so a burst of requests is not a burst of queries
        self._http_states: OrderedDict[HttpCaller, AuthState] = OrderedDict()
        self._http_pending: dict[HttpCaller, asyncio.Future[AuthState]] = {}

    @property
    def enabled(self) -> bool:
        return self.client is not None

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    async def authenticate(self, conn: AuthConnection, secret: bytes) -> bytes | None:
        """AUTH: ask the auth servers what this secret may do (Go: clientV2.Auth)."""
        conn.auth_secret = secret.decode("utf-8", errors="surrogateescape")
        await self._query(conn)
        state = conn.auth_state
        if state is None or not state.authorizations:
            raise ProtocolError("E_UNAUTHORIZED", "AUTH no authorizations found")
        return go_json(
            {
                "identity": state.identity,
                "identity_url": state.identity_url,
                "permission_count": len(state.authorizations),
            }
        )

    async def reauthenticate(self, conn: AuthConnection) -> bytes | None:
        """An expired AUTH is refreshed lazily, when a command needs it (Go: IsAuthorized)."""
        await self._query(conn)
        return None

    async def _query(self, conn: AuthConnection) -> None:
        assert self.client is not None
        remote_ip = conn.remote_address.rpartition(":")[0].strip("[]")
        try:
            conn.auth_state = await self.client.query_any(
                remote_ip, conn.tls, conn.tls_common_name, conn.auth_secret
            )
        except AuthError as exc:
            self.logger.warn(f"PROTOCOL(V2): [{conn}] AUTH failed {exc}")
            raise ProtocolError("E_AUTH_FAILED", "AUTH failed") from None

    async def http_state(self, caller: HttpCaller) -> AuthState:
        """The grants of an HTTP caller's secret; AuthError when the auth servers refuse or
        fail (the details are logged)."""
        state = self._http_states.get(caller)
        if state is not None and not state.expired():
            self._http_states.move_to_end(caller)
            return state
        # requests that arrive together (nsqadmin asks for three listings at once) share one
        # query
        pending = self._http_pending.get(caller)
        if pending is None:
            pending = asyncio.ensure_future(self._query_http(caller))
            self._http_pending[caller] = pending
            pending.add_done_callback(lambda done: self._http_query_done(caller, done))
        return await asyncio.shield(pending)

    def _http_query_done(self, caller: HttpCaller, done: asyncio.Future[AuthState]) -> None:
        self._http_pending.pop(caller, None)
        if not done.cancelled():
            done.exception()  # retrieved: every waiter may have gone (logged in _query_http)

    async def _query_http(self, caller: HttpCaller) -> AuthState:
        assert self.client is not None
        try:
            state = await self.client.query_any(
                caller.remote_ip, caller.tls, caller.common_name, caller.secret
            )
        except AuthError as exc:
            self.logger.warn(f"HTTP: AUTH failed for {caller.remote_ip} {exc}")
            raise
        self._http_states[caller] = state
        self._http_states.move_to_end(caller)
        while len(self._http_states) > HTTP_STATE_CACHE_SIZE:
            self._http_states.popitem(last=False)
        return state

    def check(self, conn: AuthConnection, cmd: str, topic: str, channel: str) -> None:
        """Go's CheckAuth; raises NeedsReauth when the cached answer has expired."""
        if self.client is None:
            return
        state = conn.auth_state
        if state is None or not state.authorizations:
            raise ProtocolError("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if state.expired():
            raise NeedsReauth
        if not state.allows(topic, channel):
            raise ProtocolError(
                "E_UNAUTHORIZED", f"AUTH failed for {cmd} on {go_quote(topic)} {go_quote(channel)}"
            )
