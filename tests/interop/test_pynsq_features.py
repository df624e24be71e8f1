"""pynsq's negotiated connection features (TLS, snappy, deflate) and AUTH against nsqpy."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import nsq
import pytest
from aiohttp import web

from ..raw_v2 import unique
from .certs import SelfSigned
from .conftest import NsqdFactory
from .helpers import channel_stats, only_client, wait_channel
from .pynsq_harness import PynsqClients, answer

FEATURE_SETS = [("tls",), ("snappy",), ("deflate",), ("tls", "snappy"), ("tls", "deflate")]


def client_options(features: tuple[str, ...], certs: SelfSigned) -> dict[str, Any]:
    """pynsq connection kwargs; TLS verifies nsqd's certificate and its 127.0.0.1 SAN."""
    options: dict[str, Any] = {"snappy": "snappy" in features, "deflate": "deflate" in features}
    if "tls" in features:
        options["tls_v1"] = True
        options["tls_options"] = {
            "ssl_version": ssl.PROTOCOL_TLS_CLIENT,
            "cert_reqs": ssl.CERT_REQUIRED,
            "ca_certs": str(certs.cert),
        }
    return options


@pytest.mark.parametrize("features", FEATURE_SETS, ids="+".join)
async def test_publish_and_consume_over_negotiated_features(
    features: tuple[str, ...],
    nsqd_factory: NsqdFactory,
    pynsq: PynsqClients,
    self_signed: SelfSigned,
) -> None:
    nsqd = nsqd_factory(
        f"--tls-cert={self_signed.cert}",
        f"--tls-key={self_signed.key}",
        "--https-address=127.0.0.1:0",
        https=True,
    )
    topic, channel = unique("pynsq_" + "_".join(features)), "wire"
    options = client_options(features, self_signed)
    writer = await pynsq.writer(nsqd, **options)
    # Small bodies, and large compressible ones that span many reads of the compressed stream.
    bodies = [b"small-%d" % i for i in range(40)]
    bodies += [(b"large-%d " % i) * 20_000 for i in range(3)]
    assert await answer(partial(writer.mpub, topic, bodies[:20])) == b"OK"
    for body in bodies[20:]:
        assert await answer(partial(writer.pub, topic, body)) == b"OK"

    received: list[bytes] = []
    everything = asyncio.get_running_loop().create_future()

    def handler(message: Any) -> bool:
        received.append(message.body)
        if len(received) == len(bodies):
            everything.set_result(None)
        return True

    pynsq.reader(nsqd, topic, channel, handler, max_in_flight=8, **options)
    await asyncio.wait_for(everything, 10)
    assert sorted(received) == sorted(bodies)

    stats = await wait_channel(
        nsqd, topic, channel, clients_finish_count=len(bodies), in_flight_count=0, depth=0
    )
    client = only_client(stats)
    negotiated = {name for name in ("tls", "snappy", "deflate") if client[name]}
    assert negotiated == set(features)
    if "tls" in features:
        assert client["tls_version"] in ("TLS1.2", "TLS1.3")


@dataclass
class AuthServer:
    """A tiny nsqd auth server: one good secret may publish and subscribe to one topic."""

    secret: str
    topic: str
    queries: list[dict[str, str]] = field(default_factory=list)
    address: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.queries.append(dict(request.query))
        if request.query.get("secret") != self.secret:
            return web.Response(status=403, text="NOT_AUTHORIZED")
        body = {
            "ttl": 60,
            "identity": "interop-user",
            "authorizations": [
                {"topic": self.topic, "channels": [".*"], "permissions": ["subscribe", "publish"]}
            ],
        }
        return web.Response(text=json.dumps(body), content_type="application/json")


@pytest.fixture
async def auth_server() -> AsyncIterator[AuthServer]:
    server = AuthServer(secret="open-sesame", topic=unique("pynsq_auth"))
    app = web.Application()
    app.router.add_get("/auth", server.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    server.address = f"{host}:{port}"
    yield server
    await runner.cleanup()


async def test_auth_secret_grants_only_the_authorized_topic(
    nsqd_factory: NsqdFactory, pynsq: PynsqClients, auth_server: AuthServer
) -> None:
    nsqd = nsqd_factory(f"--auth-http-address={auth_server.address}")
    topic, channel = auth_server.topic, "authed"
    writer = await pynsq.writer(nsqd, auth_secret=auth_server.secret)
    assert await answer(partial(writer.pub, topic, b"allowed")) == b"OK"

    received = asyncio.get_running_loop().create_future()

    def handler(message: Any) -> bool:
        received.set_result(message.body)
        return True

    pynsq.reader(nsqd, topic, channel, handler, auth_secret=auth_server.secret)
    assert await asyncio.wait_for(received, 5) == b"allowed"
    client = only_client(channel_stats(nsqd, topic, channel))
    assert (client["authed"], client["auth_identity"]) == (True, "interop-user")
    assert auth_server.queries[0]["secret"] == auth_server.secret
    assert auth_server.queries[0]["remote_ip"] == "127.0.0.1"

    # Another topic is not in the authorizations: nsqd refuses it (fatally, as Go does).
    refused = await answer(partial(writer.pub, unique("pynsq_forbidden"), b"nope"))
    assert isinstance(refused, nsq.Error)
    assert "E_UNAUTHORIZED" in str(refused)
