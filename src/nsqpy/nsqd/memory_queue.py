"""Memory queues: what nsqd asks of a topic's or channel's, and the channels' own kind.

A topic's pump hands each batch to all its channels as one tuple (the messages are shared,
see ``Message.shared``). A :class:`RunQueue` keeps that very tuple as one run, so N channels
hold one reference per batch each instead of one per message: the queues take about 8 bytes
per message and channel less, and the cycle collector walks each queued message once however
many channels queue it (a full collection walks every queued reference, and a deque per
channel would hold 100 million of them for a million messages queued on 100 channels).
Single messages go into short lists the queue owns. A run may also be a
:class:`~nsqpy.nsqd.message.MessageRun` (an MPUB's messages not yet built): the queue builds
each message as it is taken, new for every channel that takes it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Protocol

from .message import Message, MessageRun

#: what a queue holds its messages in: a topic's shared tuple, a list of its own, or a run of
#: published messages not yet built
Run = Sequence[Message] | MessageRun

#: the most messages in a run (the topic's tuples, the lists a queue makes itself): a run
#: stays in memory until its last message is taken, so this bounds the messages a channel
#: keeps after taking them
RUN_LIMIT = 256


class MemoryQueue(Protocol):
    """A FIFO of messages in memory; ``collections.deque`` is one."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Message]: ...

    def append(self, msg: Message, /) -> None: ...

    def extend(self, msgs: Iterable[Message], /) -> None: ...

    def popleft(self) -> Message: ...

    def clear(self) -> None: ...


class ChannelMemory(MemoryQueue, Protocol):
    """A channel's memory queue, which its consumers take from in batches."""

    def take(self, count: int) -> list[Message]:
        """Up to ``count`` messages from the head, in order."""
        ...

    def take_runs(self, count: int) -> list[Run]:
        """:meth:`take` as the runs the messages are kept in, none of them built (a topic's
        pump hands them on to every channel as they are)."""
        ...


class RunQueue:
    """A channel's memory queue: a FIFO of messages kept in runs, a tuple given to
    :meth:`extend` being queued as it is (see the module's docstring)."""

    __slots__ = ("_head", "_len", "_runs")

    def __init__(self, msgs: Iterable[Message] = ()) -> None:
        self._runs: deque[Run] = deque()
        self._head = 0  # messages already taken from the first run
        self._len = 0
        self.extend(msgs)

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[Message]:
        runs = iter(self._runs)
        first = next(runs, None)
        if first is None:
            return
        if isinstance(first, MessageRun):
            yield from first.messages(self._head)
        else:
            yield from islice(first, self._head, None)
        for run in runs:
            yield from run

    def append(self, msg: Message) -> None:
        runs = self._runs
        if runs:
            tail = runs[-1]
            if type(tail) is list and len(tail) < RUN_LIMIT:
                tail.append(msg)
                self._len += 1
                return
        runs.append([msg])
        self._len += 1

    def extend(self, msgs: Iterable[Message]) -> None:
        """Queue ``msgs`` after the others: a tuple or a MessageRun as it is (never copied,
        never changed), anything else in lists of its own of at most RUN_LIMIT messages,
        the last one first."""
        if type(msgs) is tuple or isinstance(msgs, MessageRun):
            if msgs:
                self._runs.append(msgs)
                self._len += len(msgs)
            return
        items = list(msgs)
        runs = self._runs
        start = 0
        if runs and type(runs[-1]) is list:  # top up the last list first (one PUB at a time)
            tail = runs[-1]
            start = max(0, RUN_LIMIT - len(tail))
            tail += items[:start]
        for begin in range(start, len(items), RUN_LIMIT):
            runs.append(items[begin : begin + RUN_LIMIT])
        self._len += len(items)

    def popleft(self) -> Message:
        if not self._len:
            raise IndexError("pop from an empty queue")
        run = self._runs[0]
        if isinstance(run, MessageRun):
            msg = run.messages(self._head, self._head + 1)[0]
        else:
            msg = run[self._head]
        self._head += 1
        self._len -= 1
        if self._head == len(run):
            self._runs.popleft()
            self._head = 0
        return msg

    def take(self, count: int) -> list[Message]:
        """Up to ``count`` messages from the head, in order, a slice of each run."""
        taken: list[Message] = []
        runs = self._runs
        head = self._head
        while count > 0 and runs:
            run = runs[0]
            available = len(run) - head
            if isinstance(run, MessageRun):
                taken += run.messages(head, head + count)
            elif count < available:
                taken += run[head : head + count]
            else:
                taken += run[head:] if head else run
            if count < available:
                head += count
                break
            count -= available
            runs.popleft()
            head = 0
        self._head = head
        self._len -= len(taken)
        return taken

    def take_runs(self, count: int) -> list[Run]:
        """Up to ``count`` messages from the head, in order, as the runs that hold them (the
        first and last cut to fit)."""
        taken: list[Run] = []
        runs = self._runs
        head = self._head
        left = count
        while left > 0 and runs:
            run = runs[0]
            available = len(run) - head
            if left < available:
                taken.append(cut(run, head, head + left))
                head += left
                left = 0
                break
            taken.append(cut(run, head, None) if head else run)
            left -= available
            runs.popleft()
            head = 0
        self._head = head
        self._len -= count - left
        return taken

    def clear(self) -> None:
        self._runs.clear()
        self._head = 0
        self._len = 0


def cut(run: Run, start: int, stop: int | None) -> Run:
    """``run[start:stop]``, of the same kind."""
    if isinstance(run, MessageRun):
        return run.slice(start, stop)
    return run[start:stop]
