"""Go ``time.Duration`` syntax: ``300ms``, ``1h30m``, ``2.5s``; kept in seconds as floats."""

from __future__ import annotations

import re

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Parse a Go duration string into seconds; raises ValueError like Go's ParseDuration."""
    raw = text  # no whitespace stripping: Go rejects " 60s"
    sign = 1.0
    if text[:1] in "+-" and text:
        sign = -1.0 if text[0] == "-" else 1.0
        text = text[1:]
    if text == "0":
        return 0.0
    if not text:
        raise ValueError(f'time: invalid duration "{raw}"')
    total = 0.0
    pos = 0
    while pos < len(text):
        match = _PART.match(text, pos)
        if match is None:
            if re.match(r"\d+\.?\d*$", text[pos:]):
                raise ValueError(f'time: missing unit in duration "{raw}"')
            raise ValueError(f'time: invalid duration "{raw}"')
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return sign * total


def to_ns(seconds: float) -> int:
    return round(seconds * 1e9)


def to_ms(seconds: float) -> int:
    return round(seconds * 1e3)


def format_duration(seconds: float) -> str:
    """Format like Go's Duration.String(): ``1h2m3.5s``, ``250ms``, ``0s``."""
    ns = to_ns(seconds)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{_trim(ns / 1e3)}µs"
    if ns < 1_000_000_000:
        return f"{sign}{_trim(ns / 1e6)}ms"
    hours, rem = divmod(ns, 3600 * 10**9)
    minutes, rem = divmod(rem, 60 * 10**9)
    secs = _trim(rem / 1e9)
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{sign}{minutes}m{secs}s"
    return f"{sign}{secs}s"


def _trim(value: float) -> str:
    text = f"{value:.9f}".rstrip("0").rstrip(".")
    return text or "0"
