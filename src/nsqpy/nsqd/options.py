"""nsqd options: the single source for flags, config-file keys, defaults and /config values."""

from __future__ import annotations

import hashlib
import ipaddress
import re
import socket
import zlib
from dataclasses import dataclass

from ..internal.flags import (
    BOOL,
    DURATION,
    FLOAT_LIST,
    INT,
    STR,
    STR_LIST,
    TLS_NOT_REQUIRED,
    TLS_REQUIRED,
    TLS_VERSION,
    CommonOptions,
    HTTPClientTimeouts,
    option,
)
from ..internal.net import split_host_port


def default_node_id() -> int:
    """Go: ``crc32_ieee(md5(hostname)) % 1024``."""
    digest = hashlib.md5(socket.gethostname().encode()).digest()
    return zlib.crc32(digest) % 1024


DEFAULT_NODE_ID = default_node_id()
HOSTNAME = socket.gethostname()


@dataclass
class Options(CommonOptions, HTTPClientTimeouts):
    log_prefix: str = option("log-prefix", "[nsqd] ", STR, "log message prefix")
    node_id: int = option(
        "node-id",
        DEFAULT_NODE_ID,
        INT,
        "unique part for message IDs, (int) in range [0,1024)",
        cfg="id",
    )
    worker_id: bool = option("worker-id", False, BOOL, "[deprecated] use --node-id")

    https_address: str = option(
        "https-address", "0.0.0.0:4152", STR, "<addr>:<port> to listen on for HTTPS clients"
    )
    http_address: str = option(
        "http-address", "0.0.0.0:4151", STR, "<addr>:<port> to listen on for HTTP clients"
    )
    tcp_address: str = option(
        "tcp-address", "0.0.0.0:4150", STR, "<addr>:<port> to listen on for TCP clients"
    )
    auth_http_addresses: list[str] = option(
        "auth-http-address",
        [],
        STR_LIST,
        "<addr>:<port> or a full url to query auth server (may be given multiple times)",
        cfg="auth_http_addresses",
    )
    auth_http_request_method: str = option(
        "auth-http-request-method", "get", STR, "HTTP method to use for auth server requests"
    )
    broadcast_address: str = option(
        "broadcast-address",
        HOSTNAME,
        STR,
        "address that will be registered with lookupd (defaults to the OS hostname)",
    )
    broadcast_tcp_port: int = option(
        "broadcast-tcp-port",
        0,
        INT,
        "TCP port that will be registered with lookupd (defaults to the TCP port that this nsqd "
        "is listening on)",
    )
    broadcast_http_port: int = option(
        "broadcast-http-port",
        0,
        INT,
        "HTTP port that will be registered with lookupd (defaults to the HTTP port that this "
        "nsqd is listening on)",
    )
    nsqlookupd_tcp_addresses: list[str] = option(
        "lookupd-tcp-address",
        [],
        STR_LIST,
        "lookupd TCP address (may be given multiple times)",
        cfg="nsqlookupd_tcp_addresses",
    )

    data_path: str = option("data-path", "", STR, "path to store disk-backed messages")
    mem_queue_size: int = option(
        "mem-queue-size",
        10000,
        INT,
        "number of messages to keep in memory (per topic/channel)",
    )
    max_bytes_per_file: int = option(
        "max-bytes-per-file", 104857600, INT, "number of bytes per diskqueue file before rolling"
    )
    sync_every: int = option("sync-every", 2500, INT, "number of messages per diskqueue fsync")
    sync_timeout: float = option(
        "sync-timeout", 2.0, DURATION, "duration of time per diskqueue fsync"
    )
    queue_scan_worker_pool_max: int = option(
        "queue-scan-worker-pool-max",
        4,
        INT,
        "max concurrency for checking in-flight and deferred message timeouts",
    )
    queue_scan_selection_count: int = option(
        "queue-scan-selection-count",
        20,
        INT,
        "number of channels to check per cycle (every 100ms) for in-flight and deferred timeouts",
    )

    msg_timeout: float = option(
        "msg-timeout", 60.0, DURATION, "default duration to wait before auto-requeing a message"
    )
    max_msg_timeout: float = option(
        "max-msg-timeout",
        900.0,
        DURATION,
        "maximum duration before a message will timeout",
    )
    max_msg_size: int = option(
        "max-msg-size", 1048576, INT, "maximum size of a single message in bytes"
    )
    max_req_timeout: float = option(
        "max-req-timeout", 3600.0, DURATION, "maximum requeuing timeout for a message"
    )
    max_body_size: int = option(
        "max-body-size", 5242880, INT, "maximum size of a single command body"
    )

    max_heartbeat_interval: float = option(
        "max-heartbeat-interval",
        60.0,
        DURATION,
        "maximum client configurable duration of time between client heartbeats",
    )
    max_rdy_count: int = option("max-rdy-count", 2500, INT, "maximum RDY count for a client")
    max_output_buffer_size: int = option(
        "max-output-buffer-size",
        65536,
        INT,
        "maximum client configurable size (in bytes) for a client output buffer",
    )
    max_output_buffer_timeout: float = option(
        "max-output-buffer-timeout",
        30.0,
        DURATION,
        "maximum client configurable duration of time between flushing to a client",
    )
    min_output_buffer_timeout: float = option(
        "min-output-buffer-timeout",
        0.025,
        DURATION,
        "minimum client configurable duration of time between flushing to a client",
    )
    output_buffer_timeout: float = option(
        "output-buffer-timeout",
        0.25,
        DURATION,
        "default duration of time between flushing data to clients",
    )
    max_channel_consumers: int = option(
        "max-channel-consumers",
        0,
        INT,
        "maximum channel consumer connection count per nsqd instance (default 0, i.e., unlimited)",
    )

    statsd_address: str = option(
        "statsd-address", "", STR, "UDP <addr>:<port> of a statsd daemon for pushing stats"
    )
    statsd_interval: float = option(
        "statsd-interval", 60.0, DURATION, "duration between pushing to statsd"
    )
    statsd_mem_stats: bool = option(
        "statsd-mem-stats", True, BOOL, "toggle sending memory and GC stats to statsd"
    )
    statsd_prefix: str = option(
        "statsd-prefix",
        "nsq.%s",
        STR,
        "prefix used for keys sent to statsd (%s for host replacement)",
    )
    statsd_udp_packet_size: int = option(
        "statsd-udp-packet-size", 508, INT, "the size in bytes of statsd UDP packets"
    )
    statsd_exclude_ephemeral: bool = option(
        "statsd-exclude-ephemeral",
        False,
        BOOL,
        "Skip ephemeral topics and channels when sending stats to statsd",
    )
    e2e_processing_latency_percentiles: list[float] = option(
        "e2e-processing-latency-percentile",
        [],
        FLOAT_LIST,
        "message processing time percentiles (as float (0, 1.0]) to track (can be specified "
        "multiple times or comma separated '1.0,0.99,0.95', default none)",
        cfg="e2e_processing_latency_percentiles",
    )
    e2e_processing_latency_window_time: float = option(
        "e2e-processing-latency-window-time",
        600.0,
        DURATION,
        "calculate end to end latency quantiles for this duration of time",
    )

    tls_cert: str = option("tls-cert", "", STR, "path to certificate file")
    tls_key: str = option("tls-key", "", STR, "path to key file")
    tls_client_auth_policy: str = option(
        "tls-client-auth-policy",
        "",
        STR,
        "client certificate auth policy ('require' or 'require-verify')",
    )
    tls_root_ca_file: str = option(
        "tls-root-ca-file", "", STR, "path to certificate authority file"
    )
    tls_required: int = option(
        "tls-required",
        TLS_NOT_REQUIRED,
        TLS_REQUIRED,
        "require TLS for client connections (true, false, tcp-https)",
    )
    tls_min_version: str = option(
        "tls-min-version",
        "tls1.0",
        TLS_VERSION,
        "minimum SSL/TLS version acceptable ('ssl3.0', 'tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')",
    )

    deflate: bool = option("deflate", True, BOOL, "enable deflate feature negotiation")
    max_deflate_level: int = option(
        "max-deflate-level", 6, INT, "max deflate compression level a client can negotiate"
    )
    snappy: bool = option("snappy", True, BOOL, "enable snappy feature negotiation")

    # Go has these as fixed internal options; we expose them (additively) so tests and embedders
    # can shorten timers. They never change default behaviour.
    client_timeout: float = option(
        "client-timeout",
        60.0,
        DURATION,
        "[nsqpy] idle timeout for clients; the default heartbeat interval is half of it",
    )
    queue_scan_interval: float = option(
        "queue-scan-interval",
        0.1,
        DURATION,
        "[nsqpy] how often in-flight and deferred messages are scanned for timeouts",
    )
    queue_scan_refresh_interval: float = option(
        "queue-scan-refresh-interval",
        5.0,
        DURATION,
        "[nsqpy] how often the list of channels to scan is refreshed",
    )

    # ---- nsqpy beyond Go (docs/beyond-go.md): each is off or additive by default
    metrics: bool = option(
        "metrics",
        True,
        BOOL,
        "[nsqpy] serve Prometheus metrics at /metrics on the HTTP port (additive route)",
    )
    metrics_exclude_ephemeral: bool = option(
        "metrics-exclude-ephemeral",
        False,
        BOOL,
        "[nsqpy] skip ephemeral topics and channels in /metrics",
    )
    max_attempts: int = option(
        "max-attempts",
        0,
        INT,
        "[nsqpy] dead-letter a message instead of delivering it more than this many times "
        "(0 = off, Go's behaviour; per channel with POST /channel/config)",
    )
    dead_letter_topic_suffix: str = option(
        "dead-letter-topic-suffix",
        ".dead",
        STR,
        "[nsqpy] dead-lettered messages of topic T go to topic T<suffix>",
    )
    enable_inspect: bool = option(
        "enable-inspect",
        False,
        BOOL,
        "[nsqpy] serve /topic/peek, /channel/peek, /channel/inflight and /channel/deferred",
    )
    drain_timeout: float = option(
        "drain-timeout",
        0.0,
        DURATION,
        "[nsqpy] on SIGTERM refuse publishes, leave nsqlookupd and keep delivering until the "
        "channels are empty or this long (0 = shut down at once, as Go)",
    )
    max_queue_bytes: int = option(
        "max-queue-bytes",
        0,
        INT,
        "[nsqpy] cap on the bytes queued (memory + disk) in each topic and channel queue; "
        "--queue-full-policy says what a full queue does (0 = unlimited, Go's behaviour; "
        "per channel with POST /channel/config)",
    )
    queue_full_policy: str = option(
        "queue-full-policy",
        "refuse",
        STR,
        "[nsqpy] when a publish would take a queue over --max-queue-bytes: 'refuse' (the "
        "publish fails with E_PUB_FAILED / HTTP 503 QUEUE_FULL) or 'drop-oldest' (the queue's "
        "oldest messages are discarded and counted)",
    )
    max_defer_timeout: float = option(
        "max-defer-timeout",
        0.0,
        DURATION,
        "[nsqpy] maximum DPUB / HTTP defer duration (0 = bounded by --max-req-timeout, as Go)",
    )

    # ---- replicated topics (docs/replication.md): no --replica-peer, no replication
    replica_peers: list[str] = option(
        "replica-peer",
        [],
        STR_LIST,
        "[nsqpy] `HOST:PORT` (the TCP address its clients use) of another nsqd of this node's "
        "replication group (may be given multiple times)",
        cfg="replica_peers",
    )
    replica_acks: int = option(
        "replica-acks",
        2,
        INT,
        "[nsqpy] durable copies, this node's included, before a publish is acknowledged "
        "(with --replica-peer)",
    )
    replica_timeout: float = option(
        "replica-timeout",
        10.0,
        DURATION,
        "[nsqpy] how long a --replica-peer must be unreachable before its messages are taken over",
    )
    replica_max_lag: int = option(
        "replica-max-lag",
        268435456,
        INT,
        "[nsqpy] bytes of its stream a node keeps for a --replica-peer that has not acknowledged "
        "them; a peer further behind that acknowledges nothing for --replica-timeout/2 is cut "
        "loose and gets a snapshot when it links again",
    )


