"""Auth grants' topic and channel patterns read as Go's ``regexp`` (RE2) reads them: linear
matching, RE2's syntax (no look-arounds or backreferences), unanchored search. nsqd runs as a
real process against an aiohttp auth server on 127.0.0.1 (tests/nsqd/nsqd_transport_support).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqpy.nsqd.auth import AuthError, compile_pattern, parse_state
from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import NsqConn, auth_cmd, pub_cmd, wait_until
from .nsqd_transport_support import AuthQuery, AuthServer

#: Python's backtracking ``re`` needs about 2**n steps for n a's and a non-matching tail
#: (6.4 s at 28 on a quiet machine); RE2 answers in microseconds.
EXPONENTIAL_TOPIC = "a" * 30 + "-"
EVIL_SECRET = b"evil"
INNOCENT_SECRET = b"innocent"


def grants(topic: str, channels: list[str] | None = None) -> dict[str, Any]:
    permissions = ["subscribe", "publish"]
    return {"topic": topic, "channels": channels or [".*"], "permissions": permissions}


def answer_by_secret(table: dict[bytes, list[dict[str, Any]]]) -> Any:
    def answer(query: AuthQuery) -> tuple[int, Any]:
        for secret, authorizations in table.items():
            if f"secret={secret.decode()}&" in query.path_qs:
                return 200, {"ttl": 3600, "authorizations": authorizations}
        return 403, {"message": "unknown secret"}

    return answer


@pytest.fixture
def authd() -> Iterator[AuthServer]:
    server = AuthServer().start()
    yield server
    server.stop()


@pytest.fixture
def nsqd(tmp_path: Path, authd: AuthServer) -> Iterator[DaemonProcess]:
    """One nsqd per test: a stalled one must not hold up the next test."""
    daemon = start_nsqd(tmp_path, f"--auth-http-address={authd.address}")
    yield daemon
    daemon.stop(timeout=2.0)


def authed(nsqd: DaemonProcess, secret: bytes) -> NsqConn:
    conn = NsqConn(nsqd.tcp_address)
    conn.send(auth_cmd(secret))
    json.loads(conn.expect_response())
    return conn


def test_an_exponential_pattern_is_refused_promptly_while_others_are_served(
    nsqd: DaemonProcess, authd: AuthServer
) -> None:
    authd.answer = answer_by_secret(
        {EVIL_SECRET: [grants("^(a+)+$")], INNOCENT_SECRET: [grants("^innocent$")]}
    )
    with authed(nsqd, EVIL_SECRET) as evil, authed(nsqd, INNOCENT_SECRET) as innocent:
        started = time.monotonic()
        evil.send(pub_cmd(EXPONENTIAL_TOPIC, b"m"))
        innocent.send(pub_cmd("innocent", b"m"))
        innocent.expect_ok(timeout=1.0)
        evil.expect_error(
            f'E_UNAUTHORIZED AUTH failed for PUB on "{EXPONENTIAL_TOPIC}" ""', timeout=2.0
        )
        assert time.monotonic() - started < 2.0
    with authed(nsqd, EVIL_SECRET) as evil:
        evil.pub("aaaa", b"m")  # the same pattern still grants what it matches


@pytest.mark.parametrize(
    "pattern",
    ["^(?=a)a$", "(?<=a)b", "(?!x).*", r"(a)\1", r"a\Z", r"\C", "a**", "a{1001}"],
    ids=["lookahead", "lookbehind", "negative-lookahead", "backreference", "Z", "C", "**", "rep"],
)
def test_a_pattern_go_rejects_fails_auth(
    nsqd: DaemonProcess, authd: AuthServer, pattern: str
) -> None:
    """Go's QueryAuthd compiles every pattern and fails the whole answer on an error."""
    for where in ("topic", "channel"):
        grant = grants(pattern) if where == "topic" else grants("a", [".*", pattern])
        authd.grant([grants("^innocent$"), grant])
        with NsqConn(nsqd.tcp_address) as conn:
            conn.send(auth_cmd(EVIL_SECRET))
            conn.expect_error("E_AUTH_FAILED AUTH failed")
    # logged before the error is sent, but read from nsqd's stderr by another thread
    logged = f"unable to compile channel {json.dumps(pattern)}"
    wait_until(lambda: logged in nsqd.log, what="the compile error in nsqd's log")


def test_re2_syntax_that_python_lacks_is_honoured(nsqd: DaemonProcess, authd: AuthServer) -> None:
    r"""``\z`` ends the text and POSIX classes are classes, as in Go."""
    authd.grant([grants(r"^[[:alpha:]]+\z", [r"^\pL+$", "^$"])])
    with authed(nsqd, EVIL_SECRET) as conn:
        conn.pub("events", b"m")
        conn.send(pub_cmd("events1", b"m"))
        conn.expect_error('E_UNAUTHORIZED AUTH failed for PUB on "events1" ""')
    with authed(nsqd, EVIL_SECRET) as conn:
        conn.sub("events", "archive")


# --------------------------------------------------------------------------- the patterns alone


@pytest.mark.parametrize(
    "pattern, name, matches",
    [
        ("ev", "the_events", True),  # unanchored, as regexp.MatchString
        ("^ev", "the_events", False),
        ("s$", "the_events", True),
        ("", "", True),  # an empty channel pattern matches a publish's empty channel
        (".*", "", True),
        (r"\Q.\E", "a.b", True),
        (r"\Q.\E", "ab", False),
        (r"\\C", "a\\Cb", True),  # an escaped backslash, then a plain C
        ("(?i)EV", "events", True),
        ("^(a+)+$", "a" * 64, True),
        ("^(a+)+$", "a" * 63 + "-", False),
    ],
)
def test_matching_is_go_search(pattern: str, name: str, matches: bool) -> None:
    assert compile_pattern(pattern).matches(name) is matches


def test_compiled_patterns_are_shared_between_answers() -> None:
    body = json.dumps({"ttl": 60, "authorizations": [grants("^shared_topic$", ["^c$"])]})
    first, second = parse_state(body.encode()), parse_state(body.encode())
    assert first.authorizations[0].topic is second.authorizations[0].topic
    assert first.authorizations[0].channels[0] is second.authorizations[0].channels[0]
    assert compile_pattern.cache_info().maxsize is not None  # bounded


def test_the_compile_error_names_the_pattern() -> None:
    body = json.dumps({"ttl": 60, "authorizations": [grants("^(?=a)a$")]})
    with pytest.raises(AuthError, match=r'unable to compile topic "\^\(\?=a\)a\$" error parsing'):
        parse_state(body.encode())
