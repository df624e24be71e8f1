"""nsq_pubsub as a process between real nsqd/nsqlookupd processes and HTTP clients."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sseclient

from nsqpy.client import Producer
from nsqpy.testing import DaemonProcess, start_nsqd, start_nsqlookupd

from ..raw_v2 import wait_until_async

TOPIC = "pubsub_topic"


class PubSub:
    """One nsq_pubsub process on a free port; its stderr is collected."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nsqpy.apps.nsq_pubsub", "--http-address=127.0.0.1:0", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._listening = threading.Event()
        self.base = ""
        threading.Thread(target=self._pump, daemon=True).start()
        if not self._listening.wait(20):
            self.stop()
            raise AssertionError(f"nsq_pubsub did not start:\n{self.log}")

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            match = re.search(r"listening on (\S+)", line)
            if match and not self.base:
                self.base = "http://" + match.group(1)
                self._listening.set()
        self._listening.set()

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(10)


def tcp(daemon: DaemonProcess) -> str:
    host, port = daemon.tcp_address
    return f"{host}:{port}"


def channel_stats(nsqd: DaemonProcess, topic: str, channel: str) -> dict[str, Any]:
    url = f"{nsqd.http_url}/stats?format=json&topic={topic}&channel={channel}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        stats = json.loads(resp.read())
    for t in stats.get("topics") or ():
        for c in t["channels"]:
            if c["channel_name"] == channel:
                result: dict[str, Any] = c
                return result
    return {}


def drained(nsqd: DaemonProcess, channel: str) -> bool:
    """Every message of the channel FINished: none queued, none in flight."""
    stats = channel_stats(nsqd, TOPIC, channel)
    return stats.get("depth") == 0 and stats.get("in_flight_count") == 0


@pytest.fixture
def nsqd(tmp_path: Path) -> Iterator[DaemonProcess]:
    with start_nsqd(tmp_path, "--max-msg-size=2097152") as daemon:
        yield daemon


@pytest.fixture
def pubsub(nsqd: DaemonProcess) -> Iterator[PubSub]:
    tool = PubSub(f"--nsqd-tcp-address={tcp(nsqd)}", "--heartbeat-interval=300ms")
    yield tool
    assert tool.stop() == 0, tool.log
    assert "Traceback" not in tool.log


async def read_line(resp: aiohttp.ClientResponse, timeout: float = 20.0) -> bytes:
    return await asyncio.wait_for(resp.content.readline(), timeout)


async def test_streams_published_messages_with_heartbeats(
    nsqd: DaemonProcess, pubsub: PubSub
) -> None:
    bodies = [f"message {i} ünïcode".encode() for i in range(20)]
    async with Producer(tcp(nsqd)) as producer:
        await producer.multi_publish(TOPIC, bodies)
    got: list[bytes] = []
    heartbeats: list[int] = []
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{pubsub.base}/sub?topic={TOPIC}&channel=web") as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
        while len(got) < len(bodies) or len(heartbeats) < 2:
            line = await read_line(resp)
            assert line.endswith(b"\n")
            if line.startswith(b'{"_heartbeat_":'):
                heartbeats.append(json.loads(line)["_heartbeat_"])
            else:
                got.append(line[:-1])
    assert sorted(got) == sorted(bodies)
    assert all(abs(beat - time.time()) < 60 for beat in heartbeats)
    # everything written was FINished: nothing left in flight or queued
    await wait_until_async(lambda: drained(nsqd, "web"), timeout=30.0, what="all messages finished")