def max_defer_ms(opts: Options) -> int:
    """The longest DPUB / HTTP ``defer`` in ms: --max-defer-timeout when set (nsqio/nsq#1499,
    PR #1504), else --max-req-timeout as in Go."""
    return round((opts.max_defer_timeout or opts.max_req_timeout) * 1000)


class ReplicaOptionError(ValueError):
    """A bad --replica-* value: nsqd refuses to start (``failed to instantiate nsqd - ...``)."""


#: a host name or IPv4 address as written in a peer's address (no spaces, no URL parts)
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")


def parse_replica_peer(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` to (host, port): a bracketed host must be an IPv6
    address (kept in its compressed form so two spellings of one address compare equal), a
    bare host a name or IPv4 address (lower-cased: names are case-insensitive)."""
    try:
        host, port_text = split_host_port(address)
    except ValueError as exc:
        reason = str(exc).removeprefix(f"address {address}: ")
        raise ReplicaOptionError(_bad_peer(address, reason)) from None
    if address.startswith("["):
        host = _ipv6_host(address, host)
    elif not _HOST_NAME.fullmatch(host):
        raise ReplicaOptionError(_bad_peer(address, "missing host" if not host else "bad host"))
    if not (port_text.isdigit() and 1 <= int(port_text) <= 65535):
        raise ReplicaOptionError(_bad_peer(address, "port must be [1,65535]"))
    return host.lower(), int(port_text)


def _ipv6_host(address: str, host: str) -> str:
    try:
        parsed = ipaddress.ip_address(host)
    except ValueError:
        parsed = None
    if not isinstance(parsed, ipaddress.IPv6Address):
        raise ReplicaOptionError(_bad_peer(address, "not an IPv6 address in brackets"))
    return str(parsed)


def _bad_peer(address: str, reason: str) -> str:
    return f'--replica-peer must be HOST:PORT or [IPv6]:PORT, not "{address}" ({reason})'


def _repeated_peer(address: str, earlier: str) -> str:
    if address == earlier:
        return f'--replica-peer "{address}" is given more than once'
    return f'--replica-peer "{address}" is the same peer as "{earlier}"'


def validate_replica_options(opts: Options) -> list[tuple[str, int]]:
    """Start-up checks of the --replica-* options; the peers as (host, port), in the order
    given. Raises ReplicaOptionError. Without --replica-peer the defaults pass unchanged."""
    given: dict[tuple[str, int], str] = {}  # peer -> its address as first written
    for address in opts.replica_peers:
        peer = parse_replica_peer(address)
        if peer in given:
            raise ReplicaOptionError(_repeated_peer(address, given[peer]))
        given[peer] = address
    peers = list(given)
    most = 1 + len(peers)
    if opts.replica_acks < 1 or (peers and opts.replica_acks > most):
        bound = f"[1,{most}] (this node and its --replica-peer)" if peers else "at least 1"
        raise ReplicaOptionError(f"--replica-acks must be {bound}")
    if opts.replica_timeout <= 0:
        raise ReplicaOptionError("--replica-timeout must be greater than 0")
    if opts.replica_max_lag < 1:
        raise ReplicaOptionError("--replica-max-lag must be at least 1")
    return peers
