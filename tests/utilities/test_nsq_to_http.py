"""nsq_to_http as a process between a real nsqd and local aiohttp endpoints that fail some
requests: delivery at least once, retries, GET escaping, modes, headers, stats, flag errors."""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote_plus

import pytest
from aiohttp import web

from nsqpy import NSQ_VERSION
from nsqpy.testing import DaemonProcess

from ..raw_v2 import unique, wait_until
from .conftest import (
    GO_LOG_LINE,
    ToolProcess,
    channel_stats,
    http_post,
    run_tool,
    run_tool_fatal,
    tcp,
)

#: go-nsq options that make a failed message come back quickly (Go's default delay is 90 s)
FAST_RETRY = [
    "--consumer-opt=default_requeue_delay,50ms",
    "--consumer-opt=max_backoff_duration,50ms",
    "--consumer-opt=max_attempts,0",
]


@dataclass
class Received:
    method: str
    path: str
    raw_query: str
    body: bytes
    headers: dict[str, str]


@dataclass
class Endpoint:
    """What one path answers: ``fail_first`` fails each body's first request with
    ``fail_status``; ``status`` answers the others."""

    status: int = 200
    fail_first: bool = False
    fail_status: int = 500
    seen: Counter[bytes] = field(default_factory=Counter)
    requests: list[Received] = field(default_factory=list)

    def successes(self) -> list[Received]:
        return [r for r in self.requests if r.headers.get("X-Answered") == "ok"]


class Sink:
    """A local aiohttp server on its own thread and loop; each path is an :class:`Endpoint`."""

    def __init__(self) -> None:
        self.endpoints: dict[str, Endpoint] = {}
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._started.wait(10)

    def endpoint(self, path: str, **behaviour: object) -> str:
        self.endpoints[path] = Endpoint(**behaviour)  # type: ignore[arg-type]
        return f"http://127.0.0.1:{self.port}{path}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        self._started.set()
        self._loop.run_forever()

    async def _handle(self, request: web.Request) -> web.Response:
        endpoint = self.endpoints[request.path]
        body = await request.read()
        key = body if request.method == "POST" else request.raw_path.encode()
        endpoint.seen[key] += 1
        failing = endpoint.fail_first and endpoint.seen[key] == 1
        status = endpoint.fail_status if failing else endpoint.status
        headers = dict(request.headers)
        headers["X-Answered"] = "fail" if failing else "ok"
        query = request.raw_path.partition("?")[2]
        endpoint.requests.append(Received(request.method, request.path, query, body, headers))
        return web.Response(status=status, text="answer")

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def sink() -> Iterator[Sink]:
    server = Sink()
    yield server
    server.close()


def settled(nsqd: DaemonProcess, topic: str, channel: str = "nsq_to_http") -> bool:
    stats = channel_stats(nsqd, topic, channel)
    return (
        stats is not None
        and stats["message_count"] > 0
        and not any(stats[key] for key in ("depth", "in_flight_count", "deferred_count"))
    )


def prepare(nsqd: DaemonProcess, topic: str, bodies: list[bytes]) -> None:
    http_post(nsqd, "/topic/create", topic=topic)
    http_post(nsqd, "/channel/create", topic=topic, channel="nsq_to_http")
    for body in bodies:
        http_post(nsqd, "/pub", body, topic=topic)


def start(
    tool: Callable[..., ToolProcess], nsqd: DaemonProcess, topic: str, *args: str
) -> ToolProcess:
    forwarder: ToolProcess = tool(
        "nsq_to_http", f"--topic={topic}", f"--nsqd-tcp-address={tcp(nsqd)}", *args
    )
    return forwarder


def stop(forwarder: ToolProcess) -> str:
    assert forwarder.signal() == 0, forwarder.stderr.decode()
    log = forwarder.stderr.decode()
    assert "Traceback" not in log
    return log


def test_post_retries_failures_until_every_message_is_delivered(
    nsqd: DaemonProcess,
    sink: Sink,
    tool: Callable[..., ToolProcess],
) -> None:
    topic = unique("post")
    bodies = [b"event %d \x00\xff" % i for i in range(40)]
    url = sink.endpoint("/ingest", fail_first=True)  # every body fails once: 500
    prepare(nsqd, topic, bodies)
    forwarder = start(tool, nsqd, topic, f"--post={url}", "--n=4", *FAST_RETRY)
    wait_until(lambda: settled(nsqd, topic), timeout=60, what="every message delivered")
    log = stop(forwarder)
    endpoint = sink.endpoints["/ingest"]
    assert sorted(r.body for r in endpoint.successes()) == sorted(bodies)
    assert all(endpoint.seen[b] == 2 for b in bodies)  # the failure, then the retry
    stats = channel_stats(nsqd, topic, "nsq_to_http")
    assert stats is not None and stats["requeue_count"] == len(bodies)
    first = endpoint.requests[0]
    assert first.method == "POST"
    assert first.headers["User-Agent"] == f"nsq_to_http v{NSQ_VERSION}"
    assert first.headers["Content-Type"] == "application/octet-stream"
    assert "connected and subscribed" in log


