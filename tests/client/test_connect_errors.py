"""Connection failures the command-line tools report: Consumer.start(raise_connect_errors=True)
(go-nsq's ConnectToNSQDs) and the cause chained to a Producer's NoConnectionsError."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nsqpy.client import Consumer, NoConnectionsError, NSQDConnectError, Producer
from nsqpy.testing import start_nsqd

from .daemons import tcp


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_start_raises_for_an_unreachable_nsqd() -> None:
    address = f"127.0.0.1:{_closed_port()}"
    consumer = Consumer("t", "c", lambda m: None, nsqd_tcp_addresses=[address])
    with pytest.raises(NSQDConnectError) as raised:
        await consumer.start(raise_connect_errors=True)
    await consumer.close(timeout=1)
    assert raised.value.address == address
    reason = raised.value.__cause__
    while reason is not None and not isinstance(reason, ConnectionRefusedError):
        reason = reason.__cause__
    assert isinstance(reason, ConnectionRefusedError)


async def test_start_waits_for_the_subscription(tmp_path: Path) -> None:
    nsqd = start_nsqd(tmp_path)
    try:
        consumer = Consumer("t", "c", lambda m: None, nsqd_tcp_addresses=[tcp(nsqd)])
        await consumer.start(raise_connect_errors=True)
        try:
            assert list(consumer.connections) == [tcp(nsqd)]  # connected on return
        finally:
            await consumer.close()
    finally:
        nsqd.stop()


async def test_start_raises_when_nsqd_refuses_the_handshake(tmp_path: Path) -> None:
    nsqd = start_nsqd(tmp_path)
    try:
        # a heartbeat interval above nsqd's --max-heartbeat-interval (60s): IDENTIFY fails
        consumer = Consumer(
            "t", "c", lambda m: None, nsqd_tcp_addresses=[tcp(nsqd)], heartbeat_interval=500_000
        )
        with pytest.raises(NSQDConnectError, match=r"error connecting to nsqd"):
            await consumer.start(raise_connect_errors=True)
        await consumer.close(timeout=1)
    finally:
        nsqd.stop()


async def test_producer_chains_the_connect_error() -> None:
    producer = Producer(f"127.0.0.1:{_closed_port()}")
    try:
        with pytest.raises(NoConnectionsError) as raised:
            await producer.publish("t", b"x")
    finally:
        await producer.close()
    reason = raised.value.__cause__
    while reason is not None and not isinstance(reason, ConnectionRefusedError):
        reason = reason.__cause__
    assert isinstance(reason, ConnectionRefusedError)
