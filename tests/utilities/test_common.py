"""The shared layer: go-nsq option rules and texts, their mapping onto nsqpy.client, timer
metrics, host pools, Go's JSON encoding, and error wording.

The expected error texts are what Go's nsq_to_nsq v1.3.0 (go-nsq v1.1.0) prints for the same
``--consumer-opt`` values.
"""

from __future__ import annotations

import ssl

import pytest

from nsqpy.apps._gojson import GoJSONError, go_float, marshal, unmarshal_object
from nsqpy.apps._hostpool import EpsilonGreedyHostPool, HostPool
from nsqpy.apps._timer_metrics import TimerMetrics, percentile
from nsqpy.apps.common import (
    ConsumerFlags,
    FatalError,
    client_config,
    describe_error,
    make_consumer,
    user_agent,
)
from nsqpy.client import ExponentialBackoff, FullJitterBackoff, NSQDConnectError
from nsqpy.client.errors import ConnectionClosedError
from nsqpy.internal.flags import UsageError

GO_OPTION_ERRORS = [
    ("read_timeout,10m", "invalid read_timeout ! 10m0s > 5m0s"),
    ("lookupd_poll_jitter,2", "invalid lookupd_poll_jitter ! 2 > 1"),
    ("msg_timeout", "failed to coerce option msg_timeout (true) - invalid value type"),
    (
        "msg_timeout,5",
        'failed to coerce option msg_timeout (5) - time: missing unit in duration "5"',
    ),
    (
        "sample_rate,x",
        'failed to coerce option sample_rate (x) - strconv.ParseInt: parsing "x": invalid syntax',
    ),
    ("tls_min_version,x", "ERROR: x is not a tls version"),
    (
        "max_attempts,-1",
        "failed to coerce option max_attempts (-1) - "
        'strconv.ParseUint: parsing "-1": invalid syntax',
    ),
    ("foo", "invalid option foo"),
    ("foo,1", "invalid option foo"),
    (
        "heartbeat_interval,abc",
        'failed to coerce option heartbeat_interval (abc) - time: invalid duration "abc"',
    ),
    ("deflate_level,10", "invalid deflate_level ! 10 > 9"),
    ("deflate_level,0", "invalid deflate_level ! 0 < 1"),
    ("max_in_flight,-1", "invalid max_in_flight ! -1 < 0"),
    (
        "snappy,maybe",
        "failed to coerce option snappy (maybe) - "
        'strconv.ParseBool: parsing "maybe": invalid syntax',
    ),
    ("backoff_multiplier,2h", "invalid backoff_multiplier ! 2h0m0s > 1h0m0s"),
    ("low_rdy_timeout,500ms", "invalid low_rdy_timeout ! 500ms < 1s"),
    ("rdy_redistribute_interval,6s", "invalid rdy_redistribute_interval ! 6s > 5s"),
    (
        "lookupd_poll_jitter,abc",
        "failed to coerce option lookupd_poll_jitter (abc) - "
        'strconv.ParseFloat: parsing "abc": invalid syntax',
    ),
    (
        "lookupd_poll_jitter",
        "failed to coerce option lookupd_poll_jitter (true) - invalid value type",
    ),
    (
        "tls_root_ca_file,/nonexistent",
        "ERROR: failed to read custom Certificate Authority file "
        "open /nonexistent: no such file or directory",
    ),
    ("tls_root_ca_file", "ERROR: true is not a string"),
    (
        "tls_insecure_skip_verify,yes",
        "failed to coerce option tls_insecure_skip_verify (yes) - "
        'strconv.ParseBool: parsing "yes": invalid syntax',
    ),
    (
        "output_buffer_size,1.5",
        "failed to coerce option output_buffer_size (1.5) - "
        'strconv.ParseInt: parsing "1.5": invalid syntax',
    ),
    ("max_requeue_delay,61m", "invalid max_requeue_delay ! 1h1m0s > 1h0m0s"),
    ("default_requeue_delay,-1s", "invalid default_requeue_delay ! -1s < 0s"),
    ("lookupd_poll_interval,1ms", "invalid lookupd_poll_interval ! 1ms < 10ms"),
    ("write_timeout,50ms", "invalid write_timeout ! 50ms < 100ms"),
    ("msg_timeout,-1s", "invalid msg_timeout ! -1s < 0s"),
    (
        "max_attempts,99999999999999999999",
        "failed to coerce option max_attempts (99999999999999999999) - "
        'strconv.ParseUint: parsing "99999999999999999999": value out of range',
    ),
    ("sample_rate,-5", "invalid sample_rate ! -5 < 0"),
]


@pytest.mark.parametrize(("value", "error"), GO_OPTION_ERRORS)
def test_option_errors_are_go_nsqs(value: str, error: str) -> None:
    with pytest.raises(UsageError) as raised:
        client_config([value], "consumer-opt")
    assert str(raised.value) == f'invalid value "{value}" for flag -consumer-opt: {error}'


