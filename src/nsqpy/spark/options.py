"""The ``nsq`` format's options, parsed and checked once, in plain picklable dataclasses.

Spark hands a data source a case-insensitive map of strings. Everything is validated here so
that a mistake is reported at ``.load()`` / ``.save()`` time with a message that says what to
write instead, not as a stack trace from an executor minutes later.

``nsq.*`` options are connection settings sent in IDENTIFY (and TLS / AUTH); they are kept as
strings and turned into :class:`~nsqpy.client.ConnectionOptions` inside each task, because an
``ssl.SSLContext`` cannot be pickled to executors.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..client.connection import ConnectionOptions, split_address
from ..internal.durations import parse_duration
from ..protocol.names import is_ephemeral, is_valid_channel_name, is_valid_topic_name

__all__ = [
    "NSQOptionError",
    "SinkOptions",
    "SourceOptions",
    "connection_options",
    "parse_sink_options",
    "parse_source_options",
]

POISON_POLICIES = ("fail", "skip", "deadletter")

#: a read task takes up to this many messages (over several connections if it exceeds nsqd's
#: --max-rdy-count, 2500 by default: the most one connection may hold un-FINished)
DEFAULT_MESSAGES_PER_PARTITION = 10000
#: nsqd's default --max-msg-size and --max-body-size
DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024
DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024


class NSQOptionError(ValueError):
    """An option of the ``nsq`` format is missing, malformed or contradicts another."""


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark's option map is case-insensitive; a plain dict (tests, direct use) may not be
    value = options.get(name)
    if value is None:
        value = options.get(name.lower())
    if value is None:
        for key, candidate in options.items():
            if key.lower() == name.lower():
                return str(candidate)
        return None
    return str(value)


def _list(options: Mapping[str, str], name: str) -> tuple[str, ...]:
    value = _get(options, name)
    if not value:
        return ()
    return tuple(item.strip() for item in value.split(",") if item.strip())


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = _get(options, name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise NSQOptionError(f"nsq: option {name!r} must be true or false, not {value!r}")


def _int(
    options: Mapping[str, str], name: str, default: int | None, minimum: int = 0
) -> int | None:
    value = _get(options, name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise NSQOptionError(f"nsq: option {name!r} must be an integer, not {value!r}") from None
    if number < minimum:
        raise NSQOptionError(f"nsq: option {name!r} must be >= {minimum}, not {number}")
    return number


def parse_millis_or_duration(name: str, value: str) -> float:
    """``250`` (milliseconds) or a Go duration (``250ms``, ``1.5s``, ``15m``) in seconds."""
    text = value.strip()
    try:
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return float(text) / 1000.0
        seconds = parse_duration(text)
    except ValueError:
        raise NSQOptionError(
            f"nsq: option {name!r} must be milliseconds or a duration like '30s', not {value!r}"
        ) from None
    if seconds < 0:
        raise NSQOptionError(f"nsq: option {name!r} must not be negative")
    return seconds


def _duration(options: Mapping[str, str], name: str, default: float) -> float:
    value = _get(options, name)
    if value is None or value == "":
        return default
    return parse_millis_or_duration(name, value)


def _check_addresses(name: str, addresses: Iterable[str]) -> None:
    for address in addresses:
        target = address.split("://", 1)[-1].rstrip("/")
        try:
            split_address(target)
        except ValueError:
            raise NSQOptionError(
                f"nsq: option {name!r} has {address!r}; expected host:port"
            ) from None


# ---------------------------------------------------------------------- connection settings

_CONNECTION_KEYS = {
    "client_id": "str",
    "hostname": "str",
    "user_agent": "str",
    "heartbeat_interval": "duration",
    "output_buffer_size": "int",
    "output_buffer_timeout": "duration",
    "msg_timeout": "duration",
    "tls_v1": "bool",
    "tls_root_ca_file": "str",
    "tls_cert": "str",
    "tls_key": "str",
    "tls_insecure_skip_verify": "bool",
    "tls_server_name": "str",
    "snappy": "bool",
    "deflate": "bool",
    "deflate_level": "int",
    "auth_secret": "str",
    "dial_timeout": "duration",
    "read_timeout": "duration",
}


def _connection_settings(
    options: Mapping[str, str], *, source: bool
) -> tuple[tuple[str, str], ...]:
    settings: dict[str, str] = {}
    for key, value in options.items():
        lowered = key.lower()
        if not lowered.startswith("nsq."):
            continue
        name = lowered[4:]
        if name == "sample_rate" and source:
            raise NSQOptionError(
                "nsq: 'nsq.sample_rate' is not allowed for the source: nsqd would drop the "
                "messages it does not sample, and the query would silently lose them"
            )
        if name not in _CONNECTION_KEYS and name != "sample_rate":
            known = ", ".join(f"nsq.{k}" for k in sorted(_CONNECTION_KEYS))
            raise NSQOptionError(f"nsq: unknown option {key!r}; connection options are: {known}")
        settings[name] = str(value)
    result = tuple(sorted(settings.items()))
    connection_options(result)  # fail now on a bad value, not in a task
    return result


def connection_options(settings: Iterable[tuple[str, str]], **defaults: Any) -> ConnectionOptions:
    """Build the client's ConnectionOptions from ``nsq.*`` strings (``defaults`` go first)."""
    kwargs: dict[str, Any] = dict(defaults)
    tls: dict[str, str] = {}
    for name, value in settings:
        kind = _CONNECTION_KEYS.get(name, "int")
        try:
            if kind == "duration":
                kwargs[name] = parse_millis_or_duration("nsq." + name, value)
            elif kind == "int":
                kwargs[name] = int(value)
            elif kind == "bool":
                kwargs[name] = _bool({name: value}, name, False)
            else:
                kwargs[name] = value
        except ValueError as exc:
            raise NSQOptionError(f"nsq: option 'nsq.{name}': {exc}") from None
    for name in ("tls_root_ca_file", "tls_cert", "tls_key"):
        if name in kwargs:
            tls[name] = str(kwargs.pop(name))
    tls_on = bool(kwargs.pop("tls_v1", False))
    insecure = bool(kwargs.pop("tls_insecure_skip_verify", False))
    server_name = kwargs.pop("tls_server_name", None)
    if tls_on:
        kwargs["tls"] = _tls_context(tls, insecure)
        if server_name:
            kwargs["tls_server_hostname"] = server_name
    elif tls or insecure or server_name:
        raise NSQOptionError(
            "nsq: TLS settings given but TLS is off: add .option('nsq.tls_v1', 'true')"
        )
    try:
        return ConnectionOptions(**kwargs)
    except (TypeError, ValueError) as exc:
        raise NSQOptionError(f"nsq: invalid connection option: {exc}") from None


