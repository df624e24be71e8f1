"""nsqd AUTH against a real HTTP auth server started by the test (aiohttp on 127.0.0.1):
as Go, with ``--auth-http-address`` set, SUB and the PUBs need a successful AUTH first (FIN, REQ,
TOUCH, RDY, NOP and CLS do not), and nsqd asks the server with ``common_name``, ``remote_ip``,
``secret`` and ``tls`` as query parameters.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import (
    BE32,
    NsqConn,
    auth_cmd,
    command,
    free_port,
    http_request,
    mpub_cmd,
    pub_cmd,
    stats,
    unique,
    wait_until,
)
from .nsqd_transport_support import AuthServer, Certs, client_round_trip, client_stats, make_certs

SECRET = b"testsecret"
ACCEPT = "application/vnd.nsq; version=1.0"
EVERYTHING = [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]
GO_QUERY = "/auth?common_name=&remote_ip=127.0.0.1&secret=testsecret&tls=false"


@pytest.fixture(scope="module")
def authd() -> Iterator[AuthServer]:
    server = AuthServer().start()
    yield server
    server.stop()


@pytest.fixture
def auth(authd: AuthServer) -> AuthServer:
    """The module's auth server, reset: it grants everything, at once, for an hour."""
    authd.queries.clear()
    authd.delay = 0.0
    authd.grant(EVERYTHING)
    return authd


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


class Daemons:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.started: dict[tuple[str, ...], DaemonProcess] = {}

    def get(self, *flags: str, https: bool = False) -> DaemonProcess:
        if flags not in self.started:
            data = self.base / f"nsqd{len(self.started)}"
            data.mkdir()
            self.started[flags] = start_nsqd(data, *flags, https=https)
        return self.started[flags]

    def stop_all(self) -> None:
        crashed = [d for d in self.started.values() if d.proc and d.proc.poll() is not None]
        for daemon in self.started.values():
            daemon.stop()
        assert not crashed, "nsqd died:\n" + "\n\n".join(d.log for d in crashed)


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemons]:
    pool = Daemons(tmp_path_factory.mktemp("data"))
    yield pool
    pool.stop_all()


@pytest.fixture
def nsqd(daemons: Daemons, authd: AuthServer) -> DaemonProcess:
    return daemons.get(f"--auth-http-address={authd.address}")


def authed_conn(nsqd: DaemonProcess, secret: bytes = SECRET) -> NsqConn:
    conn = NsqConn(nsqd.tcp_address)
    conn.send(auth_cmd(secret))
    json.loads(conn.expect_response())
    return conn


# --------------------------------------------------------------------------- grant and deny


def test_grant_answers_go_json_and_asks_the_exact_query(
    nsqd: DaemonProcess, auth: AuthServer
) -> None:
    """Go's TestClientAuth (allowed): the AUTH response, then SUB works; the auth server saw Go's
    exact GET."""
    auth.grant(
        [{"topic": "test", "channels": [".*"], "permissions": ["subscribe", "publish"]}], ttl=10
    )
    with NsqConn(nsqd.tcp_address) as conn:
        assert conn.identify_json()["auth_required"] is True
        conn.send(auth_cmd(SECRET))
        assert conn.expect_response() == b'{"identity":"","identity_url":"","permission_count":1}'
        conn.sub("test", "ch")
    [query] = auth.queries
    assert (query.method, query.path_qs) == ("GET", GO_QUERY)
    assert query.headers["Accept"] == ACCEPT


def test_no_authorizations_is_unauthorized(nsqd: DaemonProcess, auth: AuthServer) -> None:
    """Go's TestClientAuth (refused): no authorization, so the AUTH fails."""
    auth.answer = lambda q: (200, {"ttl": 1, "authorizations": []})
    with NsqConn(nsqd.tcp_address) as conn:
        conn.send(auth_cmd(SECRET))
        conn.expect_error("E_UNAUTHORIZED AUTH no authorizations found")
    assert [q.path_qs for q in auth.queries] == [GO_QUERY]


def test_identity_in_the_response_and_in_stats(nsqd: DaemonProcess, auth: AuthServer) -> None:
    auth.grant(EVERYTHING * 2, identity="alice", identity_url="https://example.invalid/u/alice")
    topic = unique("identity")
    with NsqConn(nsqd.tcp_address) as conn:
        conn.send(auth_cmd(SECRET))
        assert json.loads(conn.expect_response()) == {
            "identity": "alice",
            "identity_url": "https://example.invalid/u/alice",
            "permission_count": 2,
        }
        conn.sub(topic, "ch")
        [client] = client_stats(nsqd, topic, "ch")
        assert client["authed"] is True
        assert client["auth_identity"] == "alice"
        assert client["auth_identity_url"] == "https://example.invalid/u/alice"
        keys = list(client)
        assert keys.index("user_agent") < keys.index("authed") < keys.index("tls")