def test_options_go_accepts() -> None:
    # Go truncates to the field's width: uint16 70000 is 4464, int32 2**32+1 is 1
    config = client_config(
        [
            "max_attempts,70000",
            "sample_rate,4294967297",
            "max-in-flight,5",  # '-' may stand for '_'
            "snappy",  # a bare key means true
            "local_addr,127.0.0.1:0",  # accepted, no effect here
            "write_timeout,2s",
        ]
    )
    assert config.values["max_attempts"] == 4464
    assert config.values["sample_rate"] == 1
    assert config.values["max_in_flight"] == 5
    assert config.values["snappy"] is True


def test_consumer_options_map_onto_the_client() -> None:
    config = client_config(
        [
            "max_attempts,9",
            "default_requeue_delay,5s",
            "max_requeue_delay,1m",
            "backoff_multiplier,250ms",
            "max_backoff_duration,10s",
            "lookupd_poll_interval,15s",
            "lookupd_poll_jitter,0.1",
            "msg_timeout,45s",
            "heartbeat_interval,5s",
            "read_timeout,20s",
            "dial_timeout,2s",
            "output_buffer_size,-1",
            "output_buffer_timeout,100ms",
            "sample_rate,10",
            "deflate",
            "deflate_level,3",
            "auth_secret,s3cret",
            "client_id,me",
            "hostname,host.example",
            "user_agent,ignored/1.0",
            "max_in_flight,77",
        ]
    )
    kwargs = config.consumer_options(max_in_flight=12, user_agent="nsq_x/1.3.0 nsqpy/0.1.0")
    backoff = kwargs.pop("backoff_strategy")
    assert isinstance(backoff, ExponentialBackoff)
    assert backoff.calculate(1) == pytest.approx(ExponentialBackoff(0.25).calculate(1))
    assert kwargs == {
        "max_attempts": 9,
        "requeue_delay": 5.0,
        "max_requeue_delay": 60.0,
        "backoff_multiplier": 0.25,
        "max_backoff_duration": 10.0,
        "lookupd_poll_interval": 15.0,
        "lookupd_poll_jitter": 0.1,
        "max_in_flight": 12,  # the tool's --max-in-flight wins, as Go sets cfg.MaxInFlight last
        "msg_timeout": 45.0,
        "heartbeat_interval": 5.0,
        "read_timeout": 20.0,
        "dial_timeout": 2.0,
        "output_buffer_size": -1,
        "output_buffer_timeout": 0.1,
        "sample_rate": 10,
        "deflate": True,
        "deflate_level": 3,
        "auth_secret": "s3cret",
        "client_id": "me",
        "hostname": "host.example",
        "user_agent": "nsq_x/1.3.0 nsqpy/0.1.0",  # the tool's, as Go sets cfg.UserAgent last
    }
    # a producer takes only the connection settings
    producer = config.producer_options("to_nsq/1.3.0 nsqpy/0.1.0")
    assert "max_attempts" not in producer and producer["deflate"] is True