def test_post_success_is_any_2xx_and_get_success_is_exactly_200(
    nsqd: DaemonProcess,
    sink: Sink,
    tool: Callable[..., ToolProcess],
) -> None:
    topic = unique("codes")
    prepare(nsqd, topic, [b"one", b"two"])
    post = sink.endpoint("/created", status=201)
    forwarder = start(tool, nsqd, topic, f"--post={post}", *FAST_RETRY)
    wait_until(lambda: settled(nsqd, topic), what="delivered", timeout=30.0)
    stop(forwarder)
    assert len(sink.endpoints["/created"].requests) == 2  # 201 is a success for POST

    topic = unique("codes_get")
    prepare(nsqd, topic, [b"one", b"two"])
    get = sink.endpoint("/get201", status=200, fail_first=True, fail_status=201)
    forwarder = start(tool, nsqd, topic, f"--get={get}?v=%s", *FAST_RETRY)
    wait_until(lambda: settled(nsqd, topic), what="delivered", timeout=30.0)
    stop(forwarder)
    endpoint = sink.endpoints["/get201"]
    assert sorted(endpoint.seen.values()) == [2, 2]  # 201 failed a GET: retried
    stats = channel_stats(nsqd, topic, "nsq_to_http")
    assert stats is not None and stats["requeue_count"] == 2


def test_get_fills_the_query_escaped_body(
    nsqd: DaemonProcess,
    sink: Sink,
    tool: Callable[..., ToolProcess],
) -> None:
    topic = unique("get")
    bodies = [b"a b&c=d/e?f", "ü+~_.-!*'()".encode(), b"\x00\xff%"]
    # what Go's url.QueryEscape makes of them
    escaped = {
        "a+b%26c%3Dd%2Fe%3Ff": bodies[0],
        "%C3%BC%2B~_.-%21%2A%27%28%29": bodies[1],
        "%00%FF%25": bodies[2],
    }
    prepare(nsqd, topic, bodies)
    url = sink.endpoint("/hit")
    forwarder = start(
        tool, nsqd, topic, f"--get={url}?data=%s&src=nsq", "--header=X-Custom: yes please"
    )
    wait_until(lambda: settled(nsqd, topic), what="delivered", timeout=30.0)
    stop(forwarder)
    requests = sink.endpoints["/hit"].requests
    assert sorted(r.raw_query for r in requests) == sorted(f"data={e}&src=nsq" for e in escaped)
    for request in requests:
        value = request.raw_query.removeprefix("data=").removesuffix("&src=nsq")
        assert unquote_plus(value, encoding="latin-1").encode("latin-1") == escaped[value]
        assert request.method == "GET" and request.body == b""
        # the same header lines as Go's net/http sends (checked against Go's binary)
        headers = {k: v for k, v in request.headers.items() if k != "X-Answered"}
        assert headers == {
            "Host": f"127.0.0.1:{sink.port}",
            "User-Agent": f"nsq_to_http v{NSQ_VERSION}",
            "X-Custom": "yes please",
            "Accept-Encoding": "gzip",
        }


def test_round_robin_and_broadcast_modes(
    nsqd: DaemonProcess,
    sink: Sink,
    tool: Callable[..., ToolProcess],
) -> None:
    topic = unique("rr")
    bodies = [b"rr %d" % i for i in range(20)]
    prepare(nsqd, topic, bodies)
    a, b = sink.endpoint("/a"), sink.endpoint("/b")
    forwarder = start(tool, nsqd, topic, f"--post={a}", f"--post={b}", "--mode=round-robin")
    wait_until(lambda: settled(nsqd, topic), what="delivered", timeout=30.0)
    stop(forwarder)
    assert len(sink.endpoints["/a"].requests) == len(sink.endpoints["/b"].requests) == 10
    delivered = [r.body for e in ("/a", "/b") for r in sink.endpoints[e].requests]
    assert sorted(delivered) == sorted(bodies)

    # Go: a --mode it does not know sends every message to every address
    topic = unique("all")
    prepare(nsqd, topic, bodies)
    c, d = sink.endpoint("/c"), sink.endpoint("/d")
    forwarder = start(tool, nsqd, topic, f"--post={c}", f"--post={d}", "--mode=everyone")
    wait_until(lambda: settled(nsqd, topic), what="delivered", timeout=30.0)
    stop(forwarder)
    for path in ("/c", "/d"):
        assert sorted(r.body for r in sink.endpoints[path].requests) == sorted(bodies)


