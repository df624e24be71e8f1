"""What a channel needs of a consumer (Go: the ``Consumer`` interface atop nsqd/channel.go).

A :class:`~nsqpy.nsqd.channel.Channel` knows its subscribers only through :class:`Consumer`:
it never reads a connection's buffers, protocol state, TLS or compression. ClientV2 (one TCP
connection speaking the V2 protocol) satisfies it structurally; a test can hand a channel a
plain object with the same few members and see exactly what the channel sent it.

The work is split as in Go. The channel owns each message's delivery state: it chooses a ready
consumer, puts the message in flight (its deadline, its owner) and raises its ``attempts``,
all in one place. The consumer owns the connection: it counts what it was sent, writes the
frames and decides when to flush them. Go's interface has six methods (``UnPause``, ``Pause``,
``Close``, ``TimedOutMessage``, ``Stats``, ``Empty``) because there each consumer's own
goroutine pulls from the channel; here the channel pushes to its consumers on the event loop,
so it also reads their readiness and hands them messages:

- readiness, read per delivery: ``ready_count`` (the consumer's RDY), ``in_flight_count``
  (what it holds unfinished), ``sample_rate`` (IDENTIFY's percentage, 0 for all) and
  ``msg_timeout`` (seconds before an unfinished message is requeued);
- delivery: :meth:`Consumer.send_message` for one message, :meth:`Consumer.send_messages` for
  a window of them, then :meth:`Consumer.after_deliveries` once per batch (Go's message pump
  deciding to flush);
- Go's callbacks: :meth:`Consumer.timed_out_message` (``TimedOutMessage``),
  :meth:`Consumer.empty_in_flight` (``Empty``), :meth:`Consumer.close` (``Close``),
  :meth:`Consumer.stats` (``Stats``); pausing needs no call, as a consumer reads the channel's
  ``paused`` itself;
- identity: ``id`` (unique per nsqd, the key among the channel's consumers) and ``client_id``
  (what the consumer called itself, for /stats and message inspection).

The readiness members are declared read-only, as the channel never writes them, and must be
plain attributes in an implementation, not computed properties: the channel reads them once
per delivered message, and an attribute read costs no Python call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .message import Message


class Consumer(Protocol):
    @property
    def id(self) -> int:
        """Unique among nsqd's consumers: the key in ``Channel.clients``."""

    @property
    def client_id(self) -> str:
        """The name the consumer gave itself (IDENTIFY's ``client_id``)."""

    @property
    def ready_count(self) -> int:
        """How many messages it may hold in flight at once (its last RDY)."""

    @property
    def in_flight_count(self) -> int:
        """How many of its messages are in flight: raised by each send, lowered by the
        consumer itself on FIN and REQ, and by :meth:`timed_out_message`."""

    @property
    def sample_rate(self) -> int:
        """1-99: the percentage of messages it is sent (the rest are dropped); 0: all."""

    @property
    def msg_timeout(self) -> float:
        """Seconds a message may stay in flight to it before the channel requeues it."""

    def send_message(self, msg: Message) -> None:
        """Take ``msg``, which the channel has just put in flight to this consumer with its
        attempts raised: count it and buffer its frame."""

    def send_messages(self, frames: list[bytes], count: int, size: int) -> None:
        """Take a window of ``count`` messages the channel has just put in flight to this
        consumer: ``frames`` holds their message frames, packed by the channel in the same
        loop that put them in flight (``size`` bytes in all)."""

    def after_deliveries(self) -> None:
        """The channel is done handing messages over for now: flush if it is time."""

    def timed_out_message(self) -> None:
        """One of its messages timed out and was taken back (Go's ``TimedOutMessage``)."""

    def empty_in_flight(self) -> None:
        """The channel was emptied: none of its messages is in flight any more (Go's
        ``Empty``)."""

    def close(self) -> None:
        """The channel is going away (deleted, or nsqd is exiting): disconnect."""

    def stats(self, topic_filter: str = "") -> dict[str, Any]:
        """Its entry in the channel's ``clients`` of /stats (Go's ``Stats``)."""
