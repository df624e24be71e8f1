"""go-nsq's ``Config`` as the utilities' ``--consumer-opt`` / ``--producer-opt`` see it.

Go's tools pass each ``key,value`` string to ``nsq.ConfigFlag.Set``: the key names a go-nsq
``Config`` field by its ``opt`` tag (``-`` may stand for ``_``), a key without a value means
``true``, the value is coerced to the field's type and checked against its min/max tags. This
module keeps those rules and error texts (go-nsq v1.1.0 ``config.go``) and maps the result onto
the keyword arguments of :class:`nsqpy.client.Consumer`, :class:`~nsqpy.client.Producer` and
:class:`~nsqpy.client.ConnectionOptions`.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from typing import Any

from ..client.backoff import BackoffStrategy, ExponentialBackoff, FullJitterBackoff
from ..internal.durations import format_duration, parse_duration
from ..internal.flags import parse_bool, parse_int
from ..protocol.errors import go_quote

__all__ = ["ClientConfig", "ConfigError"]

# value kinds (go-nsq field types)
_DURATION, _INT, _UINT, _FLOAT, _BOOL, _STR = "duration", "int", "uint", "float", "bool", "str"
_BACKOFF, _ADDR, _POINTER = "backoff", "addr", "pointer"

# What each go-nsq option becomes here: ("consumer", kwarg) for Consumer-level settings,
# ("connection", kwarg) for ConnectionOptions (used by consumers and producers), or
# ("ignored", "") for options that have no meaning with this client (accepted like Go).
_Target = tuple[str, str]


@dataclass(frozen=True)
class _Option:
    kind: str
    target: _Target
    min: str = ""
    max: str = ""
    #: the Go field's integer width: a parsed value is truncated to it (uint16 70000 -> 4464)
    bits: int = 0


_OPTIONS: dict[str, _Option] = {
    "dial_timeout": _Option(_DURATION, ("connection", "dial_timeout")),
    "read_timeout": _Option(_DURATION, ("connection", "read_timeout"), "100ms", "5m"),
    # asyncio writes never block the caller, so there is no write deadline to apply
    "write_timeout": _Option(_DURATION, ("ignored", ""), "100ms", "5m"),
    "local_addr": _Option(_ADDR, ("ignored", "")),
    "lookupd_poll_interval": _Option(
        _DURATION, ("consumer", "lookupd_poll_interval"), "10ms", "5m"
    ),
    "lookupd_poll_jitter": _Option(_FLOAT, ("consumer", "lookupd_poll_jitter"), "0", "1"),
    "lookupd_poll_timeout": _Option(_DURATION, ("consumer", "lookupd_poll_timeout")),
    "max_requeue_delay": _Option(_DURATION, ("consumer", "max_requeue_delay"), "0", "60m"),
    "default_requeue_delay": _Option(_DURATION, ("consumer", "requeue_delay"), "0", "60m"),
    "backoff_strategy": _Option(_BACKOFF, ("consumer", "backoff_strategy")),
    "max_backoff_duration": _Option(_DURATION, ("consumer", "max_backoff_duration"), "0", "60m"),
    "backoff_multiplier": _Option(_DURATION, ("consumer", "backoff_multiplier"), "0", "60m"),
    "max_attempts": _Option(_UINT, ("consumer", "max_attempts"), "0", "65535", bits=16),
    "low_rdy_idle_timeout": _Option(_DURATION, ("consumer", "low_rdy_idle_timeout"), "1s", "5m"),
    "low_rdy_timeout": _Option(_DURATION, ("consumer", "low_rdy_timeout"), "1s", "5m"),
    "rdy_redistribute_interval": _Option(
        _DURATION, ("consumer", "rdy_redistribute_interval"), "1ms", "5s"
    ),
    "client_id": _Option(_STR, ("connection", "client_id")),
    "hostname": _Option(_STR, ("connection", "hostname")),
    "user_agent": _Option(_STR, ("connection", "user_agent")),
    "heartbeat_interval": _Option(_DURATION, ("connection", "heartbeat_interval")),
    "sample_rate": _Option(_INT, ("connection", "sample_rate"), "0", "99", bits=32),
    "tls_v1": _Option(_BOOL, ("connection", "tls")),
    "tls_config": _Option(_POINTER, ("ignored", "")),
    "deflate": _Option(_BOOL, ("connection", "deflate")),
    "deflate_level": _Option(_INT, ("connection", "deflate_level"), "1", "9"),
    "snappy": _Option(_BOOL, ("connection", "snappy")),
    "output_buffer_size": _Option(_INT, ("connection", "output_buffer_size")),
    "output_buffer_timeout": _Option(_DURATION, ("connection", "output_buffer_timeout")),
    "max_in_flight": _Option(_INT, ("consumer", "max_in_flight"), "0"),
    "msg_timeout": _Option(_DURATION, ("connection", "msg_timeout"), "0"),
    "auth_secret": _Option(_STR, ("connection", "auth_secret")),
    "skip_lookupd_authorization": _Option(_BOOL, ("ignored", "")),
}

_TLS_OPTIONS = (
    "tls_root_ca_file",
    "tls_insecure_skip_verify",
    "tls_cert",
    "tls_key",
    "tls_min_version",
)
_TLS_VERSIONS = {
    "ssl3.0": ssl.TLSVersion.SSLv3,
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
}


class ConfigError(ValueError):
    """An option go-nsq would refuse; the text is go-nsq's."""