async def test_pub_ping_and_stats(nsqd: DaemonProcess, pubsub: PubSub) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{pubsub.base}/ping") as resp:
            assert (resp.status, await resp.text()) == (200, "OK")
        async with session.post(f"{pubsub.base}/pub?topic={TOPIC}", data=b"via pubsub") as resp:
            assert (resp.status, await resp.text()) == (200, "OK")
        async with session.post(f"{pubsub.base}/pub", data=b"x") as resp:
            assert (resp.status, await resp.text()) == (400, "MISSING_ARG_TOPIC\n")
        async with session.post(f"{pubsub.base}/pub?topic=bad!", data=b"x") as resp:
            assert (resp.status, await resp.text()) == (400, "INVALID_ARG_TOPIC\n")
        async with session.post(f"{pubsub.base}/pub?topic={TOPIC}", data=b"") as resp:
            assert (resp.status, await resp.text()) == (400, "MSG_EMPTY\n")
        async with session.get(f"{pubsub.base}/sub?topic={TOPIC}") as resp:
            assert (resp.status, await resp.text()) == (400, "MISSING_ARG_CHANNEL\n")
        url = f"{pubsub.base}/sub?topic={TOPIC}&channel=c&max_in_flight=0"
        async with session.get(url) as resp:
            assert (resp.status, await resp.text()) == (400, "INVALID_ARG_MAX_IN_FLIGHT\n")

        async with session.get(f"{pubsub.base}/sub?topic={TOPIC}&channel=stats") as stream:
            assert await read_line(stream) == b"via pubsub\n"
            async with session.get(f"{pubsub.base}/stats") as resp:
                text = await resp.text()
    # the old Go tool's format
    lines = text.split("\n")
    assert lines[0] == "Total Messages: 1"
    assert lines[1] == ""
    pattern = (
        rf"\[127\.0\.0\.1:\d+\] \[{TOPIC} : stats\] msgs: 1        fin: 1        "
        r"re-q: 0        connected: \d+s"
    )
    assert re.fullmatch(pattern, lines[2]), text


async def test_server_sent_events(nsqd: DaemonProcess, pubsub: PubSub) -> None:
    """A spec-following SSE client (sseclient-py) reads messages and heartbeat events."""
    bodies = [b"plain", b"two\nlines", "ünïcode".encode()]
    async with Producer(tcp(nsqd)) as producer:
        for body in bodies:
            await producer.publish(TOPIC, body)

    def read_events() -> tuple[list[Any], str]:
        request = urllib.request.Request(
            f"{pubsub.base}/sub?topic={TOPIC}&channel=sse",
            headers={"Accept": "text/event-stream"},
        )
        events = []
        with urllib.request.urlopen(request, timeout=20) as resp:
            content_type = resp.headers["Content-Type"]
            chunks = iter(lambda: resp.read1(65536), b"")
            for event in sseclient.SSEClient(chunks).events():
                events.append(event)
                messages = [e for e in events if e.event == "message"]
                beats = [e for e in events if e.event == "heartbeat"]
                if len(messages) == len(bodies) and beats:
                    break
        return events, content_type

    events, content_type = await asyncio.to_thread(read_events)
    assert content_type == "text/event-stream"
    messages = [e for e in events if e.event == "message"]
    assert sorted(e.data for e in messages) == sorted(b.decode() for b in bodies)
    assert all(re.fullmatch(r"[0-9a-f]{16}", e.id) for e in messages)
    beat = next(e for e in events if e.event == "heartbeat")
    assert abs(json.loads(beat.data)["_heartbeat_"] - time.time()) < 60


async def test_two_subscribers_share_a_channel(nsqd: DaemonProcess, pubsub: PubSub) -> None:
    bodies = [f"shared {i}".encode() for i in range(40)]
    url = f"{pubsub.base}/sub?topic={TOPIC}&channel=shared&max_in_flight=1"
    got: list[bytes] = []
    async with (
        aiohttp.ClientSession() as session,
        session.get(url) as first,
        session.get(url) as second,
    ):
        await wait_until_async(
            lambda: pubsub.log.count("connected and subscribed") >= 2,
            timeout=30.0,
            what="subscribed",
        )
        async with Producer(tcp(nsqd)) as producer:
            await producer.multi_publish(TOPIC, bodies)
        per_client = [0, 0]

        async def drain(index: int, resp: aiohttp.ClientResponse) -> None:
            while len(got) < len(bodies):
                try:
                    line = await asyncio.wait_for(resp.content.readline(), 0.5)
                except TimeoutError:
                    continue
                if not line.startswith(b'{"_heartbeat_"'):
                    got.append(line[:-1])
                    per_client[index] += 1

        await asyncio.wait_for(asyncio.gather(drain(0, first), drain(1, second)), 30)
    assert sorted(got) == sorted(bodies)
    assert all(per_client), per_client  # NSQ spreads one channel over its subscribers