def _tls_context(tls: Mapping[str, str], insecure: bool) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=tls.get("tls_root_ca_file"))
        if "tls_cert" in tls or "tls_key" in tls:
            if "tls_cert" not in tls or "tls_key" not in tls:
                raise NSQOptionError("nsq: 'nsq.tls_cert' and 'nsq.tls_key' go together")
            context.load_cert_chain(tls["tls_cert"], tls["tls_key"])
    except OSError as exc:
        raise NSQOptionError(f"nsq: cannot load TLS files: {exc}") from None
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


# ---------------------------------------------------------------------- the source


@dataclass(frozen=True)
class SourceOptions:
    """Options of ``spark.readStream.format("nsq")`` and ``spark.read.format("nsq")``."""

    channel: str
    staging_location: str
    topic: str | None = None
    topic_pattern: str | None = None
    lookupd: tuple[str, ...] = ()
    nsqd: tuple[str, ...] = ()
    nsqd_http: tuple[str, ...] = ()
    create_channel: bool = True
    max_messages_per_trigger: int | None = None
    min_messages_per_trigger: int | None = None
    max_trigger_delay: float = 900.0
    readers_per_nsqd: int = 1
    messages_per_partition: int = DEFAULT_MESSAGES_PER_PARTITION
    wait: float = 1.0
    idle: float = 0.2
    fail_on_data_loss: bool = True
    max_attempts: int = 0
    poison_policy: str = "fail"
    dead_letter_topic: str | None = None
    include_metadata: bool = True
    max_messages: int | None = None
    http_timeout: float = 5.0
    lookupd_poll_interval: float = 5.0
    connection: tuple[tuple[str, str], ...] = ()
    fault_injection: str | None = field(default=None, repr=False)

    def identity(self) -> str:
        """What a staging directory belongs to: one query reading one subscription."""
        return json.dumps(
            {"topic": self.topic, "topicPattern": self.topic_pattern, "channel": self.channel},
            sort_keys=True,
        )


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    topic = _get(options, "topic") or None
    pattern = _get(options, "topicPattern") or None
    if topic is None and pattern is None:
        raise NSQOptionError(
            "nsq: option 'topic' is required (or 'topicPattern', a regular expression over "
            "the topics nsqlookupd knows), e.g. .option('topic', 'clicks')"
        )
    if topic is not None and pattern is not None:
        raise NSQOptionError("nsq: give either 'topic' or 'topicPattern', not both")
    if topic is not None and not is_valid_topic_name(topic):
        raise NSQOptionError(f"nsq: invalid topic name {topic!r}")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise NSQOptionError(f"nsq: 'topicPattern' is not a valid regex: {exc}") from None

    channel = _get(options, "channel")
    if not channel:
        raise NSQOptionError(
            "nsq: option 'channel' is required: name a channel dedicated to this query "
            "(like Kafka's group.id), e.g. .option('channel', 'spark-archive')"
        )
    if is_ephemeral(channel):
        raise NSQOptionError(
            f"nsq: channel {channel!r} is ephemeral: nsqd drops its messages past the memory "
            "queue and deletes it when the last client leaves, which breaks the staged replay; "
            "use a durable channel name (without '#ephemeral')"
        )
    if not is_valid_channel_name(channel):
        raise NSQOptionError(f"nsq: invalid channel name {channel!r}")

    lookupd = _list(options, "lookupd")
    nsqd = _list(options, "nsqd")
    nsqd_http = _list(options, "nsqdHttp")
    if not lookupd and not nsqd:
        raise NSQOptionError(
            "nsq: give 'lookupd' (nsqlookupd HTTP addresses, e.g. '127.0.0.1:4161') or "
            "'nsqd' (nsqd TCP addresses, e.g. '127.0.0.1:4150')"
        )
    if lookupd and nsqd:
        raise NSQOptionError("nsq: give either 'lookupd' or 'nsqd', not both")
    if nsqd_http and len(nsqd_http) != len(nsqd):
        raise NSQOptionError(
            "nsq: 'nsqdHttp' must list one HTTP address per 'nsqd' TCP address, in the same order"
        )
    if pattern is not None and not lookupd:
        raise NSQOptionError("nsq: 'topicPattern' needs 'lookupd' to list the topics")
    _check_addresses("lookupd", lookupd)
    _check_addresses("nsqd", nsqd)
    _check_addresses("nsqdHttp", nsqd_http)

    staging = _get(options, "stagingLocation")
    if not staging:
        raise NSQOptionError(
            "nsq: option 'stagingLocation' is required: a directory on storage that the driver "
            "and every executor share (beside the checkpoint), where tasks stage the messages "
            "they take from nsqd before FINishing them"
        )
    if staging.startswith("file://"):
        staging = staging[len("file://") :]
    elif "://" in staging:
        raise NSQOptionError(
            f"nsq: 'stagingLocation' {staging!r}: only file paths are supported (mount shared "
            "storage such as NFS on every node)"
        )

    per_partition = _int(options, "messagesPerPartition", DEFAULT_MESSAGES_PER_PARTITION, 1)
    max_per_trigger = _int(options, "maxMessagesPerTrigger", None, 1)
    min_per_trigger = _int(options, "minMessagesPerTrigger", None, 1)
    if max_per_trigger and min_per_trigger and min_per_trigger > max_per_trigger:
        raise NSQOptionError("nsq: 'minMessagesPerTrigger' exceeds 'maxMessagesPerTrigger'")
    wait = _duration(options, "waitMs", 1.0)
    if wait <= 0:
        raise NSQOptionError("nsq: 'waitMs' must be positive")
    idle = _duration(options, "idleMs", min(wait, 0.2))

    policy = (_get(options, "poisonPolicy") or "fail").lower()
    if policy not in POISON_POLICIES:
        raise NSQOptionError(
            f"nsq: 'poisonPolicy' must be one of {', '.join(POISON_POLICIES)}, not {policy!r}"
        )
    dead_letter = _get(options, "deadLetterTopic") or None
    if policy == "deadletter" and not dead_letter:
        raise NSQOptionError("nsq: poisonPolicy 'deadletter' needs 'deadLetterTopic'")
    if dead_letter is not None and not is_valid_topic_name(dead_letter):
        raise NSQOptionError(f"nsq: invalid deadLetterTopic {dead_letter!r}")

    max_messages = _int(options, "maxMessages", None, 1)
    if streaming and max_messages is not None:
        raise NSQOptionError(
            "nsq: 'maxMessages' is for batch reads; streams use 'maxMessagesPerTrigger'"
        )

    return SourceOptions(
        channel=channel,
        staging_location=staging,
        topic=topic,
        topic_pattern=pattern,
        lookupd=lookupd,
        nsqd=nsqd,
        nsqd_http=nsqd_http,
        create_channel=_bool(options, "createChannel", True),
        max_messages_per_trigger=max_per_trigger,
        min_messages_per_trigger=min_per_trigger,
        max_trigger_delay=_duration(options, "maxTriggerDelay", 900.0),
        readers_per_nsqd=_int(options, "readersPerNsqd", 1, 1) or 1,
        messages_per_partition=per_partition or DEFAULT_MESSAGES_PER_PARTITION,
        wait=wait,
        idle=idle,
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        max_attempts=_int(options, "maxAttempts", 0, 0) or 0,
        poison_policy=policy,
        dead_letter_topic=dead_letter,
        include_metadata=_bool(options, "includeMetadata", True),
        max_messages=max_messages,
        http_timeout=_duration(options, "httpTimeoutMs", 5.0),
        lookupd_poll_interval=_duration(options, "lookupdPollIntervalMs", 5.0),
        connection=_connection_settings(options, source=True),
        fault_injection=_get(options, "_faultInjection") or None,
    )


