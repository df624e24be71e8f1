"""nsqadmin's actions: create, delete, pause, empty and tombstone (``POST``/``DELETE /api``),
each audited to ``--notification-http-endpoint``, and ``/config/:opt``. Request bodies are
decoded as Go's ``encoding/json`` decodes them, with its error texts."""

from __future__ import annotations

import base64
import ipaddress
import json
import time
from typing import Any

from aiohttp import web

from ..internal import clusterinfo as cluster
from ..internal import lg
from ..internal.flags import render_value, specs
from ..internal.http_api import ApiError, v1_json
from ..internal.net import format_address
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from .context import AdminContext, Warnings, upstream_error
from .options import COMMAND_ONLY, SECRET, Options


def _decode_json_body(raw: bytes) -> Any:
    """Go's ``json.NewDecoder(body).Decode``: the first JSON value; its error text on failure."""
    text = raw.decode("utf-8", "replace").lstrip()
    if not text:
        raise ValueError("EOF")
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text):
            raise ValueError("unexpected EOF") from None
        char = text[exc.pos]
        raise ValueError(f"invalid character {char!r} looking for beginning of value") from None
    return value


def _json_kind(value: Any) -> str:
    """The JSON kind as Go's decoder names it in its errors."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string" if isinstance(value, str) else "value"


def string_field(body: Any, key: str) -> str:
    """``body[key]`` decoded into a Go string field (absent or null: ``""``)."""
    if not isinstance(body, dict):
        raise ValueError(f"json: cannot unmarshal {_json_kind(body)} into Go value")
    value = body.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(
            f"json: cannot unmarshal {_json_kind(value)} into Go struct field .{key} of type string"
        )
    return value


def _basic_auth_user(request: web.Request) -> str:
    """Go's ``basicAuthUser``: the user name of an ``Authorization: Basic`` header."""
    scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
    if scheme != "Basic" or not encoded:
        return ""
    try:
        decoded = base64.b64decode(encoded, validate=True).decode("utf-8", "replace")
    except ValueError:
        return ""
    user, sep, _ = decoded.partition(":")
    return user if sep else ""


async def _read_limited(request: web.Request, limit: int) -> bytes:
    """At most ``limit`` bytes of the body (Go: ``io.LimitReader``)."""
    body = bytearray()
    while len(body) < limit:
        chunk = await request.content.read(limit - len(body))
        if not chunk:
            break
        body += chunk
    return bytes(body)


def _remote_addr(request: web.Request) -> str:
    """Go's ``req.RemoteAddr``: ``ip:port``."""
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return format_address(peer) if peer else ""


