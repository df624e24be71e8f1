"""An asyncio NSQ client: :class:`Consumer`, :class:`Producer`, HTTP publish helpers.

::

    import asyncio
    from nsqpy.client import Consumer, Producer

    async def main() -> None:
        async with Producer("127.0.0.1:4150") as producer:
            await producer.publish("events", b"hello")

        async def handle(message):
            print(message.body)          # returning FINishes, raising REQueues

        async with Consumer("events", "printer", handle,
                            nsqd_tcp_addresses=["127.0.0.1:4150"]):
            await asyncio.sleep(1)

    asyncio.run(main())

Blocking helpers for scripts live in :mod:`nsqpy.client.sync`.
"""

from .backoff import BackoffStrategy, ExponentialBackoff, FullJitterBackoff
from .connection import Connection, ConnectionOptions
from .consumer import Consumer, ConsumerStats, Handler
from .errors import (
    ClosedError,
    ConnectionClosedError,
    HTTPPublishError,
    IdentifyError,
    NoConnectionsError,
    NSQDConnectError,
    NSQError,
    ServerError,
)
from .lookup import LookupdPoller
from .message import Message
from .producer import Producer, http_multi_publish, http_publish

__all__ = [
    "BackoffStrategy",
    "ClosedError",
    "Connection",
    "ConnectionClosedError",
    "ConnectionOptions",
    "Consumer",
    "ConsumerStats",
    "ExponentialBackoff",
    "FullJitterBackoff",
    "HTTPPublishError",
    "Handler",
    "IdentifyError",
    "LookupdPoller",
    "Message",
    "NSQDConnectError",
    "NSQError",
    "NoConnectionsError",
    "Producer",
    "ServerError",
    "http_multi_publish",
    "http_publish",
]
