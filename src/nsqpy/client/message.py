"""The message a consumer's handler receives, with the verbs that answer nsqd."""

from __future__ import annotations

from typing import Protocol


class Responder(Protocol):
    """What a message needs from the connection that delivered it."""

    def finish_message(self, message: Message) -> None: ...

    def requeue_message(self, message: Message, delay: float | None, backoff: bool) -> None: ...

    def touch_message(self, message: Message) -> None: ...


class Message:
    """One delivery of a message.

    The consumer answers nsqd for the handler: FIN when it returns, REQ when it raises or
    returns ``False``. A handler may answer itself with :meth:`finish`, :meth:`requeue` and
    :meth:`touch`, or call :meth:`disable_auto_response` to keep the message and answer later
    (from another task, a batch, a thread-safe callback...). Only the first FIN or REQ counts.
    """

    __slots__ = (
        "_auto_response",
        "_responder",
        "attempts",
        "body",
        "id",
        "nsqd_address",
        "responded",
        "timestamp",
    )

    def __init__(
        self,
        msg_id: bytes,
        body: bytes,
        timestamp: int,
        attempts: int,
        nsqd_address: str,
        responder: Responder,
    ) -> None:
        #: 16 ASCII hex bytes, as nsqd sent them (FIN/REQ/TOUCH take them verbatim)
        self.id = msg_id
        self.body = body
        #: nanoseconds since the epoch at which the message was first published
        self.timestamp = timestamp
        #: delivery count including this one (1 on the first delivery)
        self.attempts = attempts
        #: ``host:port`` of the nsqd that delivered it
        self.nsqd_address = nsqd_address
        #: True once FIN or REQ was sent
        self.responded = False
        self._auto_response = True
        self._responder = responder

    def finish(self) -> None:
        """FIN: processed (or deliberately dropped); nsqd forgets the message."""
        if self.responded:
            return
        self.responded = True
        self._responder.finish_message(self)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ: give the message back to nsqd, to be redelivered after ``delay`` seconds.

        With ``delay=None`` the delay grows with the attempts (``requeue_delay * attempts``,
        capped at ``max_requeue_delay``). With ``backoff=True`` the failure counts toward the
        consumer's backoff (it slows down); ``backoff=False`` requeues without slowing down.
        """
        if self.responded:
            return
        self.responded = True
        self._responder.requeue_message(self, delay, backoff)

    def touch(self) -> None:
        """TOUCH: reset nsqd's timeout for this message (the client never does it for you)."""
        if not self.responded:
            self._responder.touch_message(self)

    def disable_auto_response(self) -> None:
        """Keep the message after the handler returns; answer later with finish/requeue."""
        self._auto_response = False

    @property
    def auto_response(self) -> bool:
        return self._auto_response

    def __repr__(self) -> str:
        return (
            f"<Message id={self.id.decode('ascii', 'replace')} attempts={self.attempts} "
            f"body={self.body[:32]!r}{'...' if len(self.body) > 32 else ''} "
            f"from={self.nsqd_address}>"
        )
