"""TLS for nsqd: the in-band IDENTIFY upgrade and the HTTPS listener (nsqd/nsqd.go buildTLSConfig).

TLS runs over memory BIOs inside our own protocol objects, so an upgrade is synchronous with the
command stream (no transport swap) and plain connections pay nothing. pyOpenSSL is used rather
than the ``ssl`` module because Go's ``--tls-client-auth-policy=require`` accepts *any* client
certificate, which needs a verify callback that ``ssl`` does not expose.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from OpenSSL import SSL, crypto

from .options import Options

_MIN_VERSIONS = {
    "": SSL.TLS1_VERSION,
    "tls1.0": SSL.TLS1_VERSION,
    "tls1.1": SSL.TLS1_1_VERSION,
    "tls1.2": SSL.TLS1_2_VERSION,
    "tls1.3": SSL.TLS1_3_VERSION,
}
_GO_VERSION_NAMES = {
    "TLSv1": "TLS1.0",
    "TLSv1.1": "TLS1.1",
    "TLSv1.2": "TLS1.2",
    "TLSv1.3": "TLS1.3",
}
#: OpenSSL's names of TLS <= 1.2 cipher suites to the IANA names Go's tls.CipherSuiteName gives
#: in /stats (TLS 1.3 suites already have their IANA names in OpenSSL).
_IANA_CIPHER_NAMES = {
    "ECDHE-ECDSA-AES128-GCM-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384": "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305": "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "ECDHE-ECDSA-AES128-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "ECDHE-ECDSA-AES256-SHA384": "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA384",
    "ECDHE-ECDSA-AES128-SHA": "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "ECDHE-ECDSA-AES256-SHA": "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "ECDHE-RSA-AES128-GCM-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-RSA-AES256-GCM-SHA384": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-RSA-CHACHA20-POLY1305": "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "ECDHE-RSA-AES128-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "ECDHE-RSA-AES256-SHA384": "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA384",
    "ECDHE-RSA-AES128-SHA": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "ECDHE-RSA-AES256-SHA": "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "ECDHE-RSA-DES-CBC3-SHA": "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "DHE-RSA-AES128-GCM-SHA256": "TLS_DHE_RSA_WITH_AES_128_GCM_SHA256",
    "DHE-RSA-AES256-GCM-SHA384": "TLS_DHE_RSA_WITH_AES_256_GCM_SHA384",
    "DHE-RSA-CHACHA20-POLY1305": "TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "DHE-RSA-AES128-SHA256": "TLS_DHE_RSA_WITH_AES_128_CBC_SHA256",
    "DHE-RSA-AES256-SHA256": "TLS_DHE_RSA_WITH_AES_256_CBC_SHA256",
    "DHE-RSA-AES128-SHA": "TLS_DHE_RSA_WITH_AES_128_CBC_SHA",
    "DHE-RSA-AES256-SHA": "TLS_DHE_RSA_WITH_AES_256_CBC_SHA",
    "AES128-GCM-SHA256": "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "AES256-GCM-SHA384": "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "AES128-SHA256": "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "AES256-SHA256": "TLS_RSA_WITH_AES_256_CBC_SHA256",
    "AES128-SHA": "TLS_RSA_WITH_AES_128_CBC_SHA",
    "AES256-SHA": "TLS_RSA_WITH_AES_256_CBC_SHA",
    "DES-CBC3-SHA": "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
}
_READ_SIZE = 256 * 1024


class TLSError(Exception):
    pass


def build_server_context(opts: Options) -> SSL.Context | None:
    """None when no certificate is configured; ValueError (Go's wording) when misconfigured."""
    if not opts.tls_cert and not opts.tls_key:
        return None
    version = _MIN_VERSIONS.get(opts.tls_min_version.lower())
    if version is None:
        raise ValueError(f"failed to build TLS config - unknown tls version {opts.tls_min_version}")
    try:
        ctx = SSL.Context(SSL.TLS_SERVER_METHOD)
        ctx.set_min_proto_version(version)
        ctx.use_certificate_chain_file(opts.tls_cert)
        ctx.use_privatekey_file(opts.tls_key)
        ctx.check_privatekey()
        policy = opts.tls_client_auth_policy
        if policy == "require":
            ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, _accept_any)
        elif policy == "require-verify":
            if opts.tls_root_ca_file:
                ctx.load_verify_locations(opts.tls_root_ca_file)
            else:
                ctx.set_default_verify_paths()
            ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, _verified)
        elif policy:
            raise ValueError(f"unknown tls-client-auth-policy {policy}")
    except (SSL.Error, OSError) as exc:
        raise ValueError(f"failed to build TLS config - {exc}") from None
    return ctx


