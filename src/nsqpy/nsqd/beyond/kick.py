"""``POST /client/kick``: close one client's TCP connection (nsqpy; nsqio/nsq#418).

An operator names the connection as ``/stats`` shows it: ``remote_address`` (``ip:port``, one
connection) and/or ``client_id`` (what the client sent in IDENTIFY, which several connections
may share). ``topic`` and ``channel`` narrow the match to the consumers of that channel, so
nsqadmin's channel page kicks exactly the row the operator clicked.

The connection is closed as if the client had hung up: it leaves its channel and its in-flight
messages are requeued when their timeout fires, exactly as on any disconnect (Go keeps a gone
client's in-flight messages until their deadline; so do we, so a kick loses nothing and
redelivers nothing early). The route is additive: no client behaviour changes until it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from ...internal.http_api import ApiError, v1_json
from ...protocol import is_valid_channel_name, is_valid_topic_name

if TYPE_CHECKING:
    from ..client_v2 import ClientV2
    from ..nsqd import NSQD


def matching_clients(
    nsqd: NSQD,
    remote_address: str | None,
    client_id: str | None,
    topic: str | None,
    channel: str | None,
) -> list[ClientV2]:
    """The connections that match every given criterion (``None`` matches anything)."""
    found = []
    for client in nsqd.clients.values():
        if remote_address is not None and client.remote_address != remote_address:
            continue
        if client_id is not None and client.client_id != client_id:
            continue
        subscribed = client.channel
        if topic is not None and (subscribed is None or subscribed.topic.name != topic):
            continue
        if channel is not None and (subscribed is None or subscribed.name != channel):
            continue
        found.append(client)
    return found


def _described(client: ClientV2) -> dict[str, Any]:
    return {
        "client_id": client.client_id,
        "remote_address": client.remote_address,
        "in_flight_count": client.in_flight_count,
    }


async def client_kick(nsqd: NSQD, params: dict[str, list[str]]) -> web.Response:
    """Close the matching connections; 404 ``CLIENT_NOT_FOUND`` when none match."""

    def arg(key: str) -> str | None:
        values = params.get(key)
        return values[0] if values else None

    remote_address, client_id = arg("remote_address"), arg("client_id")
    if not remote_address and not client_id:
        raise ApiError(400, "MISSING_ARG_CLIENT")
    topic, channel = arg("topic"), arg("channel")
    if topic is not None and not is_valid_topic_name(topic):
        raise ApiError(400, "INVALID_TOPIC")
    if channel is not None and not is_valid_channel_name(channel):
        raise ApiError(400, "INVALID_CHANNEL")
    clients = matching_clients(nsqd, remote_address or None, client_id or None, topic, channel)
    if not clients:
        raise ApiError(404, "CLIENT_NOT_FOUND")
    kicked = [_described(client) for client in clients]
    for client in clients:
        nsqd.logger.info(f"HTTP: kicking client({client.remote_address}) as asked")
        hang_up(client)
    return v1_json({"clients": kicked})


def hang_up(client: ClientV2) -> None:
    """Close at once. A plain close would first flush what is buffered for the client, which
    never ends for the usual culprit, a client that stopped reading; what is dropped is
    messages in flight to it, which are requeued on their timeout anyway."""
    client.close()
    transport = client.connection.transport
    if transport is not None:
        transport.abort()