def test_stats_omit_auth_keys_without_auth(daemons: Daemons) -> None:
    nsqd = daemons.get()
    topic = unique("no_auth")
    with NsqConn(nsqd.tcp_address) as conn:
        conn.sub(topic, "ch")
        [client] = client_stats(nsqd, topic, "ch")
        assert not {"authed", "auth_identity", "auth_identity_url"} & set(client)


def test_publish_only_grant(nsqd: DaemonProcess, auth: AuthServer) -> None:
    """channels [".*"], permissions ["publish"]: PUB/MPUB/DPUB pass, SUB is refused."""
    auth.grant([{"topic": "^t$", "channels": [".*"], "permissions": ["publish"]}])
    with authed_conn(nsqd) as conn:
        conn.pub("t", b"m")
        conn.send(mpub_cmd("t", [b"a", b"b"]))
        conn.expect_ok()
        conn.send(command("DPUB t 100", b"later"))
        conn.expect_ok()
        conn.send(pub_cmd("t2", b"m"))
        conn.expect_error('E_UNAUTHORIZED AUTH failed for PUB on "t2" ""')
    with authed_conn(nsqd) as conn:
        conn.send(command("SUB t ch"))
        conn.expect_error('E_UNAUTHORIZED AUTH failed for SUB on "t" "ch"')


def test_publish_needs_a_channel_pattern_matching_nothing(
    nsqd: DaemonProcess, auth: AuthServer
) -> None:
    """Go checks the channel regexes for publish too, against "": no pattern, no PUB."""
    auth.grant([{"topic": ".*", "channels": [], "permissions": ["publish"]}])
    with authed_conn(nsqd) as conn:
        conn.send(pub_cmd("t", b"m"))
        conn.expect_error('E_UNAUTHORIZED AUTH failed for PUB on "t" ""')


def test_patterns_search_unanchored_and_subscribe_needs_its_permission(
    nsqd: DaemonProcess, auth: AuthServer
) -> None:
    auth.grant(
        [
            {"topic": "ev", "channels": ["^arch"], "permissions": ["subscribe"]},
            {"topic": "ev", "channels": [".*"], "permissions": ["publish"]},
        ]
    )
    with authed_conn(nsqd) as conn:
        conn.pub("events", b"m")  # "ev" is found inside "events"
        conn.send(pub_cmd("logs", b"m"))
        conn.expect_error('E_UNAUTHORIZED AUTH failed for PUB on "logs" ""')
    with authed_conn(nsqd) as conn:
        conn.sub("the_events", "archive")
    with authed_conn(nsqd) as conn:
        conn.send(command("SUB events live"))
        conn.expect_error('E_UNAUTHORIZED AUTH failed for SUB on "events" "live"')


# --------------------------------------------------------------------------- error strings


@pytest.mark.parametrize(
    "cmd, name",
    [
        (command("SUB t ch"), "SUB"),
        (pub_cmd("t", b"m"), "PUB"),
        (mpub_cmd("t", [b"m"]), "MPUB"),
        (command("DPUB t 10", b"m"), "DPUB"),
    ],
)
def test_auth_first(nsqd: DaemonProcess, auth: AuthServer, cmd: bytes, name: str) -> None:
    """SUB/PUB/MPUB/DPUB before AUTH: Go answers ``E_AUTH_FIRST AUTH required before <CMD>``."""
    with NsqConn(nsqd.tcp_address) as conn:
        conn.send(command("NOP"))  # NOP (like RDY/FIN/REQ/TOUCH/CLS) does not check auth
        conn.send(cmd)
        conn.expect_error(f"E_AUTH_FIRST AUTH required before {name}")
    assert auth.queries == []


def test_auth_disabled(daemons: Daemons) -> None:
    nsqd = daemons.get()
    with NsqConn(nsqd.tcp_address) as conn:
        assert conn.identify_json()["auth_required"] is False
        conn.send(auth_cmd(SECRET))
        conn.expect_error("E_AUTH_DISABLED AUTH disabled")


def test_auth_already_set(nsqd: DaemonProcess, auth: AuthServer) -> None:
    with authed_conn(nsqd) as conn:
        conn.send(auth_cmd(b"again"))
        conn.expect_error("E_INVALID AUTH already set")
    assert len(auth.queries) == 1


