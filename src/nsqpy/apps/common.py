"""What every utility shares: Go's flags, ``--consumer-opt``/``--producer-opt``, errors, signals.

A tool is a thin module over :mod:`nsqpy.client`::

    @dataclass
    class Options(ConsumerFlags):                 # --topic --channel --nsqd-tcp-address
        channel: str = option("channel", "nsq_to_x", STR, "nsq channel")   # override a default
        extra: int = option("extra", 1, INT, "a flag of this tool only")

    async def run(opts: Options) -> int:
        if opts.extra < 0:
            raise FatalError("--extra should be positive")   # Go's log.Fatal: one line, exit 1
        opts.check_sources()                                   # Go's texts for missing sources
        config = client_config(opts.consumer_opt)              # go-nsq options, already checked
        consumer = make_consumer("nsq_to_x", topic, opts.channel, handler, opts, config)
        stop = stop_event()                                    # set by SIGINT / SIGTERM
        await start_consumer(consumer)                         # unreachable nsqd: FatalError
        await stop.wait()
        await consumer.close()
        return 0

    def main(argv: Sequence[str] | None = None) -> int:
        return run_app("nsq_to_x", Options, argv, run)

:func:`run_app` parses Go-style flags (``-flag``, ``--flag``, ``--flag=value``, repeated list
flags, via :mod:`nsqpy.internal.flags`), prints ``nsq_to_x v1.3.0 (built w/python3.x.y)`` for
``--version``, rejects a bad ``--consumer-opt``/``--producer-opt`` as Go's flag package does
(``invalid value "..." for flag -consumer-opt: invalid option ...``, usage, exit 2), sets up
the client's logging in go-nsq's shape on stderr and runs ``run`` on the event loop. A
:class:`FatalError` is printed as Go's ``log.Fatal`` prints (``2026/11/25 10:00:00 text``) and
exits 1; any other exception becomes one such line too, never a traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import NSQ_VERSION, __version__, version_line
from ..client import Consumer, Handler
from ..client.errors import NSQDConnectError, go_dial_error, go_http_error
from ..internal.daemon import StopSignals, run_event_loop
from ..internal.flags import (
    BOOL,
    INT,
    STR,
    STR_LIST,
    HTTPClientTimeouts,
    UsageError,
    option,
    run_command,
)
from ..protocol.errors import go_quote
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from ._go_config import ClientConfig, ConfigError

__all__ = [
    "ClientConfig",
    "ConsumerFlags",
    "ConsumerSourceFlags",
    "FatalError",
    "HTTPClientFlags",
    "ProducerFlags",
    "client_config",
    "describe_error",
    "describe_http_error",
    "first_of",
    "go_log",
    "make_consumer",
    "run_app",
    "setup_logging",
    "start_consumer",
    "stop_event",
    "user_agent",
]

T = TypeVar("T")


class FatalError(Exception):
    """Go's ``log.Fatal``: the tool prints the text as one log line and exits 1."""


