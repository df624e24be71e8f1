"""TLS for nsqd: the in-band IDENTIFY upgrade and the HTTPS listener (nsqd/nsqd.go buildTLSConfig).

TLS runs over memory BIOs inside our own protocol objects, so an upgrade is synchronous with the
command stream (no transport swap) and plain connections pay nothing. pyOpenSSL is used rather
than the ``ssl`` module because Go's ``--tls-client-auth-policy=require`` accepts *any* client
certificate, which needs a verify callback that ``ssl`` does not expose.
"""

from __future__ import annotations

import asyncio
import re
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
    """The session failed; ``alert`` holds the bytes OpenSSL queued for the peer (the TLS
    alert that tells it why), which the caller should write before closing."""

    def __init__(self, message: str, alert: bytes = b"") -> None:
        super().__init__(message)
        self.alert = alert


def build_server_context(opts: Options) -> SSL.Context | None:
    """None when no certificate is configured; ValueError (Go's wording) when misconfigured."""
    if not opts.tls_cert and not opts.tls_key:
        return None
    version = _MIN_VERSIONS.get(opts.tls_min_version.lower())
    if version is None:
        raise ValueError(f"failed to build TLS config - unknown tls version {opts.tls_min_version}")
    try:
        return _server_context(opts, version)
    except (SSL.Error, TLSConfigError) as exc:
        detail = _describe(exc) if isinstance(exc, SSL.Error) else str(exc)
        raise ValueError(f"failed to build TLS config - {detail}") from None


class TLSConfigError(Exception):
    pass


def _server_context(opts: Options, version: int) -> SSL.Context:
    """Go's buildTLSConfig: the key pair, the client-certificate policy, the client CAs."""
    ctx = SSL.Context(SSL.TLS_SERVER_METHOD)
    ctx.set_min_proto_version(version)
    # tls.LoadX509KeyPair reads both files before it parses either
    cert_pem, key_pem = _read(opts.tls_cert), _read(opts.tls_key)
    _check_key_pair_pem(cert_pem, key_pem)
    ctx.use_certificate_chain_file(opts.tls_cert)
    try:
        ctx.use_privatekey_file(opts.tls_key)
        ctx.check_privatekey()
    except SSL.Error as exc:
        if "mismatch" not in _describe(exc):
            raise
        raise TLSConfigError("tls: private key does not match public key") from None
    policy = opts.tls_client_auth_policy
    if policy == "require":
        ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, _accept_any)
    elif policy == "require-verify":
        if not opts.tls_root_ca_file:
            ctx.set_default_verify_paths()  # Go: nil ClientCAs verify against the system pool
        ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, _verified)
    # any other policy asks for no client certificate, as Go's switch default does
    if opts.tls_root_ca_file:  # read (and must hold a certificate) whatever the policy
        if b"-----BEGIN CERTIFICATE" not in _read(opts.tls_root_ca_file):
            raise TLSConfigError("failed to append certificate to pool")
        try:
            ctx.load_verify_locations(opts.tls_root_ca_file)
        except SSL.Error:
            raise TLSConfigError("failed to append certificate to pool") from None
    return ctx


_PEM_TYPE = re.compile(rb"-----BEGIN ([^-\r\n]+)-----")


def _check_key_pair_pem(cert_pem: bytes, key_pem: bytes) -> None:
    """Go's tls.X509KeyPair errors for PEM files without the blocks it needs."""
    cert_kinds = _pem_types(cert_pem)
    if "CERTIFICATE" not in cert_kinds:
        if not cert_kinds:
            raise TLSConfigError("tls: failed to find any PEM data in certificate input")
        if len(cert_kinds) == 1 and cert_kinds[0].endswith("PRIVATE KEY"):
            raise TLSConfigError(
                "tls: failed to find certificate PEM data in certificate input, but did find a "
                "private key; PEM inputs may have been switched"
            )
        raise TLSConfigError(
            'tls: failed to find "CERTIFICATE" PEM block in certificate input after skipping '
            f"PEM blocks of the following types: [{' '.join(cert_kinds)}]"
        )
    key_kinds = _pem_types(key_pem)
    if not any(kind.endswith("PRIVATE KEY") for kind in key_kinds):
        if not key_kinds:
            raise TLSConfigError("tls: failed to find any PEM data in key input")
        if key_kinds == ["CERTIFICATE"]:
            raise TLSConfigError(
                "tls: found a certificate rather than a key in the PEM for the private key"
            )
        raise TLSConfigError(
            'tls: failed to find PEM block with type ending in "PRIVATE KEY" in key input after '
            f"skipping PEM blocks of the following types: [{' '.join(key_kinds)}]"
        )


def _pem_types(data: bytes) -> list[str]:
    return [m.decode(errors="replace") for m in _PEM_TYPE.findall(data)]


def _read(path: str) -> bytes:
    """A file's bytes, or Go's os error text (``open <path>: no such file or directory``)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TLSConfigError(f"open {path}: {reason[:1].lower()}{reason[1:]}") from None


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
            raise TLSError(_describe(exc), self._outgoing()) from None
        return b"".join(plain), self._outgoing()

    def send(self, data: bytes) -> bytes:
        try:
            self._conn.sendall(data)
        except SSL.Error as exc:
            raise TLSError(_describe(exc), self._outgoing()) from None
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


#: What Go's http.Server answers plain HTTP sent to its HTTPS port (tlsRecordHeaderLooksLikeHTTP).
_HTTP_ON_HTTPS = (
    b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
)
_HTTP_RECORD_HEADERS = (b"GET /", b"HEAD ", b"POST ", b"PUT /", b"OPTIO")


class TLSServerProtocol(asyncio.Protocol):
    """Terminates TLS and hands the plaintext to an inner protocol (aiohttp's request handler)."""

    def __init__(self, ctx: SSL.Context, inner: asyncio.Protocol) -> None:
        self._session = TLSSession(ctx)
        self._head = b""  # the first five bytes: a TLS record header, or plain HTTP
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
        if len(self._head) < 5:
            self._head += data[: 5 - len(self._head)]
        try:
            plain, outgoing = self._session.receive(data)
        except TLSError as exc:
            if not self._session.handshake_done and self._head in _HTTP_RECORD_HEADERS:
                self._raw.write(_HTTP_ON_HTTPS)
            elif exc.alert:
                self._raw.write(exc.alert)
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
