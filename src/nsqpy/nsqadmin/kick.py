"""``POST /api/topics/:topic/:channel/clients``: kick one consumer off its nsqd (nsqpy;
nsqio/nsq#418).

The body names the client as the channel page lists it::

    {"action": "kick", "node": "10.0.0.5:4151", "remote_address": "10.0.0.9:52344"}

``node`` must be an nsqd producing the topic (nsqadmin only talks to the cluster's own nsqd),
and nsqadmin forwards ``POST /client/kick?remote_address=...&topic=...&channel=...`` to it, so
only a consumer of this channel can be kicked. Like Go's other actions it needs an admin user
(``--admin-user``) and posts an admin notification (action ``kick_client``) before it looks at
the outcome. An nsqd that has no such client answers 404 ``CLIENT_NOT_FOUND``, passed through;
an nsqd without the route (Go's, or an older nsqpy) is a 502 naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from ..internal.api_client import RequestError, query_string
from ..internal.clusterinfo_types import http_address
from ..internal.http_api import ApiError, v1_json
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from .api_actions import string_field
from .context import Warnings

if TYPE_CHECKING:
    from .http import AdminHTTP


async def kick_client(server: AdminHTTP, request: web.Request) -> web.Response:
    server.require_admin(request)
    topic, channel = request.match_info["topic"], request.match_info["channel"]
    if not is_valid_topic_name(topic):
        raise ApiError(400, "INVALID_TOPIC")
    if not is_valid_channel_name(channel):
        raise ApiError(400, "INVALID_CHANNEL")
    body = await server.json_body(request)
    try:
        action = string_field(body, "action")
        node = string_field(body, "node")
        remote_address = string_field(body, "remote_address")
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    if action != "kick":
        raise ApiError(400, "INVALID_ACTION")
    if not node:
        raise ApiError(400, "MISSING_ARG_NODE")
    if not remote_address:
        raise ApiError(400, "MISSING_ARG_REMOTE_ADDRESS")
    producers, _ = await server.topic_producers(topic, Warnings(server.logger))
    if not any(http_address(p) == node for p in producers):
        raise ApiError(404, "NODE_NOT_FOUND")
    query = query_string(remote_address=remote_address, topic=topic, channel=channel)
    url = f"http://{node}/client/kick?{query}"
    server.logger.info(f"CI: querying nsqd {url}")
    error: RequestError | None = None
    try:
        await server.ci.client.post_v1(url)
    except RequestError as exc:
        error = exc
    # as Go's actions: notify before looking at the outcome, so a failed kick is audited too
    server.notify("kick_client", topic, channel, node, request, remote_address=remote_address)
    if error is not None:
        if error.status == 404 and error.api_message == "CLIENT_NOT_FOUND":
            raise ApiError(404, "CLIENT_NOT_FOUND")
        server.logger.error(f"failed to kick client - {error}")
        raise ApiError(502, f"UPSTREAM_ERROR: {error}")
    return v1_json({"message": ""})