def _accept_any(conn: SSL.Connection, cert: crypto.X509, errno: int, depth: int, ok: int) -> bool:
    return True


def _verified(conn: SSL.Connection, cert: crypto.X509, errno: int, depth: int, ok: int) -> bool:
    return bool(ok)


class TLSSession:
    """A server-side TLS session fed and drained through memory buffers."""

    __slots__ = ("_conn", "closed", "handshake_done")

    def __init__(self, ctx: SSL.Context) -> None:
        self._conn = SSL.Connection(ctx, None)
        self._conn.set_accept_state()
        self.handshake_done = False
        self.closed = False

    def receive(self, data: bytes) -> tuple[bytes, bytes]:
        """Feed bytes from the wire; returns (plaintext, bytes to send back)."""
        conn = self._conn
        try:
            conn.bio_write(data)
            if not self.handshake_done:
                try:
                    conn.do_handshake()
                    self.handshake_done = True
                except SSL.WantReadError:
                    return b"", self._outgoing()
            plain = []
            while True:
                try:
                    plain.append(conn.recv(_READ_SIZE))
                except SSL.WantReadError:
                    break
                except SSL.ZeroReturnError:
                    self.closed = True
                    break
        except SSL.Error as exc:
            raise TLSError(_describe(exc)) from None
        return b"".join(plain), self._outgoing()

    def send(self, data: bytes) -> bytes:
        try:
            self._conn.sendall(data)
        except SSL.Error as exc:
            raise TLSError(_describe(exc)) from None
        return self._outgoing()

    def _outgoing(self) -> bytes:
        chunks = []
        while True:
            try:
                chunks.append(self._conn.bio_read(_READ_SIZE))
            except SSL.WantReadError:
                break
        return b"".join(chunks)

    @property
    def version(self) -> str:
        name = self._conn.get_protocol_version_name()
        return _GO_VERSION_NAMES.get(name, name)

    @property
    def cipher(self) -> str:
        name = self._conn.get_cipher_name() or ""
        return _IANA_CIPHER_NAMES.get(name, name)

    @property
    def peer_common_name(self) -> str:
        cert = self._conn.get_peer_certificate()
        if cert is None:
            return ""
        return cert.get_subject().CN or ""


def _describe(exc: SSL.Error) -> str:
    if exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        return "; ".join(str(part[-1]) for part in exc.args[0])
    return str(exc) or exc.__class__.__name__


# ---------------------------------------------------------------------- HTTPS in front of aiohttp


class TLSServerProtocol(asyncio.Protocol):
    """Terminates TLS and hands the plaintext to an inner protocol (aiohttp's request handler)."""

    def __init__(self, ctx: SSL.Context, inner: asyncio.Protocol) -> None:
        self._session = TLSSession(ctx)
        self._inner = inner
        self._raw: asyncio.Transport | None = None
        self._plain: _PlainTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = cast(asyncio.Transport, transport)
        self._raw = raw
        self._plain = _PlainTransport(raw, self._session)
        self._inner.connection_made(self._plain)

    def data_received(self, data: bytes) -> None:
        assert self._raw is not None
        try:
            plain, outgoing = self._session.receive(data)
        except TLSError:
            self._raw.close()
            return
        if outgoing:
            self._raw.write(outgoing)
        if plain:
            self._inner.data_received(plain)
        if self._session.closed:
            self._inner.eof_received()

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class _PlainTransport(asyncio.Transport):
    """What the inner protocol writes to: encrypts into the raw transport."""

    def __init__(self, raw: asyncio.Transport, session: TLSSession) -> None:
        super().__init__()
        self._raw = raw
        self._session = session

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._raw.is_closing():
            return
        try:
            self._raw.write(self._session.send(bytes(data)))
        except TLSError:
            self._raw.close()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self._raw.close()

    def abort(self) -> None:
        self._raw.abort()

    def is_closing(self) -> bool:
        return self._raw.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "sslcontext":
            return True  # lets aiohttp report the request as secure (https)
        return self._raw.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._raw.pause_reading()

    def resume_reading(self) -> None:
        self._raw.resume_reading()

    def is_reading(self) -> bool:
        return self._raw.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._raw.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        raise NotImplementedError

    def get_protocol(self) -> asyncio.BaseProtocol:
        raise NotImplementedError


ProtocolFactory = Callable[[], asyncio.Protocol]


def tls_protocol_factory(ctx: SSL.Context, inner: ProtocolFactory) -> ProtocolFactory:
    return lambda: TLSServerProtocol(ctx, inner())