def go_log(text: str) -> None:
    """One line as Go's standard ``log`` package writes it: ``2026/11/25 10:00:00 text``."""
    stamp = time.strftime("%Y/%m/%d %H:%M:%S")
    try:
        sys.stderr.write(f"{stamp} {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def user_agent(program: str) -> str:
    """``nsq_tail/1.3.0 nsqpy/0.1.0`` (Go's tools send ``nsq_tail/1.3.0 go-nsq/1.1.0``)."""
    return f"{program}/{NSQ_VERSION} nsqpy/{__version__}"


# ---------------------------------------------------------------------- flags


@dataclass
class ConsumerSourceFlags:
    """Where a consuming tool finds its nsqd and how its consumers are configured."""

    nsqd_tcp_address: list[str] = option(
        "nsqd-tcp-address", [], STR_LIST, "nsqd TCP address (may be given multiple times)"
    )
    lookupd_http_address: list[str] = option(
        "lookupd-http-address", [], STR_LIST, "lookupd HTTP address (may be given multiple times)"
    )
    consumer_opt: list[str] = option(
        "consumer-opt",
        [],
        STR_LIST,
        "option to passthrough to nsq.Consumer (may be given multiple times, "
        "http://godoc.org/github.com/nsqio/go-nsq#Config)",
    )

    def check_sources(self, required_suffix: str = "") -> None:
        """Go's two checks: one of the source flags, and not both."""
        if not self.nsqd_tcp_address and not self.lookupd_http_address:
            raise FatalError(
                f"--nsqd-tcp-address or --lookupd-http-address required{required_suffix}"
            )
        if self.nsqd_tcp_address and self.lookupd_http_address:
            raise FatalError("use --nsqd-tcp-address or --lookupd-http-address not both")


@dataclass
class ConsumerFlags(ConsumerSourceFlags):
    """The flags of Go's consuming tools, with their defaults (override a field to change one)."""

    version: bool = option("version", False, BOOL, "print version string")
    topic: list[str] = option("topic", [], STR_LIST, "nsq topic (may be given multiple times)")
    channel: str = option("channel", "", STR, "nsq channel")
    max_in_flight: int = option(
        "max-in-flight", 200, INT, "max number of messages to allow in flight"
    )


@dataclass
class ProducerFlags:
    """``--producer-opt`` (destination addresses differ per tool: each declares its own)."""

    producer_opt: list[str] = option(
        "producer-opt",
        [],
        STR_LIST,
        "option to passthrough to nsq.Producer (may be given multiple times, "
        "http://godoc.org/github.com/nsqio/go-nsq#Config)",
    )


@dataclass
class HTTPClientFlags(HTTPClientTimeouts):
    """The timeouts of a tool's own HTTP requests (override a field to change a default)."""

    def check_http_client_timeouts(self) -> None:
        """Go's two checks (nsq_stat, nsq_to_file): both timeouts positive."""
        if self.http_client_connect_timeout <= 0:
            raise FatalError("--http-client-connect-timeout should be positive")
        if self.http_client_request_timeout <= 0:
            raise FatalError("--http-client-request-timeout should be positive")


_CLIENT_OPT_FLAGS = ("consumer-opt", "producer-opt")


def client_config(values: Sequence[str], flag: str = "consumer-opt") -> ClientConfig:
    """The go-nsq options of ``--consumer-opt``/``--producer-opt`` values (``key,value``).

    Raises :class:`~nsqpy.internal.flags.UsageError` with Go's flag-package text for an option
    go-nsq refuses."""
    config = ClientConfig()
    for value in values:
        try:
            config.set_flag(value)
        except ConfigError as exc:
            raise UsageError(f"invalid value {go_quote(value)} for flag -{flag}: {exc}") from None
    return config


def _check_client_opts(opts: Any) -> None:
    for field in dataclasses.fields(opts):
        if field.metadata.get("flag") in _CLIENT_OPT_FLAGS:
            client_config(getattr(opts, field.name), field.metadata["flag"])


# ---------------------------------------------------------------------- consumers


def make_consumer(
    program: str,
    topic: str,
    channel: str,
    handler: Handler,
    flags: ConsumerFlags,
    config: ClientConfig,
    **overrides: Any,
) -> Consumer:
    """A :class:`~nsqpy.client.Consumer` for ``topic``/``channel`` from the tool's flags.

    ``overrides`` are extra Consumer keyword arguments (they win over ``--consumer-opt``).
    Invalid names or option combinations raise :class:`FatalError` (Go: ``log.Fatal(err)``).
    """
    try:
        config.validate()  # go-nsq's NewConsumer: the config, then the names
        if flags.max_in_flight < 0:  # Validate sees the cfg.MaxInFlight the tool set
            raise FatalError(f"invalid MaxInFlight ! {flags.max_in_flight} < 0")
        if not is_valid_topic_name(topic):
            raise FatalError("invalid topic name")
        if not is_valid_channel_name(channel):
            raise FatalError("invalid channel name")
        kwargs = config.consumer_options(flags.max_in_flight, user_agent(program))
        kwargs.update(overrides)
        return Consumer(
            topic,
            channel,
            handler,
            nsqd_tcp_addresses=flags.nsqd_tcp_address,
            lookupd_http_addresses=flags.lookupd_http_address,
            **kwargs,
        )
    except (ConfigError, ValueError) as exc:
        raise FatalError(str(exc)) from None


async def start_consumer(consumer: Consumer) -> None:
    """Start ``consumer``; as go-nsq's ``ConnectToNSQDs``, an nsqd given by address that cannot
    be reached or subscribed to is fatal (lookupd-discovered ones are retried by later polls)."""
    try:
        await consumer.start(raise_connect_errors=True)
    except Exception as exc:
        await consumer.close(timeout=1.0)
        raise FatalError(describe_error(exc)) from None


def describe_error(exc: BaseException) -> str:
    """An exception as one line, with Go's wording for a refused or timed-out dial."""
    if isinstance(exc, NSQDConnectError):
        reason: BaseException | None = exc.__cause__
        # ConnectionClosedError is an OSError too: look for the socket's own error below it
        while reason is not None and not (
            isinstance(reason, TimeoutError)
            or (isinstance(reason, OSError) and reason.errno is not None)
        ):
            reason = reason.__cause__
        if isinstance(reason, TimeoutError) or (
            isinstance(reason, OSError) and reason.errno is not None
        ):
            return go_dial_error(exc.address, reason)
        return str(exc.__cause__ or exc)
    return str(exc) or type(exc).__name__


def describe_http_error(exc: BaseException) -> str:
    """An HTTP client failure in the words of Go's net/http (after ``Get "<url>": ``)."""
    return go_http_error(exc)


# ---------------------------------------------------------------------- running


def stop_event() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (call from inside the running loop)."""
    return StopSignals().stopping


async def first_of(*awaitables: Awaitable[Any]) -> None:
    """Wait until any of ``awaitables`` completes; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _GoNsqFormatter(logging.Formatter):
    """go-nsq's log shape: ``2026/11/25 10:00:00 INF message``."""

    _LEVELS = {"DEBUG": "DBG", "INFO": "INF", "WARNING": "WRN", "ERROR": "ERR", "CRITICAL": "ERR"}

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(short_level)s %(message)s", "%Y/%m/%d %H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        record.short_level = self._LEVELS.get(record.levelname, record.levelname[:3])
        return super().format(record)


def setup_logging(level: int = logging.INFO) -> None:
    """The client's log lines on stderr in go-nsq's shape (the tools' own output is stdout)."""
    logger = logging.getLogger("nsqpy")
    if any(getattr(h, "_nsqpy_apps", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_GoNsqFormatter())
    handler._nsqpy_apps = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def _checked_options(options_cls: type[T], check_client_opts: bool) -> type[T]:
    """``options_cls`` whose construction also runs the checks Go's flag package makes while
    parsing (go-nsq options, ``check_flags()``), so they come before ``--version`` as in Go
    and a failure prints the usage and exits 2."""

    def __post_init__(self: Any) -> None:
        parent = getattr(super(checked, self), "__post_init__", None)
        if parent is not None:
            parent()
        if check_client_opts:
            _check_client_opts(self)
        check_flags = getattr(self, "check_flags", None)
        if check_flags is not None:
            check_flags()

    checked: type[T] = dataclasses.make_dataclass(
        options_cls.__name__, [], bases=(options_cls,), namespace={"__post_init__": __post_init__}
    )
    return checked


def run_app(
    program: str,
    options_cls: type[T],
    argv: Sequence[str] | None,
    run: Callable[[T], Coroutine[Any, Any, int]],
    *,
    check_client_opts: bool = True,
) -> int:
    """The whole ``main`` of a tool: flags, ``--version``, then ``run(options)`` on the loop.

    An options object may define ``check_flags()`` raising
    :class:`~nsqpy.internal.flags.UsageError` for values Go's flag package itself refuses
    (printed with the usage, exit 2)."""
    args = sys.argv[1:] if argv is None else list(argv)

    def start(opts: T) -> int:
        setup_logging()
        try:
            return run_event_loop(run(opts))
        except FatalError as exc:
            go_log(str(exc))
            return 1
        except KeyboardInterrupt:  # a signal before the tool installed its handlers
            return 130
        except Exception as exc:  # one line, never a traceback
            go_log(f"FATAL: {describe_error(exc)}")
            return 1

    checked = _checked_options(options_cls, check_client_opts)
    return run_command(program, checked, args, version_line(program), start)
