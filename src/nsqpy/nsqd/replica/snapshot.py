"""What this node owns, written as stream events: the snapshot a peer gets when it lacks
events the stream no longer keeps (it came back with a blank disk, or fell behind past
--replica-timeout).

Applied to a peer's store after the topics and channels were announced, the events rebuild
the copies the peer should hold: every message still waiting in a topic (a PUT without
channels), and every copy a channel has not finished, whether queued in memory or on disk, in
flight, or deferred (a PUT naming that channel, with the deferral's remaining time). A message
in several channels is put once per channel; the peer's store counts them as one message.

The events are built on the event loop in one pass, so they stand at one position of the
stream: what was finished before is left out, what happens after follows them in the stream.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ...protocol.names import is_ephemeral
from ...protocol.replica import Event, Put
from ..beyond.inspect import peek_channel, peek_topic

if TYPE_CHECKING:
    from ..channel import Channel
    from ..message import Message
    from ..nsqd import NSQD
    from ..topic import Topic

#: everything queued: the peek stops at the end of the queue's data
_ALL = sys.maxsize


def live_events(nsqd: NSQD) -> Iterator[Event]:
    """A PUT for each unfinished message of this node's non-ephemeral topics and channels."""
    now = nsqd.now()
    for topic in list(nsqd.topics.values()):
        if topic.ephemeral:
            continue
        yield from _topic_events(topic)
        for channel in list(topic.channels.values()):
            if not channel.ephemeral and not is_ephemeral(channel.name):
                yield from _channel_events(topic.name, channel, now)


def _topic_events(topic: Topic) -> Iterator[Event]:
    for msg in peek_topic(topic, _ALL):
        defer_ms = math.ceil(msg.deferred * 1000) if msg.deferred > 0 else 0
        yield Put(topic.name, msg.id, msg.timestamp, msg.attempts, msg.body, None, defer_ms)


def _channel_events(topic: str, channel: Channel, now: float) -> Iterator[Event]:
    names = (channel.name,)
    waiting: Iterable[Message] = peek_channel(channel, _ALL)
    for msg in (*waiting, *list(channel.in_flight.values())):
        yield Put(topic, msg.id, msg.timestamp, msg.attempts, msg.body, names)
    for msg in list(channel.deferred.values()):
        # rounded up: the copy never becomes due before the deferral it stands for
        defer_ms = max(1, math.ceil((msg.pri - now) * 1000))
        yield Put(topic, msg.id, msg.timestamp, msg.attempts, msg.body, names, defer_ms)
