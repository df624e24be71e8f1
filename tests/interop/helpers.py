"""Small helpers shared by the interop tests: names, /stats lookups, polling."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from nsqpy.testing import DaemonProcess

from ..raw_v2 import wait_for_async

T = TypeVar("T")


def tcp_address(nsqd: DaemonProcess) -> str:
    host, port = nsqd.tcp_address
    return f"{host}:{port}"


def http_post(nsqd: DaemonProcess, path: str, body: bytes = b"", **params: str) -> bytes:
    """POST to nsqd's HTTP API and return the body; any non-200 answer raises."""
    query = urllib.parse.urlencode(params)
    request = urllib.request.Request(f"{nsqd.http_url}{path}?{query}", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        data: bytes = response.read()
    return data


def stats(nsqd: DaemonProcess, topic: str) -> dict[str, Any]:
    query = urllib.parse.urlencode({"format": "json", "topic": topic})
    with urllib.request.urlopen(f"{nsqd.http_url}/stats?{query}", timeout=5) as response:
        result: dict[str, Any] = json.loads(response.read())
    return result


def topic_stats(nsqd: DaemonProcess, topic: str) -> dict[str, Any]:
    for entry in stats(nsqd, topic).get("topics") or ():
        if entry["topic_name"] == topic:
            found: dict[str, Any] = entry
            return found
    raise AssertionError(f"topic {topic} not in /stats")


def channel_stats(nsqd: DaemonProcess, topic: str, channel: str) -> dict[str, Any]:
    for entry in topic_stats(nsqd, topic).get("channels") or ():
        if entry["channel_name"] == channel:
            found: dict[str, Any] = entry
            return found
    raise AssertionError(f"channel {topic}/{channel} not in /stats")


def only_client(channel: dict[str, Any]) -> dict[str, Any]:
    clients = channel.get("clients") or []
    assert len(clients) == 1, clients
    client: dict[str, Any] = clients[0]
    return client


def subset(expected: dict[str, Any]) -> Callable[[dict[str, Any]], bool]:
    """A ``done`` predicate: every key of ``expected`` has that value."""
    return lambda actual: all(actual.get(key) == value for key, value in expected.items())


def channel_view(nsqd: DaemonProcess, topic: str, channel: str) -> dict[str, Any]:
    """The channel's /stats entry ({} while it does not exist) plus ``clients_finish_count``.

    Go's channel stats count no FINs (only each client does), so the sum over the channel's
    connected clients stands in for "messages finished on this channel".
    """
    try:
        view = dict(channel_stats(nsqd, topic, channel))
    except AssertionError:
        return {}
    view["clients_finish_count"] = sum(c["finish_count"] for c in view.get("clients") or ())
    return view


async def wait_channel(
    nsqd: DaemonProcess, topic: str, channel: str, timeout: float = 5.0, **expected: Any
) -> dict[str, Any]:
    """Wait until the channel's :func:`channel_view` has all the ``expected`` values."""
    return await wait_for_async(
        lambda: channel_view(nsqd, topic, channel),
        subset(expected),
        timeout,
        f"{topic}/{channel} stats {expected}",
    )


async def ansq_read(reader: Any, count: int) -> list[bytes]:
    """FIN and collect ``count`` message bodies from an ansq Reader."""
    bodies: list[bytes] = []
    async for message in reader.messages():
        bodies.append(message.body)
        await message.fin()
        if len(bodies) == count:
            break
    return bodies


def lookup_tcp_ports(nsqlookupd: DaemonProcess, topic: str) -> list[int]:
    """The TCP ports of the producers nsqlookupd lists for ``topic`` ([] while unknown)."""
    query = urllib.parse.urlencode({"topic": topic})
    try:
        with urllib.request.urlopen(f"{nsqlookupd.http_url}/lookup?{query}", timeout=5) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as err:
        assert err.code == 404, err  # TOPIC_NOT_FOUND until an nsqd registers it
        return []
    return sorted(producer["tcp_port"] for producer in answer["producers"])