async def stalled_subscriber(
    nsqd: DaemonProcess, pubsub: PubSub, channel: str, count: int
) -> tuple[list[bytes], socket.socket]:
    """``count`` big messages, all in flight to a subscriber that reads nothing (a raw socket
    with a tiny receive window), most of them still waiting to be written to it."""
    bodies = [b"%04d-" % i + b"x" * 256 * 1024 for i in range(count)]  # 10 MiB: > socket buffers
    async with Producer(tcp(nsqd)) as producer:
        for body in bodies:
            await producer.publish(TOPIC, body)
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = pubsub.base.removeprefix("http://").rsplit(":", 1)
    stalled.connect((host, int(port)))
    query = f"topic={TOPIC}&channel={channel}&max_in_flight={count}"
    stalled.sendall(f"GET /sub?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert stalled.recv(12) == b"HTTP/1.1 200"
    await wait_until_async(
        lambda: (
            channel_stats(nsqd, TOPIC, channel).get("depth") == 0
            and channel_stats(nsqd, TOPIC, channel).get("in_flight_count", 0) >= count // 2
        ),
        timeout=30.0,
        what="messages stuck in flight",
    )
    return bodies, stalled


async def test_messages_of_a_departed_subscriber_go_to_another(
    nsqd: DaemonProcess, pubsub: PubSub
) -> None:
    """A subscriber that stops reading and hangs up: what nsq_pubsub could not write to it is
    REQueued and streamed to the next subscriber of the channel."""
    count = 40
    bodies, stalled = await stalled_subscriber(nsqd, pubsub, "ch", count)
    stalled.close()
    await wait_until_async(
        lambda: channel_stats(nsqd, TOPIC, "ch").get("in_flight_count") == 0,
        timeout=30.0,
        what="answered",
    )
    stats = channel_stats(nsqd, TOPIC, "ch")
    requeued = stats["depth"]  # back in the queue; the rest was written to the stalled client
    assert requeued >= count // 2  # ~4 MiB fits in the socket buffers at most
    assert stats["requeue_count"] >= requeued

    got: list[bytes] = []
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{pubsub.base}/sub?topic={TOPIC}&channel=ch") as resp,
    ):
        while len(got) < requeued:
            line = await read_line(resp)
            if not line.startswith(b'{"_heartbeat_"'):
                got.append(line[:-1])
    assert len(set(got)) == requeued
    assert set(got) <= set(bodies)
    await wait_until_async(lambda: drained(nsqd, "ch"), timeout=30.0, what="all finished")


