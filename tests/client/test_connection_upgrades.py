"""IDENTIFY feature negotiation against the scripted fake nsqd: TLS, snappy, deflate, both.

The fake decodes what the client sends with the negotiated codec, so a client that kept
writing plain bytes (or compressed too early) fails the script.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from nsqpy.client import Consumer, IdentifyError, Message
from nsqpy.protocol.frames import FRAME_TYPE_RESPONSE, encode_frame
from nsqpy.testing.certs import Certs

from ..raw_v2 import wait_until_async
from .fake_nsqd import (
    IDENTIFY_DEFAULTS,
    FakeNsqd,
    Step,
    heartbeat,
    identify_response,
    message,
    respond,
    sleep,
    upgrade,
    wait_for,
)

GOOD = b"1234567890asdfgh"

# asyncio's StreamWriter.__del__ trips over the transport a failed server-side start_tls left
# behind in the fake (a CPython quirk, not the client's)
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def consume_script(*upgrade_steps: Step, **identify: Any) -> list[Step]:
    return [
        wait_for(b"IDENTIFY"),
        identify_response(**identify),
        *upgrade_steps,
        wait_for(b"SUB"),
        respond(),
        heartbeat(),
        wait_for(b"NOP"),
        message(GOOD, b"payload " * 50),
        wait_for(b"FIN", 1),
    ]


async def run_consumer(fake: FakeNsqd, **options: Any) -> tuple[list[bytes], dict[str, Any]]:
    bodies: list[bytes] = []

    def handle(msg: Message) -> None:
        bodies.append(msg.body)

    consumer = Consumer("t", "c", handle, nsqd_tcp_addresses=[fake.address], **options)
    await consumer.start()
    conn = await fake.wait_connection(0)
    await consumer.wait_connected()
    client_conn = next(iter(consumer.connections.values()))
    info = {
        "compression": client_conn.compression,
        "tls": client_conn.tls,
        "identify": conn.identify(),
        "lines": conn.script_lines,
    }
    await consumer.close()
    return bodies, info


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
async def test_compression_is_negotiated_and_used_both_ways(codec: str) -> None:
    async with FakeNsqd(consume_script(upgrade(codec), **{codec: True})) as fake:
        bodies, info = await run_consumer(fake, **{codec: True})
    assert bodies == [b"payload " * 50]
    assert info["compression"] == codec
    assert info["identify"][codec] is True
    assert info["lines"][-1] == b"FIN " + GOOD


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
async def test_compressed_ok_in_the_same_read_as_the_identify_response(codec: str) -> None:
    """Bytes after the IDENTIFY JSON already belong to the compressed stream."""
    settings = dict(IDENTIFY_DEFAULTS, **{codec: True})
    json_frame = encode_frame(FRAME_TYPE_RESPONSE, json.dumps(settings).encode())
    script = [
        wait_for(b"IDENTIFY"),
        upgrade(codec, after=json_frame),
        wait_for(b"SUB"),
        respond(),
        message(GOOD, b"x"),
        wait_for(b"FIN", 1),
    ]
    async with FakeNsqd(script) as fake:
        bodies, info = await run_consumer(fake, **{codec: True})
    assert bodies == [b"x"]
    assert info["compression"] == codec


async def test_compression_not_granted_stays_plain() -> None:
    async with FakeNsqd(consume_script(snappy=False)) as fake:
        bodies, info = await run_consumer(fake, snappy=True)
    assert bodies == [b"payload " * 50]
    assert info["compression"] is None


async def test_tls_upgrade(certs: Certs) -> None:
    script = consume_script(upgrade("tls", context=certs.server_context()), tls_v1=True)
    async with FakeNsqd(script) as fake:
        bodies, info = await run_consumer(fake, tls=certs.client_context())
    assert bodies == [b"payload " * 50]
    assert info["tls"] is True
    assert info["identify"]["tls_v1"] is True


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
async def test_tls_then_compression(certs: Certs, codec: str) -> None:
    steps = (upgrade("tls", context=certs.server_context()), upgrade(codec))
    script = consume_script(*steps, tls_v1=True, **{codec: True})
    async with FakeNsqd(script) as fake:
        bodies, info = await run_consumer(fake, tls=certs.client_context(), **{codec: True})
    assert bodies == [b"payload " * 50]
    assert (info["tls"], info["compression"]) == (True, codec)


async def test_tls_requested_but_refused_does_not_connect() -> None:
    script = [wait_for(b"IDENTIFY"), identify_response(tls_v1=False), sleep(30)]
    async with FakeNsqd(script) as fake:
        consumer = Consumer(
            "t", "c", print, nsqd_tcp_addresses=[fake.address], tls=True, reconnect_interval=10
        )
        await consumer.start()
        await wait_until_async(
            lambda: fake.connections and fake.connections[0].closed,
            timeout=10.0,
            what="the connection closed",
        )
        assert consumer.connections == {}
        await consumer.close()
    assert b"SUB t c" not in fake.connections[0].lines


async def test_tls_with_an_untrusted_certificate_fails(certs: Certs) -> None:
    from nsqpy.client import Connection, ConnectionOptions

    script = [
        wait_for(b"IDENTIFY"),
        identify_response(tls_v1=True),
        upgrade("tls", context=certs.server_context()),
    ]
    async with FakeNsqd(script) as fake:
        # the default context trusts the system store, not our test CA
        conn = Connection(fake.address, ConnectionOptions(tls=True), _NullDelegate())
        with pytest.raises(IdentifyError, match="TLS handshake failed"):
            await conn.connect()


async def test_heartbeat_during_the_handshake_is_answered() -> None:
    script = [
        wait_for(b"IDENTIFY"),
        heartbeat(),
        identify_response(),
        wait_for(b"SUB"),
        respond(),
        message(GOOD, b"x"),
        wait_for(b"FIN", 1),
    ]
    async with FakeNsqd(script) as fake:
        bodies, info = await run_consumer(fake)
    assert bodies == [b"x"]
    assert info["lines"][:3] == [b"IDENTIFY", b"NOP", b"SUB t c"]


async def test_old_nsqd_without_feature_negotiation() -> None:
    script = [
        wait_for(b"IDENTIFY"),
        respond(b"OK"),
        wait_for(b"SUB"),
        respond(),
        message(GOOD, b"x"),
        wait_for(b"FIN", 1),
    ]
    async with FakeNsqd(script) as fake:
        bodies, info = await run_consumer(fake, max_in_flight=5000)
    assert bodies == [b"x"]
    # max_rdy_count is assumed to be 2500 for such an nsqd
    assert b"RDY 2500" in info["lines"]


class _NullDelegate:
    def on_message(self, conn: Any, message: Message) -> None: ...

    def on_message_finished(self, conn: Any, message: Message) -> None: ...

    def on_message_requeued(self, conn: Any, message: Message, delay: Any, backoff: bool) -> None:
        return None

    def on_response(self, conn: Any, data: bytes) -> None: ...

    def on_server_error(self, conn: Any, error: Any) -> None: ...

    def on_close(self, conn: Any, exc: BaseException | None) -> None: ...