@pytest.mark.parametrize(
    "raw, error",
    [
        (
            b"AUTH extra\n" + BE32.pack(6) + SECRET[:6],
            "E_INVALID AUTH invalid number of parameters",
        ),
        (b"AUTH\n" + BE32.pack(0), "E_BAD_BODY AUTH invalid body size 0"),
        (b"AUTH\n" + BE32.pack(-5), "E_BAD_BODY AUTH invalid body size -5"),
        (
            b"AUTH\n" + BE32.pack(5 * 1024 * 1024 + 1),
            "E_BAD_BODY AUTH body too big 5242881 > 5242880",
        ),
    ],
    ids=["params", "empty", "negative", "too-big"],
)
def test_auth_command_errors(nsqd: DaemonProcess, auth: AuthServer, raw: bytes, error: str) -> None:
    with NsqConn(nsqd.tcp_address) as conn:
        conn.send(raw)
        conn.expect_error(error)
    assert auth.queries == []


def test_auth_cut_short_by_eof(nsqd: DaemonProcess, auth: AuthServer) -> None:
    with NsqConn(nsqd.tcp_address) as conn:
        conn.send(b"AUTH\n" + BE32.pack(10) + b"test")
        conn.sock.shutdown(socket.SHUT_WR)
        conn.expect_error("E_BAD_BODY AUTH failed to read body")


def test_auth_after_sub_is_in_the_wrong_state(nsqd: DaemonProcess, auth: AuthServer) -> None:
    with authed_conn(nsqd) as conn:
        conn.sub(unique("state"), "ch")
        conn.send(auth_cmd(SECRET))
        conn.expect_error("E_INVALID cannot AUTH in current state")


# --------------------------------------------------------------------------- auth server failures


@pytest.mark.parametrize(
    "answer",
    [
        (500, {"message": "INTERNAL_ERROR"}),
        (403, {"message": "nope"}),
        (200, b"not json"),
        (200, {"ttl": 0, "authorizations": EVERYTHING}),
        (200, {"ttl": -1, "authorizations": EVERYTHING}),
        (200, {"authorizations": EVERYTHING}),  # no ttl at all
        (200, {"ttl": 60, "authorizations": [{**EVERYTHING[0], "permissions": ["admin"]}]}),
        (200, {"ttl": 60, "authorizations": [{**EVERYTHING[0], "topic": "("}]}),
    ],
    ids=[
        "500",
        "403",
        "bad-json",
        "ttl-0",
        "ttl-negative",
        "no-ttl",
        "bad-permission",
        "bad-regex",
    ],
)
def test_bad_auth_answers_fail_auth(
    nsqd: DaemonProcess, auth: AuthServer, answer: tuple[int, Any]
) -> None:
    """Any failure or invalid answer is ``E_AUTH_FAILED AUTH failed`` (details only logged)."""
    auth.answer = lambda q: answer
    with NsqConn(nsqd.tcp_address) as conn:
        conn.send(auth_cmd(SECRET))
        conn.expect_error("E_AUTH_FAILED AUTH failed")
    assert len(auth.queries) == 1


def test_auth_server_down(daemons: Daemons) -> None:
    nsqd = daemons.get(f"--auth-http-address=127.0.0.1:{free_port()}")
    with NsqConn(nsqd.tcp_address) as conn:
        conn.send(auth_cmd(SECRET))
        conn.expect_error("E_AUTH_FAILED AUTH failed")
    # logged before the error is sent, but read from nsqd's stderr by another thread
    logged = "AUTH failed failed to auth against 127.0.0.1:"
    wait_until(lambda: logged in nsqd.log, what="the auth failure in nsqd's log")


def test_auth_server_too_slow(daemons: Daemons, auth: AuthServer) -> None:
    nsqd = daemons.get(f"--auth-http-address={auth.address}", "--http-client-request-timeout=200ms")
    auth.delay = 2.0
    started = time.monotonic()
    with NsqConn(nsqd.tcp_address) as conn:
        conn.send(auth_cmd(SECRET))
        conn.expect_error("E_AUTH_FAILED AUTH failed")
    assert time.monotonic() - started < 1.5


def test_one_server_down_another_up(daemons: Daemons, auth: AuthServer) -> None:
    """Servers are tried from a random one in turn; the first success wins."""
    down = f"127.0.0.1:{free_port()}"
    nsqd = daemons.get(f"--auth-http-address={down}", f"--auth-http-address={auth.address}")
    for _ in range(6):
        with authed_conn(nsqd) as conn:
            conn.pub("t", b"m")
    assert len(auth.queries) == 6