def test_full_jitter_backoff_and_tls_context(tmp_path: object) -> None:
    config = client_config(
        ["backoff_strategy,full_jitter", "tls_v1", "tls_insecure_skip_verify,true"]
    )
    kwargs = config.consumer_options(1, "ua")
    assert isinstance(kwargs["backoff_strategy"], FullJitterBackoff)
    context = kwargs["tls"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_NONE and not context.check_hostname
    plain = client_config(["tls_v1"]).connection_options("ua")
    assert plain["tls"] is True  # the system trust store, hostname checked


def test_heartbeat_must_not_exceed_read_timeout() -> None:
    config = client_config(["heartbeat_interval,90s"])
    with pytest.raises(
        FatalError, match=r"^HeartbeatInterval 1m30s must be less than ReadTimeout 1m0s$"
    ):
        make_consumer(
            "nsq_x", "t", "c", lambda m: None, ConsumerFlags(nsqd_tcp_address=["a:1"]), config
        )


def test_negative_heartbeat_disables_and_zero_keeps_nsqds() -> None:
    assert (
        client_config(["heartbeat_interval,-1ms"]).connection_options("ua")["heartbeat_interval"]
        is None
    )
    assert "heartbeat_interval" not in client_config(["heartbeat_interval,0s"]).connection_options(
        "ua"
    )


def test_source_flag_checks() -> None:
    with pytest.raises(
        FatalError, match=r"^--nsqd-tcp-address or --lookupd-http-address required$"
    ):
        ConsumerFlags().check_sources()
    with pytest.raises(
        FatalError, match=r"^use --nsqd-tcp-address or --lookupd-http-address not both$"
    ):
        ConsumerFlags(nsqd_tcp_address=["a:1"], lookupd_http_address=["b:1"]).check_sources()


def test_user_agent_and_connect_error_wording() -> None:
    assert user_agent("nsq_tail") == "nsq_tail/1.3.0 nsqpy/0.1.0"
    refused = ConnectionRefusedError(111, "Connection refused")
    closed = ConnectionClosedError("127.0.0.1:1: connect failed")
    closed.__cause__ = refused
    error = NSQDConnectError("127.0.0.1:1", closed)
    assert describe_error(error) == "dial tcp 127.0.0.1:1: connect: connection refused"
    timed_out = ConnectionClosedError("slow")
    timed_out.__cause__ = TimeoutError()
    assert describe_error(NSQDConnectError("10.0.0.1:4150", timed_out)) == (
        "dial tcp 10.0.0.1:4150: i/o timeout"
    )


# ---------------------------------------------------------------------- timer metrics


def test_timer_metrics_prints_every_status_every_after_the_first_window() -> None:
    lines: list[str] = []
    metrics = TimerMetrics(100, "[aggregate]:", lines.append)
    for i in range(1, 101):
        metrics.status_duration(i / 1000)
    assert lines == []  # the 100th fills the window; Go prints on the 101st
    metrics.status_duration(0.5)  # replaces the first (1 ms)
    assert lines == ["[aggregate]: finished 100 - 99th: 500.00ms - 95th: 98.00ms - avg: 55.49ms"]
    for _ in range(99):
        metrics.status_duration(0.001)
    assert len(lines) == 1
    metrics.status_duration(0.001)
    assert len(lines) == 2


def test_timer_metrics_warns_below_100_and_zero_disables() -> None:
    lines: list[str] = []
    TimerMetrics(10, "", lines.append)
    assert lines == [
        "Warning: use more than 100 status values for accurate percentiles (configured with 10)"
    ]
    silent = TimerMetrics(0, "", lines.append)
    for _ in range(1000):
        silent.status_duration(1.0)
    assert len(lines) == 1
    assert percentile(99.0, []) == 0.0


# ---------------------------------------------------------------------- host pools


def test_host_pool_rotates_and_skips_a_failed_host_until_its_retry() -> None:
    now = [0.0]
    pool = HostPool(["a", "b", "c"], clock=lambda: now[0])
    assert [pool.get().host for _ in range(4)] == ["a", "b", "c", "a"]
    pool.get().mark(None)  # b succeeded
    failed = pool.get()
    assert failed.host == "c"
    failed.mark("boom")
    assert [pool.get().host for _ in range(4)] == ["a", "b", "a", "b"]
    now[0] = 31.0  # after the 30 s retry delay c gets one more try (it is next in turn)
    assert [pool.get().host for _ in range(3)] == ["c", "a", "b"]
    assert [pool.get().host for _ in range(2)] == ["a", "b"]  # and then waits 60 s
    now[0] = 92.0
    assert pool.get().host == "c"


def test_host_pool_resets_when_every_host_failed() -> None:
    pool = HostPool(["a", "b"], clock=lambda: 0.0)
    for _ in range(2):
        pool.get().mark("down")
    # go-hostpool: all dead means all reset, and the turn starts again at the first host
    assert [pool.get().host for _ in range(3)] == ["a", "a", "b"]


def test_epsilon_greedy_prefers_the_fast_healthy_host() -> None:
    import random

    now = [0.0]
    pool = EpsilonGreedyHostPool(
        ["slow", "fast"], epsilon=0.1, clock=lambda: now[0], rng=random.Random(7)
    )
    for host, took in (("slow", 0.5), ("fast", 0.01)):
        response = pool.get()
        assert response.host == host  # every host is measured first
        now[0] += took
        response.mark(None)
    picks = [pool.get() for _ in range(200)]
    for response in picks:
        response.mark(None)
    fast = sum(1 for r in picks if r.host == "fast")
    assert fast > 150
    failing = pool.get()
    failing.mark("down")
    assert all(pool.get().host != failing.host for _ in range(20))


# ---------------------------------------------------------------------- Go's JSON


def test_go_json_encoding() -> None:
    decoded = unmarshal_object(b'{"b":[1,2.5,true,null],"a":{"y":1e-7,"x":"<\xc3\xa9>"},"c":1e21}')
    assert marshal(decoded) == (
        b'{"a":{"x":"\\u003c\xc3\xa9\\u003e","y":1e-7},"b":[1,2.5,true,null],"c":1e+21}'
    )
    assert [
        go_float(v) for v in (0.0, -0.0, 5.0, 0.00001, 1e-7, 1.5e300, 12345678901234567890.0)
    ] == [
        "0",
        "-0",
        "5",
        "0.00001",
        "1e-7",
        "1.5e+300",
        "12345678901234567000",
    ]
    assert marshal({"ctl": "\x01\n\t\u2028"}) == b'{"ctl":"\\u0001\\n\\t\\u2028"}'
    assert unmarshal_object(b"null") == {}
    for bad in (b"[1]", b'"s"', b"{", b"NaN", b'{"a":Infinity}'):
        with pytest.raises(GoJSONError):
            unmarshal_object(bad)
