"""IDENTIFY: validate and apply a client's settings, and answer with the negotiated features
(Go: clientV2.Identify and protocolV2.IDENTIFY)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .. import NSQ_VERSION
from ..protocol import ProtocolError

if TYPE_CHECKING:
    from OpenSSL import SSL

    from .client_v2 import ClientV2
    from .options import Options


def apply_identify(client: ClientV2, data: dict[str, Any], opts: Options) -> None:
    """Apply IDENTIFY settings in Go's order; ValueError carries Go's message.

    As in Go, identifiers missing from the JSON become empty strings, and a failure leaves
    the settings validated before it applied (the connection is closed anyway).
    """
    client.client_id = data.get("client_id") or ""
    client.hostname = data.get("hostname") or ""
    client.user_agent = data.get("user_agent") or ""

    heartbeat = data.get("heartbeat_interval") or 0
    if heartbeat == -1:
        client.heartbeat_interval = 0
    elif heartbeat != 0:
        if not 1000 <= heartbeat <= round(opts.max_heartbeat_interval * 1000):
            raise ValueError(f"heartbeat interval ({heartbeat}) is invalid")
        client.heartbeat_interval = heartbeat / 1000

    size = data.get("output_buffer_size") or 0
    timeout = data.get("output_buffer_timeout") or 0
    if timeout == -1:
        client.output_buffer_timeout = 0
    elif timeout != 0:
        low = round(opts.min_output_buffer_timeout * 1000)
        high = round(opts.max_output_buffer_timeout * 1000)
        if not low <= timeout <= high:
            raise ValueError(f"output buffer timeout ({timeout}) is invalid")
        client.output_buffer_timeout = timeout / 1000
    if size == -1:
        client.output_buffer_size = 1
        client.output_buffer_timeout = 0
    elif size != 0:
        if not 64 <= size <= opts.max_output_buffer_size:
            raise ValueError(f"output buffer size ({size}) is invalid")
        client.output_buffer_size = size

    sample_rate = data.get("sample_rate") or 0
    if not 0 <= sample_rate <= 99:
        raise ValueError(f"sample rate ({sample_rate}) is invalid")
    client.sample_rate = sample_rate

    msg_timeout = data.get("msg_timeout") or 0
    if msg_timeout != 0:
        if not 1000 <= msg_timeout <= round(opts.max_msg_timeout * 1000):
            raise ValueError(f"msg timeout ({msg_timeout}) is invalid")
        client.msg_timeout = msg_timeout / 1000


def negotiate(
    client: ClientV2,
    data: dict[str, Any],
    opts: Options,
    tls_context: SSL.Context | None,
    auth_required: bool,
) -> tuple[bytes, SSL.Context | None, str, int]:
    """The IDENTIFY JSON and the upgrades it promised: (json, TLS, compression, level)."""
    tls_v1 = tls_context is not None and bool(data.get("tls_v1"))
    deflate = opts.deflate and bool(data.get("deflate"))
    snappy = opts.snappy and bool(data.get("snappy"))
    level = 6
    requested_level = data.get("deflate_level") or 0
    if deflate and requested_level > 0:
        level = requested_level
    level = min(level, opts.max_deflate_level)
    if deflate and snappy:
        raise ProtocolError(
            "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression"
        )
    response = {
        "max_rdy_count": opts.max_rdy_count,
        "version": NSQ_VERSION,
        "max_msg_timeout": round(opts.max_msg_timeout * 1000),
        "msg_timeout": round(client.msg_timeout * 1000),
        "tls_v1": tls_v1,
        "deflate": deflate,
        "deflate_level": level,
        "max_deflate_level": opts.max_deflate_level,
        "snappy": snappy,
        "sample_rate": client.sample_rate,
        "auth_required": auth_required,
        "output_buffer_size": client.output_buffer_size,
        "output_buffer_timeout": round(client.output_buffer_timeout * 1000),
    }
    body = json.dumps(response, separators=(",", ":")).encode()
    compression = "snappy" if snappy else "deflate" if deflate else ""
    return body, tls_context if tls_v1 else None, compression, level
