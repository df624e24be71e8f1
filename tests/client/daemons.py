"""Helpers for client tests against real nsqpy daemons."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable
from typing import Any

from nsqpy.testing import DaemonProcess


def tcp(daemon: DaemonProcess) -> str:
    host, port = daemon.tcp_address
    return f"{host}:{port}"


def stats(nsqd: DaemonProcess, topic: str | None = None) -> dict[str, Any]:
    url = f"{nsqd.http_url}/stats?format=json&include_mem=false"
    if topic:
        url += f"&topic={topic}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        result: dict[str, Any] = json.loads(resp.read())
    return result


def channel_stats(nsqd: DaemonProcess, topic: str, channel: str) -> dict[str, Any] | None:
    for t in stats(nsqd, topic).get("topics") or ():
        if t["topic_name"] != topic:
            continue
        for c in t["channels"]:
            if c["channel_name"] == channel:
                result: dict[str, Any] = c
                return result
    return None


def in_flight(nsqd: DaemonProcess, topic: str, channel: str) -> int:
    c = channel_stats(nsqd, topic, channel)
    return 0 if c is None else int(c["in_flight_count"])


async def in_thread(func: Callable[..., Any], *args: Any) -> Any:
    """Run blocking HTTP calls off the event loop that the consumer runs on."""
    return await asyncio.get_running_loop().run_in_executor(None, func, *args)
