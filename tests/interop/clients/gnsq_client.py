"""gnsq driven from the command line, for tests that must not monkey-patch their own process.

gnsq runs on gevent and needs ``gevent.monkey.patch_all()``; the test suite runs on asyncio,
so the tests start this script as a subprocess with the venv's python.

``read``: a ``gnsq.Consumer`` (through nsqlookupd or straight to nsqd) prints one JSON line a
delivery to stdout, ``{"body", "attempts", "action"}``, and answers it: ``fin``, ``req`` (REQ 0
without backoff, for a body named by ``--requeue`` on its first attempt) or ``hold`` (neither
FIN nor REQ: after ``--finish-first`` bodies starting with ``--hold-prefix`` were finished, the
further ones are held until SIGUSR2, then everything is finished). It exits 0 once ``--count``
distinct bodies are finished, 1 at ``--timeout``.

``publish``: a ``gnsq.Producer`` sends each body with PUB, or all of them in one MPUB with
``--mpub``, and prints ``{"published": n}`` once nsqd answered OK.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402  (after patch_all, as gevent requires)
import json  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
import gnsq  # noqa: E402
from gevent.event import Event  # noqa: E402


class ReadState:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.finished: set[bytes] = set()
        self.held_prefix_finished = 0
        self.released = not args.hold_prefix
        self.done = Event()

    def action(self, body: bytes, attempts: int) -> str:
        if attempts == 1 and body.decode("latin-1") in self.args.requeue:
            return "req"
        if not self.released and body.startswith(self.args.hold_prefix.encode("latin-1")):
            if self.held_prefix_finished >= self.args.finish_first:
                return "hold"
            self.held_prefix_finished += 1
        return "fin"

    def handle(self, consumer: Any, message: Any) -> None:
        action = self.action(message.body, message.attempts)
        emit(body=message.body.decode("latin-1"), attempts=message.attempts, action=action)
        if action == "fin":
            message.finish()
            self.finished.add(message.body)
            if len(self.finished) >= self.args.count:
                self.done.set()
        elif action == "req":
            message.requeue(0, backoff=False)
        else:
            message.enable_async()  # gnsq then sends neither FIN nor REQ for it


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def read(args: argparse.Namespace) -> int:
    state = ReadState(args)
    consumer = gnsq.Consumer(
        args.topic,
        args.channel,
        nsqd_tcp_addresses=args.nsqd,
        lookupd_http_addresses=args.lookupd,
        max_in_flight=args.max_in_flight,
        max_tries=0,  # deliver every attempt: the tests count them
        lookupd_poll_interval=args.lookupd_poll_interval,
        lookupd_poll_jitter=0.1,
    )
    consumer.on_message.connect(state.handle, weak=False)

    def release() -> None:
        state.released = True

    gevent.signal_handler(signal.SIGUSR2, release)
    consumer.start(block=False)
    got_all = state.done.wait(args.timeout)
    consumer.close()
    consumer.join(timeout=2)
    emit(done=bool(got_all), finished=len(state.finished))
    return 0 if got_all else 1


def publish(args: argparse.Namespace) -> int:
    producer = gnsq.Producer(args.nsqd)
    producer.start()
    bodies = [body.encode("latin-1") for body in args.bodies]
    if args.mpub:
        producer.multipublish(args.topic, bodies, timeout=args.timeout)
    else:
        for body in bodies:
            producer.publish(args.topic, body, timeout=args.timeout)
    producer.close()
    producer.join(timeout=2)
    emit(published=len(bodies))
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    reader = commands.add_parser("read")
    reader.add_argument("--lookupd", action="append", default=[], help="http://host:port")
    reader.add_argument("--nsqd", action="append", default=[], help="host:port (TCP)")
    reader.add_argument("--topic", required=True)
    reader.add_argument("--channel", required=True)
    reader.add_argument("--count", type=int, required=True, help="distinct bodies to finish")
    reader.add_argument("--timeout", type=float, default=30.0, help="seconds")
    reader.add_argument("--max-in-flight", type=int, default=6)
    reader.add_argument("--lookupd-poll-interval", type=float, default=1.0, help="seconds")
    reader.add_argument("--requeue", action="append", default=[], help="a body to REQ once")
    reader.add_argument("--hold-prefix", default="")
    reader.add_argument("--finish-first", type=int, default=0)
    publisher = commands.add_parser("publish")
    publisher.add_argument("--nsqd", required=True, help="host:port (TCP)")
    publisher.add_argument("--topic", required=True)
    publisher.add_argument("--mpub", action="store_true", help="one MPUB, not a PUB each")
    publisher.add_argument("--timeout", type=float, default=10.0, help="seconds an answer")
    publisher.add_argument("bodies", nargs="+")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    return read(args) if args.command == "read" else publish(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