def _go_value(value: Any) -> str:
    """Go's ``%v`` of a coerced option value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    return str(value)


def _parse_float(text: str) -> float:
    try:
        if text.strip() != text or text.lower() in ("infinity", "+infinity", "-infinity"):
            raise ValueError
        return float(text)
    except ValueError:
        raise ValueError(f"strconv.ParseFloat: parsing {go_quote(text)}: invalid syntax") from None


def _parse_go_duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError:
        if re.fullmatch(r"[+-]?[0-9.]+", text) and text not in ("0", "+0", "-0"):
            raise ValueError(f"time: missing unit in duration {go_quote(text)}") from None
        raise ValueError(f"time: invalid duration {go_quote(text)}") from None


def _coerce(kind: str, value: str | bool) -> Any:
    """go-nsq's ``coerce``: a string from the command line, or ``True`` for a bare key."""
    if isinstance(value, bool):
        if kind == _BOOL:
            return value
        if kind in (_INT, _UINT):  # Go: reflect.ValueOf(true).Int() panics; refuse cleanly
            raise ValueError("invalid value type")
        if kind == _STR:
            return "%!s(bool=true)"  # fmt.Sprintf("%s", true): what go-nsq stores
        raise ValueError("invalid value type")
    if kind == _DURATION:
        return _parse_go_duration(value)
    if kind == _INT:
        return parse_int(value)
    if kind == _UINT:
        return parse_int(value, unsigned=True)
    if kind == _FLOAT:
        return _parse_float(value)
    if kind == _BOOL:
        return parse_bool(value)
    if kind == _STR:
        return value
    if kind == _BACKOFF:
        if value in ("", "exponential", "full_jitter"):
            return value or "exponential"
        raise ValueError("invalid value type")
    if kind == _ADDR:
        return value
    raise ValueError(f"invalid type {kind}")


def _truncate(value: int, bits: int, signed: bool) -> int:
    """Go's reflect SetInt/SetUint into a narrower field keeps the low bits."""
    value &= (1 << bits) - 1
    if signed and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def _bound(kind: str, text: str) -> Any:
    return parse_duration(text) if kind == _DURATION else float(text)


def _show(kind: str, value: Any) -> str:
    return format_duration(value) if kind == _DURATION else _go_value(value)


