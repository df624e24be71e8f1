"""Go-style command lines and TOML config files resolved into one options object.

Accepted spellings, as Go's ``flag`` package: ``-name value``, ``--name value``, ``-name=value``,
``--name=value``; boolean flags take no separate value (``--snappy``, ``--snappy=false``); repeated
flags append for list kinds. Precedence as ``mreiferson/go-options``: explicit flag > config file
value (keyed by the flag's config name) > default.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..protocol.errors import go_quote  # Go's %q, for string defaults in -h
from . import lg
from .durations import format_duration, parse_duration

# Kinds of option value and how they are parsed.
STR, INT, BOOL, DURATION, FLOAT = "str", "int", "bool", "duration", "float"
STR_LIST, FLOAT_LIST = "str_list", "float_list"
LOG_LEVEL, TLS_REQUIRED, TLS_VERSION = "log_level", "tls_required", "tls_version"

_BOOL_LIKE = {BOOL, TLS_REQUIRED}
_LIST_KINDS = {STR_LIST, FLOAT_LIST}

TLS_NOT_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP, TLS_REQUIRED_ALL = 0, 1, 2


class FlagValueError(ValueError):
    """A flag value a custom Go flag type rejects with its own message."""


TLS_VERSIONS = ("tls1.0", "tls1.1", "tls1.2", "tls1.3")


def parse_tls_version(text: str) -> str:
    """Go's tlsVersionOption: ``tls1.0`` .. ``tls1.3`` (any case); empty keeps the default."""
    if text and text.lower() not in TLS_VERSIONS:
        raise FlagValueError(f'unknown tlsVersionOption "{text}"')
    return text.lower()


class UsageError(Exception):
    """A bad command line or config value; the command prints it and exits 2 (as Go)."""


class ConfigFileError(UsageError):
    """A --config file that cannot be read or holds a bad value: fatal, exit 1 (as Go)."""


def option(
    flag: str,
    default: Any,
    kind: str,
    help: str,
    cfg: str | None = None,
    hidden: bool = False,
) -> Any:
    """Declare a dataclass field that is also a command-line flag and a config-file key."""
    meta: dict[str, Any] = {"flag": flag, "kind": kind, "help": help}
    meta["cfg"] = cfg or flag.replace("-", "_")
    meta["hidden"] = hidden
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass
class CommonOptions:
    """The flags every daemon has (each adds its own ``log_prefix`` and the rest)."""

    version: bool = option("version", False, BOOL, "print version string")
    config: str = option("config", "", STR, "path to config file")
    log_level: int = option(
        "log-level", lg.INFO, LOG_LEVEL, "set log verbosity: debug, info, warn, error, or fatal"
    )
    verbose: bool = option("verbose", False, BOOL, "[deprecated] has no effect, use --log-level")


@dataclass(frozen=True)
class FlagSpec:
    flag: str
    attr: str
    kind: str
    help: str
    cfg: str
    default: Any


def specs(options_cls: type) -> list[FlagSpec]:
    out = []
    for field in dataclasses.fields(options_cls):
        if "flag" not in field.metadata:
            continue
        default = field.default
        if default is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        meta = field.metadata
        spec = FlagSpec(meta["flag"], field.name, meta["kind"], meta["help"], meta["cfg"], default)
        out.append(spec)
    return out


@dataclass
class HTTPClientTimeouts:
    """The timeouts of a program's own HTTP requests: nsqd's (to lookupd and the auth
    server), nsqadmin's and the utilities'."""

    http_client_connect_timeout: float = option(
        "http-client-connect-timeout", 2.0, DURATION, "timeout for HTTP connect"
    )
    http_client_request_timeout: float = option(
        "http-client-request-timeout", 5.0, DURATION, "timeout for HTTP request"
    )


# --------------------------------------------------------------------------- value parsing