async def test_lookupd_discovery_for_sub_and_pub(tmp_path: Path) -> None:
    with (
        start_nsqlookupd() as lookupd,
        start_nsqd(tmp_path, f"--lookupd-tcp-address=127.0.0.1:{lookupd.tcp_port}") as nsqd,
    ):
        lookupd_http = "{}:{}".format(*lookupd.http_address)
        tool = PubSub(
            f"--lookupd-http-address={lookupd_http}",
            "--consumer-opt=lookupd_poll_interval,200ms",
        )
        try:
            async with aiohttp.ClientSession() as session:
                # nsqlookupd knows the nsqd (from /nodes) before it knows any topic
                await wait_until_async(
                    lambda: (
                        b"producers"
                        in urllib.request.urlopen(f"http://{lookupd_http}/nodes", timeout=5).read()
                        and b'"tcp_port"'
                        in urllib.request.urlopen(f"http://{lookupd_http}/nodes", timeout=5).read()
                    ),
                    timeout=30.0,
                    what="nsqd registered",
                )
                async with session.post(f"{tool.base}/pub?topic={TOPIC}", data=b"found") as r:
                    assert (r.status, await r.text()) == (200, "OK")
                url = f"{tool.base}/sub?topic={TOPIC}&channel=lookup"
                async with session.get(url) as resp:
                    assert await read_line(resp) == b"found\n"
            assert channel_stats(nsqd, TOPIC, "lookup")["message_count"] == 1
        finally:
            assert tool.stop() == 0, tool.log


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--nsqd-tcp-address or --lookupd-http-address required."),
        (
            ["--nsqd-tcp-address=127.0.0.1:1", "--lookupd-http-address=127.0.0.1:2"],
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (["--nsqd-tcp-address=127.0.0.1:1", "--max-in-flight=0"], "--max-in-flight must be > 0"),
    ],
)
def test_flag_errors(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nsqpy.apps.nsq_pubsub", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert re.fullmatch(rf"\d{{4}}/\d\d/\d\d \d\d:\d\d:\d\d {re.escape(message)}\n", result.stderr)


def test_usage_errors_and_version() -> None:
    run = [sys.executable, "-m", "nsqpy.apps.nsq_pubsub"]
    result = subprocess.run([*run, "--bogus"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith("flag provided but not defined: -bogus\nUsage of nsq_pubsub:")
    assert "-heartbeat-interval value" in result.stderr
    result = subprocess.run([*run, "--version"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert result.stdout.startswith("nsq_pubsub v1.3.0 (built w/python")


def test_listen_failure_is_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "nsqpy.apps.nsq_pubsub",
                f"--http-address=127.0.0.1:{port}",
                "--nsqd-tcp-address=127.0.0.1:1",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"FATAL: listen (127.0.0.1:{port}) failed" in result.stderr
    assert result.stderr.count("\n") == 1


async def test_cors_allow_origin_lets_other_origins_subscribe(nsqd: DaemonProcess) -> None:
    """Off by default; with --cors-allow-origin every response carries the header a browser
    needs to open an EventSource from another origin (checked by hand with headless
    Chromium: a file:// page's EventSource received messages and heartbeat events)."""
    plain = PubSub(f"--nsqd-tcp-address={tcp(nsqd)}")
    shared = PubSub(f"--nsqd-tcp-address={tcp(nsqd)}", "--cors-allow-origin=*")
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{plain.base}/ping") as resp:
                assert "Access-Control-Allow-Origin" not in resp.headers
            url = f"{shared.base}/sub?topic={TOPIC}&channel=cors"
            headers = {"Accept": "text/event-stream", "Origin": "http://elsewhere.example"}
            async with session.get(url, headers=headers) as resp:
                assert resp.headers["Access-Control-Allow-Origin"] == "*"
                assert resp.headers["Content-Type"] == "text/event-stream"
    finally:
        assert plain.stop() == 0 and shared.stop() == 0


async def test_sigterm_requeues_what_a_stalled_subscriber_holds(nsqd: DaemonProcess) -> None:
    """Stopping does not wait for a subscriber that reads nothing: after a short grace its
    connection is dropped and its messages are REQueued at once (not left to nsqd's timeout)."""
    tool = PubSub(f"--nsqd-tcp-address={tcp(nsqd)}")
    count = 40
    _, stalled = await stalled_subscriber(nsqd, tool, "held", count)
    try:
        started = time.monotonic()
        assert tool.stop() == 0, tool.log
        assert time.monotonic() - started < 15
        stats = channel_stats(nsqd, TOPIC, "held")
        assert stats["in_flight_count"] == 0
        assert stats["depth"] >= count // 2 and stats["requeue_count"] >= stats["depth"]
        assert "Traceback" not in tool.log
    finally:
        stalled.close()