@dataclass
class ClientConfig:
    """The options set through ``--consumer-opt`` / ``--producer-opt``, by go-nsq name.

    Only options given on the command line are recorded: everything else keeps nsqpy's
    defaults, which are go-nsq's (the output buffer defaults are nsqd's, which go-nsq repeats).
    """

    values: dict[str, Any] = field(default_factory=dict)
    tls: dict[str, Any] = field(default_factory=dict)

    def set_flag(self, text: str) -> None:
        """``nsq.ConfigFlag.Set``: ``key`` (means true) or ``key,value``."""
        key, sep, value = text.partition(",")
        self.set(key, value if sep else True)

    def set(self, option: str, value: str | bool) -> None:
        option = option.replace("-", "_")
        if option in _TLS_OPTIONS:
            self._set_tls(option, value)
            return
        spec = _OPTIONS.get(option)
        if spec is None:
            raise ConfigError(f"invalid option {option}")
        try:
            coerced = _coerce(spec.kind, value)
        except ValueError as exc:
            shown = _go_value(value)
            raise ConfigError(f"failed to coerce option {option} ({shown}) - {exc}") from None
        if spec.bits:
            coerced = _truncate(coerced, spec.bits, signed=spec.kind == _INT)
        if spec.min and coerced < _bound(spec.kind, spec.min):
            low = _show(spec.kind, _bound(spec.kind, spec.min))
            raise ConfigError(f"invalid {option} ! {_show(spec.kind, coerced)} < {low}")
        if spec.max and coerced > _bound(spec.kind, spec.max):
            high = _show(spec.kind, _bound(spec.kind, spec.max))
            raise ConfigError(f"invalid {option} ! {_show(spec.kind, coerced)} > {high}")
        self.values[option] = coerced

    def _set_tls(self, option: str, value: str | bool) -> None:
        if option == "tls_insecure_skip_verify":
            try:
                self.tls[option] = _coerce(_BOOL, value)
            except ValueError as exc:
                shown = _go_value(value)
                raise ConfigError(f"failed to coerce option {option} ({shown}) - {exc}") from None
            return
        if not isinstance(value, str):
            raise ConfigError(f"ERROR: {_go_value(value)} is not a string")
        if option == "tls_min_version" and value not in _TLS_VERSIONS:
            raise ConfigError(f"ERROR: {value} is not a tls version")
        if option == "tls_root_ca_file":
            try:
                with open(value, "rb") as handle:
                    pem = handle.read()
            except OSError as exc:
                reason = exc.strerror or str(exc)
                raise ConfigError(  # Go's *PathError text
                    "ERROR: failed to read custom Certificate Authority file "
                    f"open {value}: {reason[:1].lower()}{reason[1:]}"
                ) from None
            if b"-----BEGIN CERTIFICATE-----" not in pem:
                raise ConfigError(
                    "ERROR: failed to append certificates from Certificate Authority file"
                )
        self.tls[option] = value

    def validate(self) -> None:
        """go-nsq's ``Config.Validate`` cross-check, run when a consumer/producer is made."""
        heartbeat = self.values.get("heartbeat_interval", 30.0)
        read_timeout = self.values.get("read_timeout", 60.0)
        if heartbeat > read_timeout:
            raise ConfigError(
                f"HeartbeatInterval {format_duration(heartbeat)} must be less than "
                f"ReadTimeout {format_duration(read_timeout)}"
            )

    # ------------------------------------------------------------------ onto nsqpy.client

    def connection_options(self, user_agent: str) -> dict[str, Any]:
        """:class:`~nsqpy.client.ConnectionOptions` keyword arguments (the app's user agent
        replaces any ``user_agent`` option, as Go's tools set ``cfg.UserAgent`` last)."""
        kwargs = self._targets("connection")
        kwargs["user_agent"] = user_agent
        heartbeat = kwargs.get("heartbeat_interval")
        if heartbeat is not None and heartbeat <= 0:
            # go-nsq sends whole milliseconds: negative disables heartbeats, 0 keeps nsqd's
            if heartbeat < 0:
                kwargs["heartbeat_interval"] = None
            else:
                del kwargs["heartbeat_interval"]
        if kwargs.get("tls"):
            context = self._tls_context()
            if context is not None:
                kwargs["tls"] = context
        return kwargs

    def consumer_options(self, max_in_flight: int, user_agent: str) -> dict[str, Any]:
        """:class:`~nsqpy.client.Consumer` keyword arguments (``--max-in-flight`` wins over
        a ``max_in_flight`` option, as Go's tools set ``cfg.MaxInFlight`` last)."""
        kwargs = self._targets("consumer")
        strategy = kwargs.pop("backoff_strategy", "exponential")
        multiplier = kwargs.get("backoff_multiplier", 1.0)
        backoff: BackoffStrategy = (
            FullJitterBackoff(multiplier)
            if strategy == "full_jitter"
            else ExponentialBackoff(multiplier)
        )
        kwargs["backoff_strategy"] = backoff
        kwargs["max_in_flight"] = max_in_flight
        kwargs.update(self.connection_options(user_agent))
        return kwargs

    def producer_options(self, user_agent: str) -> dict[str, Any]:
        """:class:`~nsqpy.client.Producer` keyword arguments (consumer settings are ignored,
        as a go-nsq Producer ignores them)."""
        return self.connection_options(user_agent)

    def _targets(self, kind: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in self.values.items():
            target_kind, kwarg = _OPTIONS[name].target
            if target_kind == kind:
                out[kwarg] = value
        return out

    def _tls_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.tls.get("tls_root_ca_file"))
        if "tls_min_version" in self.tls:  # else Python's floor (TLS 1.2), safer than Go's 1.0
            context.minimum_version = _TLS_VERSIONS[self.tls["tls_min_version"]]
        if self.tls.get("tls_insecure_skip_verify"):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        cert, key = self.tls.get("tls_cert"), self.tls.get("tls_key")
        if cert and key:
            try:
                context.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"tls: failed to load key pair - {exc}") from None
        return context