def parse_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool`` with its error text (the flag parser reports any failure as
    Go's flag package does: ``parse error``)."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f"strconv.ParseBool: parsing {go_quote(text)}: invalid syntax")


_DECIMAL_INT = re.compile(r"[+-]?[0-9]+")
_DECIMAL_UINT = re.compile(r"\+?[0-9]+")


def parse_int(text: str, base: int = 10, unsigned: bool = False) -> int:
    """Go's ``strconv.ParseInt``/``ParseUint`` for 64 bits with their error texts. ``base`` 10
    takes decimal digits only; ``base`` 0 takes Go's prefixes (``0x``, ``0o``, ``0b``, C-style
    octal ``010``) and underscores, as the flag package parses an int."""
    func = "ParseUint" if unsigned else "ParseInt"
    try:
        if base == 0:
            value = _parse_prefixed_int(text)
        elif base == 10 and (_DECIMAL_UINT if unsigned else _DECIMAL_INT).fullmatch(text):
            value = int(text)
        else:
            raise ValueError(text)
    except ValueError:
        raise ValueError(f"strconv.{func}: parsing {go_quote(text)}: invalid syntax") from None
    low, high = (0, 1 << 64) if unsigned else (-(1 << 63), 1 << 63)
    if not low <= value < high:
        raise ValueError(f"strconv.{func}: parsing {go_quote(text)}: value out of range")
    return value


def parse_tls_required(text: str) -> int:
    if text == "tcp-https":
        return TLS_REQUIRED_EXCEPT_HTTP
    return TLS_REQUIRED_ALL if parse_bool(text) else TLS_NOT_REQUIRED


def _parse_prefixed_int(text: str) -> int:
    """strconv's base 0: like Python's base 0, plus C-style octal ``010``."""
    digits = text.lstrip("+-")
    if len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
        value = int(digits, 8)
        return -value if text.startswith("-") else value
    return int(text, 0)


def _parse_float_list(text: str) -> list[float]:
    return [float(part) for part in text.split(",")]


def parse_value(kind: str, text: str) -> Any:
    if kind == STR:
        return text
    if kind == INT:
        return parse_int(text, base=0)
    if kind == BOOL:
        return parse_bool(text)
    if kind == DURATION:
        return parse_duration(text)
    if kind == FLOAT:
        return float(text)
    if kind == STR_LIST:
        return [text]
    if kind == FLOAT_LIST:
        return _parse_float_list(text)
    if kind == LOG_LEVEL:
        return lg.parse_level(text)
    if kind == TLS_REQUIRED:
        return parse_tls_required(text)
    if kind == TLS_VERSION:
        return parse_tls_version(text)
    raise AssertionError(kind)


def coerce_config_value(kind: str, value: Any) -> Any:
    """Coerce a TOML value the way go-options does (integers are milliseconds for durations)."""
    if kind == DURATION and isinstance(value, int) and not isinstance(value, bool):
        return value / 1000.0
    if kind in _LIST_KINDS:
        items = value if isinstance(value, list) else str(value).split(",")
        return [float(v) if kind == FLOAT_LIST else str(v) for v in items]
    if kind == BOOL and isinstance(value, bool):
        return value
    if kind == TLS_REQUIRED and isinstance(value, bool):
        return TLS_REQUIRED_ALL if value else TLS_NOT_REQUIRED
    if kind in (INT, FLOAT) and isinstance(value, int | float) and not isinstance(value, bool):
        return int(value) if kind == INT else float(value)
    return parse_value(kind, str(value))


def render_value(kind: str, value: Any) -> Any:
    """The JSON value Go's /config/:opt returns (durations in ns, log level as its number)."""
    if kind == DURATION:
        return round(value * 1e9)
    if kind == TLS_REQUIRED:
        return value
    return value


def describe_default(spec: FlagSpec) -> str:
    if isinstance(spec.default, bool):
        return "true" if spec.default else "false"
    if spec.kind == DURATION:
        return format_duration(spec.default)
    if spec.kind == LOG_LEVEL:
        return lg.level_name(spec.default)
    return str(spec.default)


# --------------------------------------------------------------------------- argv parsing


@dataclass
class ParsedArgs:
    values: dict[str, Any]
    explicit: set[str]
    positional: list[str]
    show_version: bool = False
    show_help: bool = False


def parse_argv(flag_specs: Sequence[FlagSpec], argv: Sequence[str]) -> ParsedArgs:
    by_flag = {s.flag: s for s in flag_specs}
    parsed = ParsedArgs(values={}, explicit=set(), positional=[])
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            parsed.positional.extend(argv[i:])
            break
        if not arg.startswith("-") or arg == "-":
            parsed.positional.extend(argv[i - 1 :])
            break
        name = arg[2:] if arg.startswith("--") else arg[1:]
        value: str | None = None
        if "=" in name:
            name, value = name.split("=", 1)
        if name in ("h", "help"):
            parsed.show_help = True
            continue
        if name == "version" and "version" not in by_flag:
            parsed.show_version = value is None or parse_bool(value)
            continue
        spec = by_flag.get(name)
        if spec is None:
            raise UsageError(f"flag provided but not defined: -{name}")
        if value is None:
            if spec.kind in _BOOL_LIKE:
                value = "true"
            elif i < len(argv):
                value = argv[i]
                i += 1
            else:
                raise UsageError(f"flag needs an argument: -{name}")
        try:
            parsed_value = parse_value(spec.kind, value)
        except FlagValueError as exc:
            raise UsageError(f'invalid value "{value}" for flag -{name}: {exc}') from None
        except ValueError:
            raise UsageError(f'invalid value "{value}" for flag -{name}: parse error') from None
        if spec.kind in _LIST_KINDS and spec.attr in parsed.values:
            parsed_value = parsed.values[spec.attr] + parsed_value
        if spec.kind == FLOAT_LIST:  # Go's FloatArray.Set sorts descending after every append
            parsed_value = sorted(parsed_value, reverse=True)
        parsed.values[spec.attr] = parsed_value
        parsed.explicit.add(spec.attr)
    return parsed


def load_config(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()  # Go: "open <path>: no such file or directory"
        raise ConfigFileError(
            f"failed to load config file {path} - open {path}: {reason}"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"failed to load config file {path} - {exc}") from None


def resolve(options_cls: type, argv: Sequence[str]) -> tuple[Any, ParsedArgs]:
    """Build an options object from argv and the ``--config`` file it names."""
    flag_specs = specs(options_cls)
    parsed = parse_argv(flag_specs, argv)
    values: dict[str, Any] = {}
    config_path = parsed.values.get("config", "")
    if config_path:
        config = load_config(config_path)
        for spec in flag_specs:
            if spec.cfg in config and spec.attr not in parsed.explicit:
                try:
                    values[spec.attr] = coerce_config_value(spec.kind, config[spec.cfg])
                except (ValueError, TypeError):
                    raise ConfigFileError(
                        f"failed to parse config option {spec.cfg}={config[spec.cfg]!r}"
                    ) from None
    values.update(parsed.values)
    return options_cls(**values), parsed


def usage_default(spec: FlagSpec) -> str:
    """The default as Go's PrintDefaults shows it, or "" when Go leaves it out (a zero value)."""
    if spec.default in ("", [], False, 0, 0.0):
        return ""
    if spec.kind == STR:
        return go_quote(spec.default)
    if spec.kind == FLOAT:  # Go's %v of a float64: 1 not 1.0
        value = float(spec.default)
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    if spec.kind == LOG_LEVEL:  # Go's LogLevel.String()
        return lg.level_name(spec.default).upper()
    return describe_default(spec)


def usage(program: str, options_cls: type) -> str:
    lines = [f"Usage of {program}:"]
    for spec in sorted(specs(options_cls), key=lambda s: s.flag):
        help_text, value_name = spec.help, "value"
        before, tick, rest = help_text.partition("`")
        name, tick2, after = rest.partition("`")
        if tick and tick2:  # Go's flag.UnquoteUsage: `name` in the help names the value
            help_text, value_name = before + name + after, name
        kind = "" if spec.kind in _BOOL_LIKE else f" {value_name}"
        lines.append(f"  -{spec.flag}{kind}")
        default = usage_default(spec)
        suffix = f" (default {default})" if default else ""
        lines.append(f"    \t{help_text}{suffix}")
    return "\n".join(lines) + "\n"


def run_command(
    program: str,
    options_cls: type,
    argv: Sequence[str],
    version_line: str,
    start: Callable[[Any], int],
) -> int:
    """The shared ``main``: parse, handle --help/--version, then run ``start(options)``."""
    try:
        opts, parsed = resolve(options_cls, argv)
    except ConfigFileError as exc:  # not a usage problem: no usage text, Go's log.Fatal
        lg.Logger(f"[{program}] ").fatal(str(exc))
        return 1
    except UsageError as exc:
        sys.stderr.write(f"{exc}\n{usage(program, options_cls)}")
        return 2
    if parsed.show_help:
        sys.stderr.write(usage(program, options_cls))
        return 0
    if parsed.show_version or getattr(opts, "version", False):
        print(version_line)
        return 0
    return start(opts)
