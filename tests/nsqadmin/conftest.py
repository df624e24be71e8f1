"""Fixtures for nsqadmin tests (API and browser): a real cluster and an nsqadmin launcher.

    def test_x(cluster, start_admin):
        topic = cluster.new_topic()            # a fresh topic name
        cluster.pub(topic, b"hi", node=0)       # HTTP /pub on nsqd #0
        cluster.wait_registered(topic, 1)       # until lookupd lists 1 producer
        admin = start_admin()                   # lookupd mode; start_admin(mode="nsqd") too
        status, body = api(admin, "GET", f"/api/topics/{topic}")

``cluster`` (module scope): one nsqlookupd and two nsqd registered with it. Tests share it, so
each uses its own topic names (``cluster.new_topic()``). ``start_admin`` starts nsqadmin
processes (``--poll-interval=200ms`` unless given) and stops them after the test.

JSON beyond Go's that the UI can use: ``/api/overview``, ``/api/history``, ``unreachable`` on
``/api/topics/:t``, ``/api/topics/:t/:c``, ``/api/nodes`` and ``/api/nodes/:n``,
``tombstoned`` on each per-node entry of a topic/channel, ``total_topics`` on a node, and
``channel_depth`` (the topic's channels' depth) on overview rows and topic history points,
``history`` (compact sparkline points) on overview rows, ``max_attempts``/``dead_letter_count``
on channels whose nsqd reports them, and ``/api/topics/:t/:c/inspect`` (test_inspect.py).
A topic known only to lookupd answers 200 with ``"nodes": null`` (Go: 502).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from nsqpy.testing import DaemonProcess, start_nsqadmin, start_nsqd, start_nsqlookupd

from ..raw_v2 import wait_until

_names = itertools.count()


def http(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 20.0,
) -> tuple[int, bytes, dict[str, str]]:
    """One HTTP request; (status, body, headers) for any status."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def api(
    admin: DaemonProcess,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """Call nsqadmin; the status and the decoded JSON (or text when it is not JSON)."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    status, raw, _ = http(admin.http_url + path, method, data, headers)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


class Cluster:
    """One nsqlookupd and two nsqd registered with it."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.lookupd = start_nsqlookupd()
        self.nsqds: list[DaemonProcess] = []
        try:
            for i in range(2):
                path = data_dir / f"nsqd{i}"
                path.mkdir()
                self.nsqds.append(
                    start_nsqd(path, f"--lookupd-tcp-address=127.0.0.1:{self.lookupd.tcp_port}")
                )
            wait_until(
                lambda: len(self.lookupd_json("/nodes")["producers"]) == 2,
                what="nodes",
                timeout=20.0,
            )
        except BaseException:
            self.stop()
            raise

    @property
    def lookupd_address(self) -> str:
        return f"127.0.0.1:{self.lookupd.http_port}"

    def nsqd_address(self, node: int) -> str:
        """``broadcast_address:http_port``: the name nsqadmin gives the node."""
        return f"127.0.0.1:{self.nsqds[node].http_port}"

    @property
    def nsqd_addresses(self) -> list[str]:
        return [self.nsqd_address(i) for i in range(len(self.nsqds))]

    def new_topic(self, prefix: str = "t") -> str:
        return f"{prefix}{next(_names)}-{int(time.time() * 1000) % 100000}"

    def lookupd_json(self, path: str) -> Any:
        status, body, _ = http(self.lookupd.http_url + path)
        return json.loads(body) if status == 200 else None

    def nsqd_post(self, node: int, path: str, body: bytes | None = None) -> int:
        status, _, _ = http(self.nsqds[node].http_url + path, "POST", body or b"")
        return status

    def pub(self, topic: str, body: bytes = b"msg", node: int = 0, count: int = 1) -> None:
        """Publish ``count`` messages (one HTTP /mpub) to ``topic`` on nsqd ``node``."""
        data = b"\n".join([body] * count)
        assert self.nsqd_post(node, f"/mpub?topic={topic}", data) == 200

    def create_channel(self, topic: str, channel: str, node: int = 0) -> None:
        """Create ``topic`` (if need be) and ``channel`` on nsqd ``node``."""
        assert self.nsqd_post(node, f"/topic/create?topic={topic}") == 200
        assert self.nsqd_post(node, f"/channel/create?topic={topic}&channel={channel}") == 200

    def stats(self, node: int, topic: str = "") -> Any:
        query = f"&topic={topic}" if topic else ""
        status, body, _ = http(f"{self.nsqds[node].http_url}/stats?format=json{query}")
        assert status == 200
        return json.loads(body)

    def topic_stats(self, node: int, topic: str) -> Any:
        for entry in self.stats(node, topic)["topics"] or []:
            if entry["topic_name"] == topic:
                return dict(entry)
        return None

    def channel_stats(self, node: int, topic: str, channel: str) -> Any:
        entry = self.topic_stats(node, topic)
        for found in (entry or {}).get("channels") or []:
            if found["channel_name"] == channel:
                return dict(found)
        return None

    def wait_registered(self, topic: str, producers: int) -> None:
        """Until lookupd's /lookup lists ``producers`` nsqd for ``topic``."""

        def check() -> bool:
            found = self.lookupd_json(f"/lookup?topic={topic}")
            return found is not None and len(found["producers"]) == producers

        wait_until(check, what=f"{topic} registered on {producers} nsqd", timeout=20.0)

    def stop(self) -> None:
        for nsqd in self.nsqds:
            nsqd.stop()
        self.lookupd.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield running
    finally:
        running.stop()


StartAdmin = Callable[..., DaemonProcess]


@pytest.fixture
def start_admin(cluster: Cluster) -> Iterator[StartAdmin]:
    """``start_admin(*flags, mode="lookupd"|"nsqd"|"none")``: nsqadmin in front of ``cluster``."""
    started: list[DaemonProcess] = []

    def start(*flags: str, mode: str = "lookupd") -> DaemonProcess:
        args = list(flags)
        if mode == "lookupd":
            args.append(f"--lookupd-http-address={cluster.lookupd_address}")
        elif mode == "nsqd":
            args += [f"--nsqd-http-address={a}" for a in cluster.nsqd_addresses]
        if not any(a.lstrip("-").startswith("poll-interval") for a in flags):
            args.append("--poll-interval=200ms")
        admin = start_nsqadmin(*args)
        started.append(admin)
        return admin

    yield start
    for admin in started:
        admin.stop()


# --------------------------------------------------------------------------- stand-in servers


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that writes no access log into the test output."""

    def log_message(self, *args: Any) -> None:
        pass


def serve_http(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A threaded HTTP server on a free loopback port, serving from a daemon thread; stop it
    with :func:`stop_http`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop_http(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


class FakeGraphite:
    """A stand-in Graphite: ``/render`` answers what :meth:`render` makes of the query (JSON
    datapoints of ``value``); each request's (path, query, Authorization) is recorded."""

    def __init__(self, value: float = 120.0) -> None:
        self.value = value
        self.requests: list[tuple[str, dict[str, list[str]], str]] = []
        graphite = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                auth = self.headers.get("Authorization", "")
                graphite.requests.append((parts.path, query, auth))
                body, kind = graphite.render(query)
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = serve_http(Handler)

    def render(self, query: dict[str, list[str]]) -> tuple[bytes, str]:
        """The body and Content-Type answering one ``/render`` query."""
        body = json.dumps([{"target": "x", "datapoints": [[self.value, 1]]}])
        return body.encode(), "application/json"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def close(self) -> None:
        stop_http(self.server)