def test_full_url_is_used_verbatim(daemons: Daemons, auth: AuthServer) -> None:
    nsqd = daemons.get(f"--auth-http-address=http://{auth.address}/custom/check")
    with authed_conn(nsqd):
        pass
    [query] = auth.queries
    assert query.path_qs == "/custom/check" + GO_QUERY.removeprefix("/auth")


def test_secret_bytes_are_percent_encoded(nsqd: DaemonProcess, auth: AuthServer) -> None:
    """The secret is sent as its bytes, form-encoded like Go's url.Values.Encode."""
    with authed_conn(nsqd, b"a b&c=d/\xc3\xa9~"):
        pass
    [query] = auth.queries
    assert query.path_qs == (
        "/auth?common_name=&remote_ip=127.0.0.1&secret=a+b%26c%3Dd%2F%C3%A9~&tls=false"
    )


def test_secret_that_is_not_utf8(nsqd: DaemonProcess, auth: AuthServer) -> None:
    with authed_conn(nsqd, b"ab\xff\xfe") as conn:
        conn.pub("t", b"m")
    [query] = auth.queries
    assert query.path_qs == "/auth?common_name=&remote_ip=127.0.0.1&secret=ab%FF%FE&tls=false"


def test_403_with_https_port_retries_over_https(
    daemons: Daemons, auth: AuthServer, certs: Certs
) -> None:
    """As Go: a 403 whose JSON has ``https_port`` is retried at https://<same host>:<port>,
    verified with ``--tls-root-ca-file``."""
    secure = AuthServer(ssl_context=certs.server_context()).start()
    try:
        secure.grant(EVERYTHING, identity="via-https")
        auth.answer = lambda q: (403, {"message": "TLS_REQUIRED", "https_port": secure.port})
        nsqd = daemons.get(f"--auth-http-address={auth.address}", f"--tls-root-ca-file={certs.ca}")
        with NsqConn(nsqd.tcp_address) as conn:
            conn.send(auth_cmd(SECRET))
            assert json.loads(conn.expect_response())["identity"] == "via-https"
        assert [q.path_qs for q in auth.queries] == [GO_QUERY]
        assert [q.path_qs for q in secure.queries] == [GO_QUERY]
    finally:
        secure.stop()


# --------------------------------------------------------------------------- expiry


def test_expiry_re_queries_lazily_then_fails(nsqd: DaemonProcess, auth: AuthServer) -> None:
    """ttl 1 s: the first PUB after expiry asks again; when the server refuses, the next one
    after expiry gets the fatal ``E_AUTH_FAILED AUTH failed``."""
    auth.grant(EVERYTHING, ttl=1)
    with authed_conn(nsqd) as conn:
        conn.pub("t", b"fresh")
        assert len(auth.queries) == 1
        time.sleep(1.1)
        conn.send(pub_cmd("t", b"expired 1") + pub_cmd("t", b"expired 2"))
        conn.expect_ok()
        conn.expect_ok()
        assert len(auth.queries) == 2  # one re-auth serves both
        assert auth.queries[1].path_qs == GO_QUERY
        auth.answer = lambda q: (403, {"message": "revoked"})
        conn.pub("t", b"still cached")
        time.sleep(1.1)
        conn.send(pub_cmd("t", b"refused"))
        conn.expect_error("E_AUTH_FAILED AUTH failed")
    assert len(auth.queries) == 3


def test_expiry_with_narrower_grant(nsqd: DaemonProcess, auth: AuthServer) -> None:
    auth.grant(EVERYTHING, ttl=1)
    with authed_conn(nsqd) as conn:
        auth.grant([{"topic": "^only$", "channels": [".*"], "permissions": ["publish"]}], ttl=1)
        time.sleep(1.1)
        conn.pub("only", b"m")
        conn.send(pub_cmd("t", b"m"))
        conn.expect_error('E_UNAUTHORIZED AUTH failed for PUB on "t" ""')
    assert len(auth.queries) == 2


def test_a_subscription_is_not_rechecked(nsqd: DaemonProcess, auth: AuthServer) -> None:
    """Only SUB/PUB/MPUB/DPUB check; RDY, FIN and deliveries go on after expiry."""
    auth.grant(EVERYTHING, ttl=1)
    topic = unique("sub")
    with authed_conn(nsqd) as consumer:
        consumer.sub(topic, "ch")
        auth.answer = lambda q: (403, {"message": "revoked"})
        time.sleep(1.1)
        for body in (b"one", b"two"):  # HTTP publishing does not AUTH
            resp = http_request(nsqd.http_address, "POST", f"/pub?topic={topic}", body)
            assert resp.status == 200
        consumer.send(command("RDY 2"))
        received = [consumer.expect_message() for _ in range(2)]
        assert sorted(m.body for m in received) == [b"one", b"two"]
        consumer.send(b"".join(command("FIN " + m.id.decode()) for m in received))
        consumer.send(command("NOP"))
        [client] = wait_until(
            lambda: [c for c in client_stats(nsqd, topic, "ch") if c["finish_count"] == 2],
            timeout=3.0,
            what="both FINs",
        )
        assert client["authed"] is True
    assert len(auth.queries) == 1


