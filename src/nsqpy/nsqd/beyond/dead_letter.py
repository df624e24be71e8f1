"""Server-side max attempts and dead-lettering (nsqpy addition; docs/beyond-go.md).

A channel with ``max_attempts`` N > 0 (``--max-attempts`` or ``POST /channel/config``) does not
deliver a message an (N+1)th time: when a REQ or an in-flight timeout would requeue a message
already delivered N times, it is published to the topic ``<topic><suffix>`` instead and
finished on its channel.

The dead-letter message keeps its body byte for byte; nothing is wrapped around it. Its history
(original topic, channel, ID, publish timestamp, attempts, when it was dead-lettered) is
recorded under the dead-letter message's own ID, readable with ``GET /dead_letter?id=<id>``
(or the latest ones with ``?topic=<dead-letter topic>``) and kept in
``nsqpy.dead_letters.jsonl`` in the data path, which Go ignores.

Order matters for crash safety: the dead-letter publish happens (a disk write returns, or the
message is in memory as any publish) before the original leaves the channel, all in one
event-loop step; a failed publish leaves the message requeued as usual. A crash can at worst
deliver the original again, which is dead-lettered again: at least once, never lost.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from ...protocol.names import EPHEMERAL_SUFFIX, is_ephemeral, is_valid_name
from ..errors import BackendWriteError
from ..metadata import read_journal, write_atomically
from ..topic import TopicError

if TYPE_CHECKING:
    from ..channel import Channel
    from ..message import Message
    from ..nsqd import NSQD
    from ..options import Options

CONFIG_FILE = "nsqpy.channel_config.json"
HISTORY_FILE = "nsqpy.dead_letters.jsonl"
#: History records kept (in memory and, after compaction at start-up, on disk).
HISTORY_LIMIT = 10000
_SUFFIX = re.compile(r"[.a-zA-Z0-9_-]{1,63}")


def valid_suffix(suffix: str) -> bool:
    return _SUFFIX.fullmatch(suffix) is not None


def dead_letter_topic(topic: str, suffix: str) -> str | None:
    """``<topic><suffix>``; for an ephemeral topic the suffix goes before ``#ephemeral``.
    None when the result would not be a valid topic name (too long)."""
    if is_ephemeral(topic):
        name = topic[: -len(EPHEMERAL_SUFFIX)] + suffix + EPHEMERAL_SUFFIX
    else:
        name = topic + suffix
    return name if is_valid_name(name) else None


def validate_beyond_options(opts: Options) -> None:
    """Start-up checks of the nsqpy-only options (ValueError: nsqd refuses to start)."""
    if not 0 <= opts.max_attempts <= 65535:
        raise ValueError("--max-attempts must be [0,65535]")
    if not valid_suffix(opts.dead_letter_topic_suffix):
        raise ValueError("--dead-letter-topic-suffix must be 1-63 characters of [.a-zA-Z0-9_-]")
    if opts.drain_timeout < 0:
        raise ValueError("--drain-timeout must not be negative")


class DeadLetters:
    """Per-channel settings, the move to the dead-letter topic, and the history."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        # (topic, channel) -> {"max_attempts": int, "dead_letter_topic_suffix": str}
        self.overrides: dict[tuple[str, str], dict[str, Any]] = {}
        self.history: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._history_file: Any = None

    # ------------------------------------------------------------------ settings

    def load(self) -> None:
        """Read the per-channel settings and the history (at start-up, before channels)."""
        path = os.path.join(self.nsqd.data_path, CONFIG_FILE)
        try:
            with open(path, "rb") as handle:
                data = json.loads(handle.read())
            for entry in data.get("channels", []):
                key = (entry["topic"], entry["channel"])
                self.overrides[key] = {
                    "max_attempts": int(entry["max_attempts"]),
                    "dead_letter_topic_suffix": str(entry["dead_letter_topic_suffix"]),
                }
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.nsqd.logger.error(f"ignoring {CONFIG_FILE}: {exc}")
        self._load_history()

    def apply(self, channel: Channel) -> None:
        """Give a new channel its settings: its override, else the command-line ones."""
        override = self.overrides.get((channel.topic.name, channel.name))
        opts = self.nsqd.options
        if override is None:
            channel.max_attempts = opts.max_attempts
            channel.dead_letter_suffix = opts.dead_letter_topic_suffix
        else:
            channel.max_attempts = override["max_attempts"]
            channel.dead_letter_suffix = override["dead_letter_topic_suffix"]

    def configure(self, channel: Channel, max_attempts: int, suffix: str) -> None:
        key = (channel.topic.name, channel.name)
        self.overrides[key] = {"max_attempts": max_attempts, "dead_letter_topic_suffix": suffix}
        self.apply(channel)
        self._save_overrides()

    def forget(self, topic: str, channel: str | None = None) -> None:
        """A deleted channel (or topic) loses its settings."""
        doomed = [k for k in self.overrides if k[0] == topic and channel in (None, k[1])]
        for key in doomed:
            del self.overrides[key]
        if doomed:
            self._save_overrides()

    def _save_overrides(self) -> None:
        entries = [
            {"topic": topic, "channel": channel, **settings}
            for (topic, channel), settings in sorted(self.overrides.items())
        ]
        data = json.dumps({"version": 1, "channels": entries}).encode()
        try:
            write_atomically(os.path.join(self.nsqd.data_path, CONFIG_FILE), data)
        except OSError as exc:
            self.nsqd.logger.error(f"failed to persist {CONFIG_FILE} - {exc}")

    @staticmethod
    def settings(channel: Channel) -> dict[str, Any]:
        return {
            "max_attempts": channel.max_attempts,
            "dead_letter_topic_suffix": channel.dead_letter_suffix,
            "dead_letter_count": channel.dead_letter_count,
        }

    # ------------------------------------------------------------------ the move

    def divert(self, channel: Channel, msg: Message) -> bool:
        """Publish ``msg`` to the channel's dead-letter topic; True if it is there (the caller
        then drops it from the channel), False to requeue it as usual."""
        name = dead_letter_topic(channel.topic.name, channel.dead_letter_suffix)
        if name is None:
            self.nsqd.logger.error(
                f"CHANNEL({channel.name}): dead-letter topic name for {channel.topic.name!r} "
                "is not valid; requeueing"
            )
            return False
        topic = self.nsqd.get_topic(name)
        dead = topic.new_message(msg.body)
        try:
            topic.put_message(dead)
        except (TopicError, BackendWriteError) as exc:
            self.nsqd.logger.error(
                f"CHANNEL({channel.name}): failed to dead-letter to {name} - {exc}; requeueing"
            )
            return False
        channel.dead_letter_count += 1
        self._record(
            {
                "id": dead.id.decode("ascii", "replace"),
                "topic": name,
                "original_topic": channel.topic.name,
                "original_channel": channel.name,
                "original_id": msg.id.decode("ascii", "replace"),
                "original_timestamp": msg.timestamp,
                "attempts": msg.attempts,
                "dead_lettered_at": time.time_ns(),
            }
        )
        return True

    # ------------------------------------------------------------------ history

    def _record(self, entry: dict[str, Any]) -> None:
        self._remember(entry)
        try:
            if self._history_file is None:
                path = os.path.join(self.nsqd.data_path, HISTORY_FILE)
                self._history_file = open(path, "a", encoding="utf-8")  # noqa: SIM115
            self._history_file.write(json.dumps(entry) + "\n")
            self._history_file.flush()
        except OSError as exc:
            self.nsqd.logger.error(f"failed to record dead-letter history - {exc}")

    def _remember(self, entry: dict[str, Any]) -> None:
        self.history[entry["id"]] = entry
        while len(self.history) > HISTORY_LIMIT:
            self.history.popitem(last=False)

    def _load_history(self) -> None:
        path = os.path.join(self.nsqd.data_path, HISTORY_FILE)
        entries, line_count = read_journal(path, self.nsqd.logger)
        for entry in entries:
            try:
                self._remember(entry)
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash, or a field of the wrong kind
        if line_count > 2 * HISTORY_LIMIT:  # compact: keep what is remembered
            data = "".join(json.dumps(e) + "\n" for e in self.history.values()).encode()
            try:
                write_atomically(path, data)
            except OSError as exc:
                self.nsqd.logger.error(f"failed to compact {HISTORY_FILE} - {exc}")

    def lookup(self, msg_id: str) -> dict[str, Any] | None:
        return self.history.get(msg_id)

    def latest(self, topic: str, limit: int) -> list[dict[str, Any]]:
        found = [e for e in reversed(self.history.values()) if e["topic"] == topic]
        return found[:limit]

    def close(self) -> None:
        if self._history_file is not None:
            self._history_file.close()
            self._history_file = None