@pytest.mark.parametrize("mode", ["hostpool", "epsilon-greedy"])
def test_host_pools_prefer_healthy_endpoints(
    mode: str,
    nsqd: DaemonProcess,
    sink: Sink,
    tool: Callable[..., ToolProcess],
) -> None:
    topic = unique("pool")
    bodies = [b"pool %d" % i for i in range(30)]
    prepare(nsqd, topic, bodies)
    broken = sink.endpoint("/broken", status=503)
    healthy = sink.endpoint("/healthy")
    forwarder = start(
        tool,
        nsqd,
        topic,
        f"--post={broken}",
        f"--post={healthy}",
        f"--mode={mode}",
        "--n=1",
        *FAST_RETRY,
    )
    wait_until(lambda: settled(nsqd, topic), timeout=60, what="delivered")
    stop(forwarder)
    assert sorted(r.body for r in sink.endpoints["/healthy"].requests) == sorted(bodies)
    # a failed host rests 30 s (go-hostpool) before it is tried again
    assert len(sink.endpoints["/broken"].requests) <= 2


def test_sample_zero_finishes_without_sending(
    nsqd: DaemonProcess,
    sink: Sink,
    tool: Callable[..., ToolProcess],
) -> None:
    topic = unique("sample")
    prepare(nsqd, topic, [b"x", b"y", b"z"])
    url = sink.endpoint("/never")
    forwarder = start(tool, nsqd, topic, f"--post={url}", "--sample=0")
    wait_until(lambda: settled(nsqd, topic), what="finished", timeout=30.0)
    stop(forwarder)
    assert sink.endpoints["/never"].requests == []


def test_status_every_logs_timer_metrics(
    nsqd: DaemonProcess,
    sink: Sink,
    tool: Callable[..., ToolProcess],
) -> None:
    topic = unique("status")
    prepare(nsqd, topic, [b"s %d" % i for i in range(11)])
    url = sink.endpoint("/timed")
    forwarder = start(tool, nsqd, topic, f"--post={url}", "--status-every=10", "--n=1")
    wait_until(lambda: settled(nsqd, topic), what="delivered", timeout=30.0)
    forwarder.wait_for_stderr(b"[aggregate]: finished 10")
    stop(forwarder)
    lines = [GO_LOG_LINE.match(line) for line in forwarder.stderr.split(b"\n")]
    texts = [m.group(1).decode() for m in lines if m]
    assert (
        "Warning: use more than 100 status values for accurate percentiles "
        "(configured with 10)" in texts
    )
    summary = [t for t in texts if t.startswith("[aggregate]:")]
    assert len(summary) == 1, texts
    pattern = (
        r"\[aggregate\]: finished 10 - 99th: \d+\.\d\dms - 95th: \d+\.\d\dms - avg: \d+\.\d\dms"
    )
    assert re.fullmatch(pattern, summary[0])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--header=broken"], "--header value format should be 'key=value'"),
        (["--topic=t", "--header=k:"], "--header value format should be 'key=value'"),
        ([], "--topic and --channel are required"),
        (["--topic=t", "--channel="], "--topic and --channel are required"),
        (["--topic=t", "--content-type=text/plain"], "--content-type only used with --post"),
        (
            ["--topic=t", "--content-type=", "--post=http://x/"],
            "--content-type requires a value when used",
        ),
        (["--topic=t"], "--nsqd-tcp-address or --lookupd-http-address required"),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--lookupd-http-address=127.0.0.1:2"],
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (["--topic=t", "--nsqd-tcp-address=127.0.0.1:1"], "--get or --post required"),
        (
            [
                "--topic=t",
                "--nsqd-tcp-address=127.0.0.1:1",
                "--get=http://x/%s",
                "--post=http://y/",
            ],
            "use --get or --post not both",
        ),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--get=http://x/"],
            "invalid GET address - must be a printf string",
        ),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--get=http://x/%s%s"],
            "invalid GET address - must be a printf string",
        ),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--post=http://x/", "--sample=1.5"],
            "ERROR: --sample must be between 0.0 and 1.0",
        ),
    ],
)
def test_flag_errors(args: list[str], message: str) -> None:
    run_tool_fatal("nsq_to_http", args, message.encode())


def test_usage_errors_and_version() -> None:
    result = run_tool("nsq_to_http", "--consumer-opt=no_such_option,1")
    assert result.returncode == 2
    assert result.stderr.startswith(b'invalid value "no_such_option,1" for flag -consumer-opt')
    result = run_tool("nsq_to_http", "--version")
    assert result.returncode == 0
    assert result.stdout.startswith(f"nsq_to_http v{NSQ_VERSION} (built w/python".encode())


def test_unreachable_endpoint_is_logged_in_go_words(
    nsqd: DaemonProcess, tool: Callable[..., ToolProcess]
) -> None:
    """A refused request is logged as Go's net/http words it, not as aiohttp's text."""
    topic = unique("refused")
    prepare(nsqd, topic, [b"x"])
    forwarder = start(tool, nsqd, topic, "--post=http://127.0.0.1:1/")
    forwarder.wait_for_stderr(
        b'Handler returned error (Post "http://127.0.0.1:1/": '
        b"dial tcp 127.0.0.1:1: connect: connection refused) for msg "
    )
    stop(forwarder)