# ---------------------------------------------------------------------- the sink


@dataclass(frozen=True)
class SinkOptions:
    """Options of ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``."""

    topic: str | None = None
    lookupd: tuple[str, ...] = ()
    nsqd: tuple[str, ...] = ()
    batch_size: int = 500
    max_body_size: int = DEFAULT_MAX_BODY_SIZE
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    in_flight_batches: int = 16
    http_timeout: float = 5.0
    connection: tuple[tuple[str, str], ...] = ()
    fault_injection: str | None = field(default=None, repr=False)


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    topic = _get(options, "topic") or None
    if topic is not None and not is_valid_topic_name(topic):
        raise NSQOptionError(f"nsq: invalid topic name {topic!r}")
    lookupd = _list(options, "lookupd")
    nsqd = _list(options, "nsqd")
    if not lookupd and not nsqd:
        raise NSQOptionError(
            "nsq: give 'nsqd' (nsqd TCP addresses to publish to, e.g. '127.0.0.1:4150') or "
            "'lookupd' (nsqlookupd HTTP addresses to find them)"
        )
    _check_addresses("lookupd", lookupd)
    _check_addresses("nsqd", nsqd)
    max_body = _int(options, "maxBodySize", DEFAULT_MAX_BODY_SIZE, 16) or DEFAULT_MAX_BODY_SIZE
    max_message = (
        _int(options, "maxMessageSize", DEFAULT_MAX_MESSAGE_SIZE, 1) or DEFAULT_MAX_MESSAGE_SIZE
    )
    return SinkOptions(
        topic=topic,
        lookupd=lookupd,
        nsqd=nsqd,
        batch_size=_int(options, "batchSize", 500, 1) or 500,
        max_body_size=max_body,
        max_message_size=max_message,
        in_flight_batches=_int(options, "inFlightBatches", 16, 1) or 16,
        http_timeout=_duration(options, "httpTimeoutMs", 5.0),
        connection=_connection_settings(options, source=False),
        fault_injection=_get(options, "_faultInjection") or None,
    )
