"""Deferred messages that survive a clean restart with their remaining deferral.

Go writes deferred messages into the disk queue at shutdown and they become due at once after a
restart (nsqio/nsq #1107). We do the same, so a Go nsqd pointed at our data directory still
finds them, and also record them in ``nsqpy.deferred.json``, which Go ignores: per queue, the
messages with their remaining deferral and the queue's positions after the shutdown. At start-up
the file is honoured only if each queue is still exactly where we left it (no other process has
read or written it); those messages go back to the deferred queue and their copies in the disk
queue are skipped when read.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import Any

from ..message import Message
from ..metadata import write_atomically

FILE_NAME = "nsqpy.deferred.json"
FORMAT_VERSION = 1


@dataclass
class DeferredRecord:
    positions: list[int]
    messages: list[tuple[Message, float]]  # (message, remaining seconds)


def encode(records: dict[str, DeferredRecord]) -> bytes:
    queues: dict[str, Any] = {}
    for name, record in records.items():
        queues[name] = {
            "positions": record.positions,
            "messages": [
                {
                    "message": base64.b64encode(msg.encode()).decode(),
                    "remaining_ms": round(remaining * 1000),
                }
                for msg, remaining in record.messages
            ],
        }
    return json.dumps({"version": FORMAT_VERSION, "queues": queues}).encode()


def decode(data: bytes) -> dict[str, DeferredRecord]:
    from ..message import message_from_bytes

    body = json.loads(data)
    if body.get("version") != FORMAT_VERSION:
        raise ValueError(f"unknown version {body.get('version')!r}")
    records = {}
    for name, entry in body["queues"].items():
        messages = [
            (message_from_bytes(base64.b64decode(m["message"])), m["remaining_ms"] / 1000)
            for m in entry["messages"]
        ]
        records[name] = DeferredRecord(list(entry["positions"]), messages)
    return records


def save(data_path: str, records: dict[str, DeferredRecord]) -> None:
    path = os.path.join(data_path, FILE_NAME)
    if records:
        write_atomically(path, encode(records))
    else:
        remove(data_path)


def load(data_path: str) -> dict[str, DeferredRecord]:
    """The saved records, or {} if there are none (ValueError if the file is unreadable)."""
    try:
        with open(os.path.join(data_path, FILE_NAME), "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return {}
    try:
        return decode(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable {FILE_NAME} - {exc}") from None


def remove(data_path: str) -> None:
    try:
        os.remove(os.path.join(data_path, FILE_NAME))
    except FileNotFoundError:
        pass