class ActionHandlers(AdminContext):
    """The handlers that change the cluster or nsqadmin itself (admins only, where set)."""

    def notify(
        self,
        action: str,
        topic: str,
        channel: str,
        node: str,
        request: web.Request,
        remote_address: str = "",
    ) -> None:
        """Go's ``notifyAdminAction``: queue the audit record; never blocks the request.
        ``remote_address``: the client a ``kick_client`` closed (nsqpy, additive)."""
        if not self.opts.notification_http_endpoint:
            return
        scheme = "https" if request.secure or request.headers.get("X-Scheme") == "https" else "http"
        query = request.rel_url.raw_query_string
        url = f"{scheme}://{request.host}{request.rel_url.raw_path}" + (
            f"?{query}" if query else ""
        )
        record: dict[str, Any] = {"action": action, "topic": topic}
        if channel:
            record["channel"] = channel
        if node:
            record["node"] = node
        if remote_address:
            record["remote_address"] = remote_address
        record["timestamp"] = int(time.time())
        user = _basic_auth_user(request)
        if user:
            record["user"] = user
        record["remote_ip"] = _remote_addr(request)
        record["user_agent"] = request.headers.get("User-Agent", "")
        record["url"] = url
        record["via"] = self.admin.hostname
        self.admin.notify(record)

    async def json_body(self, request: web.Request) -> Any:
        try:
            return _decode_json_body(await request.read())
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None

    def _action_response(self, failures: list[cluster.Failure]) -> web.Response:
        warnings = Warnings(self.logger)
        warnings.add(failures)
        return v1_json({"message": warnings.message})

    async def tombstone_node_for_topic(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        node = request.match_info["node"]
        try:
            topic = string_field(_decode_json_body(await request.read()), "topic")
        except ValueError:
            raise ApiError(400, "INVALID_BODY") from None
        if not is_valid_topic_name(topic):
            raise ApiError(400, "INVALID_TOPIC")
        try:
            failures = await self.ci.tombstone_node_for_topic(topic, node, self.lookupds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "tombstone node for topic", exc) from None
        self.notify("tombstone_topic_producer", topic, "", node, request)
        return self._action_response(failures)

    async def create_topic_channel(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        body = await self.json_body(request)
        try:
            topic, channel = string_field(body, "topic"), string_field(body, "channel")
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        if not is_valid_topic_name(topic):
            raise ApiError(400, "INVALID_TOPIC")
        if channel and not is_valid_channel_name(channel):
            raise ApiError(400, "INVALID_CHANNEL")
        try:
            failures = await self.ci.create_topic_channel(topic, channel, self.lookupds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "create topic/channel", exc) from None
        self.notify("create_topic", topic, "", "", request)
        if channel:
            self.notify("create_channel", topic, channel, "", request)
        return self._action_response(failures)

    async def delete_topic(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        topic = request.match_info["topic"]
        try:
            failures = await self.ci.delete_topic(topic, self.lookupds, self.nsqds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "delete topic", exc) from None
        self.notify("delete_topic", topic, "", "", request)
        return self._action_response(failures)

    async def delete_channel(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        topic, channel = request.match_info["topic"], request.match_info["channel"]
        try:
            failures = await self.ci.delete_channel(topic, channel, self.lookupds, self.nsqds)
        except cluster.UpstreamError as exc:
            raise upstream_error(self.logger, "delete channel", exc) from None
        self.notify("delete_channel", topic, channel, "", request)
        return self._action_response(failures)

    async def topic_action(self, request: web.Request) -> web.Response:
        return await self._topic_channel_action(request, request.match_info["topic"], "")

    async def channel_action(self, request: web.Request) -> web.Response:
        match = request.match_info
        return await self._topic_channel_action(request, match["topic"], match["channel"])

    async def _topic_channel_action(
        self, request: web.Request, topic: str, channel: str
    ) -> web.Response:
        self.require_admin(request)
        body = await self.json_body(request)
        try:
            action = string_field(body, "action")
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        if action not in ("pause", "unpause", "empty"):
            raise ApiError(400, "INVALID_ACTION")
        kind = "channel" if channel else "topic"
        failures: list[cluster.Failure] = []
        error: cluster.UpstreamError | None = None
        try:
            failures = await self.ci.topic_channel_action(
                f"{kind}/{action}", topic, channel, self.lookupds, self.nsqds
            )
        except cluster.UpstreamError as exc:
            error = exc
        # Go notifies before it looks at the outcome: even a failed action is audited
        self.notify(f"{action}_{kind}", topic, channel, "", request)
        if error is not None:
            raise upstream_error(self.logger, f"{action} topic/channel", error)
        return self._action_response(failures)

    # ------------------------------------------------------------------ /config

    def _check_config_cidr(self, request: web.Request) -> None:
        cidr = self.opts.allow_config_from_cidr
        if not cidr:
            return
        network = ipaddress.ip_network(cidr, strict=False)
        try:
            remote = ipaddress.ip_address((request.remote or "").split("%")[0])
        except ValueError:
            self.logger.error(f"failed to parse RemoteAddr {request.remote}")
            raise ApiError(400, "INVALID_REMOTE_ADDR") from None
        if isinstance(remote, ipaddress.IPv6Address) and remote.ipv4_mapped is not None:
            remote = remote.ipv4_mapped
        if remote.version != network.version or remote not in network:
            raise ApiError(403, "FORBIDDEN")

    async def config(self, request: web.Request) -> web.Response:
        opt = request.match_info["opt"]
        self._check_config_cidr(request)
        if request.method == "PUT":
            body = await _read_limited(request, 1024 * 1024 + 1)
            if len(body) > 1024 * 1024 or not body:
                raise ApiError(413, "INVALID_VALUE")
            self._put_config(opt, body)
        for spec in specs(Options):
            if spec.cfg == opt and spec.attr not in COMMAND_ONLY and spec.attr not in SECRET:
                return v1_json(render_value(spec.kind, getattr(self.opts, spec.attr)))
        raise ApiError(400, "INVALID_OPTION")

    def _put_config(self, opt: str, body: bytes) -> None:
        if opt == "nsqlookupd_http_addresses":
            try:
                addresses = json.loads(body)
            except ValueError:
                raise ApiError(400, "INVALID_VALUE") from None
            if addresses is None:
                addresses = []
            if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
                raise ApiError(400, "INVALID_VALUE")
            self.admin.set_lookupd_addresses(addresses)
        elif opt == "log_level":
            try:
                level = lg.parse_level(body.decode("utf-8", "replace"))
            except ValueError:
                raise ApiError(400, "INVALID_VALUE") from None
            self.admin.set_log_level(level)
        else:
            raise ApiError(400, "INVALID_OPTION")