# --------------------------------------------------------------------------- POST, TLS, order


def test_post_variant(daemons: Daemons, auth: AuthServer) -> None:
    """[master] a JSON body of one-element arrays, compact and sorted like Go's json.Marshal."""
    nsqd = daemons.get(f"--auth-http-address={auth.address}", "--auth-http-request-method=post")
    with authed_conn(nsqd) as conn:
        conn.pub("t", b"m")
    [query] = auth.queries
    assert (query.method, query.path_qs) == ("POST", "/auth")
    assert query.body == (
        b'{"common_name":[""],"remote_ip":["127.0.0.1"],"secret":["testsecret"],"tls":["false"]}'
    )
    assert query.headers["Content-Type"] == "application/json"
    assert query.headers["Accept"] == ACCEPT


def test_tls_query_carries_the_client_certificate_name(
    daemons: Daemons, auth: AuthServer, certs: Certs
) -> None:
    """Go's TestClientAuth over TLS: ``tls=true`` and the client certificate's CN."""
    nsqd = daemons.get(
        f"--auth-http-address={auth.address}",
        *certs.server_flags(),
        "--tls-client-auth-policy=require",
        https=True,
    )
    with NsqConn(nsqd.tcp_address) as conn:
        response = conn.negotiate(certs.client_context("signed"), tls_v1=True)
        assert response["auth_required"] is True
        conn.send(auth_cmd(SECRET))
        conn.expect_response()
        conn.pub("t", b"over tls")
    [query] = auth.queries
    assert query.path_qs == (
        "/auth?common_name=test.local&remote_ip=127.0.0.1&secret=testsecret&tls=true"
    )


def test_commands_pipelined_after_auth_run_in_order_after_the_answer(
    nsqd: DaemonProcess, auth: AuthServer
) -> None:
    auth.delay = 0.3
    topic = unique("pipelined")
    with NsqConn(nsqd.tcp_address) as conn:
        conn.send(
            auth_cmd(SECRET)
            + pub_cmd(topic, b"one")
            + mpub_cmd(topic, [b"two", b"three"])
            + command(f"SUB {topic} ch")
        )
        # more arrives while the auth server is still thinking (it holds its answer 0.3 s)
        wait_until(lambda: auth.queries, timeout=5.0, what="the auth query")
        conn.send(pub_cmd(topic, b"four") + command("RDY 4"))
        assert json.loads(conn.expect_response())["permission_count"] == 1
        for _ in range(4):  # PUB, MPUB, SUB, PUB
            conn.expect_ok()
        bodies = sorted(conn.expect_message().body for _ in range(4))
        assert bodies == [b"four", b"one", b"three", b"two"]
    assert len(auth.queries) == 1


def test_commands_pipelined_after_a_refused_auth_never_run(
    nsqd: DaemonProcess, auth: AuthServer
) -> None:
    auth.delay = 0.2
    auth.answer = lambda q: (200, {"ttl": 5, "authorizations": []})
    topic = unique("never")
    with NsqConn(nsqd.tcp_address) as conn:
        conn.send(auth_cmd(SECRET) + pub_cmd(topic, b"m") + command(f"SUB {topic} ch"))
        conn.expect_error("E_UNAUTHORIZED AUTH no authorizations found")
    assert not [t for t in stats(nsqd)["topics"] or [] if t["topic_name"] == topic]


async def test_nsqpy_client_with_auth_secret(nsqd: DaemonProcess, auth: AuthServer) -> None:
    auth.grant(EVERYTHING, identity="e2e")
    [client] = await client_round_trip(nsqd, unique("client_auth"), auth_secret="testsecret")
    assert (client["authed"], client["auth_identity"]) == (True, "e2e")
    assert {q.path_qs for q in auth.queries} == {GO_QUERY}
    assert len(auth.queries) == 2  # the producer's connection and the consumer's


def test_auth_query_is_repeated_per_connection(nsqd: DaemonProcess, auth: AuthServer) -> None:
    """Nothing is cached across connections: each AUTH asks the server."""
    for _ in range(3):
        with authed_conn(nsqd) as conn:
            conn.pub("t", b"m")
    assert [q.path_qs for q in auth.queries] == [GO_QUERY] * 3
