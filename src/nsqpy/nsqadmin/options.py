"""nsqadmin options: the single source for flags, config-file keys and defaults.

Go: ``nsqadmin/options.go`` and ``apps/nsqadmin/main.go``. Config-file keys are the flag names
with ``-`` replaced by ``_``, except the three lists (``nsqlookupd_http_addresses``,
``nsqd_http_addresses``, ``admin_users``). ``poll-interval`` and ``history-points`` are nsqpy's
own: the poller behind ``/api/overview`` and ``/api/history``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..internal.flags import (
    BOOL,
    DURATION,
    INT,
    STR,
    STR_LIST,
    CommonOptions,
    HTTPClientTimeouts,
    option,
)

#: Options Go's /config/:opt does not know (they are flags of the command, not of the Options).
COMMAND_ONLY = frozenset({"version", "config", "verbose"})
#: Options /config/:opt never reads back.
SECRET = frozenset({"nsqd_auth_secret"})


@dataclass
class Options(CommonOptions, HTTPClientTimeouts):
    log_prefix: str = option("log-prefix", "[nsqadmin] ", STR, "log message prefix")

    http_address: str = option(
        "http-address", "0.0.0.0:4171", STR, "<addr>:<port> to listen on for HTTP clients"
    )
    base_path: str = option("base-path", "/", STR, "URL base path")
    dev_static_dir: str = option("dev-static-dir", "", STR, "(development use only)")

    graphite_url: str = option("graphite-url", "", STR, "graphite HTTP address")
    proxy_graphite: bool = option("proxy-graphite", False, BOOL, "proxy HTTP requests to graphite")

    statsd_counter_format: str = option(
        "statsd-counter-format",
        "stats.counters.%s.count",
        STR,
        "The counter stats key formatting applied by the implementation of statsd. "
        "If no formatting is desired, set this to an empty string.",
    )
    statsd_gauge_format: str = option(
        "statsd-gauge-format",
        "stats.gauges.%s",
        STR,
        "The gauge stats key formatting applied by the implementation of statsd. "
        "If no formatting is desired, set this to an empty string.",
    )
    statsd_prefix: str = option(
        "statsd-prefix",
        "nsq.%s",
        STR,
        "prefix used for keys sent to statsd (%s for host replacement, must match nsqd)",
    )
    statsd_interval: float = option(
        "statsd-interval",
        60.0,
        DURATION,
        "time interval nsqd is configured to push to statsd (must match nsqd)",
    )

    notification_http_endpoint: str = option(
        "notification-http-endpoint",
        "",
        STR,
        "HTTP endpoint (fully qualified) to which POST notifications of admin actions will be sent",
    )

    http_client_tls_insecure_skip_verify: bool = option(
        "http-client-tls-insecure-skip-verify",
        False,
        BOOL,
        "configure the HTTP client to skip verification of TLS certificates",
    )
    http_client_tls_root_ca_file: str = option(
        "http-client-tls-root-ca-file", "", STR, "path to CA file for the HTTP client"
    )
    http_client_tls_cert: str = option(
        "http-client-tls-cert", "", STR, "path to certificate file for the HTTP client"
    )
    http_client_tls_key: str = option(
        "http-client-tls-key", "", STR, "path to key file for the HTTP client"
    )

    allow_config_from_cidr: str = option(
        "allow-config-from-cidr",
        "127.0.0.1/8",
        STR,
        "A CIDR from which to allow HTTP requests to the /config endpoint",
    )
    acl_http_header: str = option(
        "acl-http-header",
        "X-Forwarded-User",
        STR,
        "HTTP header to check for authenticated admin users",
    )

    nsqlookupd_http_addresses: list[str] = option(
        "lookupd-http-address",
        [],
        STR_LIST,
        "lookupd HTTP address (may be given multiple times)",
        cfg="nsqlookupd_http_addresses",
    )
    nsqd_http_addresses: list[str] = option(
        "nsqd-http-address",
        [],
        STR_LIST,
        "nsqd HTTP address (may be given multiple times)",
        cfg="nsqd_http_addresses",
    )
    admin_users: list[str] = option(
        "admin-user",
        [],
        STR_LIST,
        "admin user (may be given multiple times; if specified, only these users will be able "
        "to perform privileged actions; acl-http-header is used to determine the authenticated "
        "user)",
        cfg="admin_users",
    )

    # nsqpy: the secret nsqadmin gives nsqd's inspection routes when nsqd runs an auth server
    nsqd_auth_secret: str = option(
        "nsqd-auth-secret",
        "",
        STR,
        "secret sent to nsqd's --enable-inspect routes (X-NSQ-Auth-Secret) for nsqd with "
        "--auth-http-address; it needs a subscribe grant for the channels admins inspect",
    )

    # nsqpy: the cluster poller behind /api/overview and /api/history (0 disables it)
    poll_interval: float = option(
        "poll-interval",
        5.0,
        DURATION,
        "how often to poll every nsqd's /stats for rates and history (0 disables)",
    )
    history_points: int = option(
        "history-points", 360, INT, "how many polls of history to keep per topic, channel and node"
    )
