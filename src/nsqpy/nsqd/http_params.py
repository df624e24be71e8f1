"""How nsqd's HTTP handlers read a request's parameters, as Go's nsqd reads them: the query
string only (Go's ``url.ParseQuery``: first value wins, a malformed escape is an error), and
the ``topic``/``channel`` arguments with Go's error codes. Shared by http.py (Go's routes) and
beyond/http.py (nsqpy's)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from aiohttp import web

from ..internal.http_api import ApiError
from ..protocol import is_valid_channel_name, is_valid_topic_name

if TYPE_CHECKING:
    from .nsqd import NSQD
    from .topic import Topic

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def query(request: web.Request) -> dict[str, list[str]]:
    """The URL query string only (never a form body); Go's first-value-wins lists.

    Like Go's url.ParseQuery, a malformed escape or a ``;`` separator is INVALID_REQUEST.
    """
    raw = request.rel_url.raw_query_string
    if _BAD_ESCAPE.search(raw) or ";" in raw:
        raise ApiError(400, "INVALID_REQUEST")
    return parse_qs(raw, keep_blank_values=True)


def first(params: dict[str, list[str]], key: str) -> str | None:
    values = params.get(key)
    return values[0] if values else None


def existing_topic(nsqd: NSQD, params: dict[str, list[str]], validate: bool) -> Topic:
    """The ``topic`` argument's topic; 404 ``TOPIC_NOT_FOUND`` if nsqd has none of that name
    (``validate``: an invalid name is ``INVALID_TOPIC`` first, as some of Go's routes check)."""
    name = first(params, "topic")
    if name is None:
        raise ApiError(400, "MISSING_ARG_TOPIC")
    if validate and not is_valid_topic_name(name):
        raise ApiError(400, "INVALID_TOPIC")
    topic = nsqd.get_existing_topic(name)
    if topic is None:
        raise ApiError(404, "TOPIC_NOT_FOUND")
    return topic


def channel_args(nsqd: NSQD, params: dict[str, list[str]]) -> tuple[Topic, str]:
    """Go's ``getTopicChan``: the existing topic and the (valid) channel name."""
    topic_name = first(params, "topic")
    if topic_name is None:
        raise ApiError(400, "MISSING_ARG_TOPIC")
    if not is_valid_topic_name(topic_name):
        raise ApiError(400, "INVALID_ARG_TOPIC")
    channel_name = first(params, "channel")
    if channel_name is None:
        raise ApiError(400, "MISSING_ARG_CHANNEL")
    if not is_valid_channel_name(channel_name):
        raise ApiError(400, "INVALID_ARG_CHANNEL")
    topic = nsqd.get_existing_topic(topic_name)
    if topic is None:
        raise ApiError(404, "TOPIC_NOT_FOUND")
    return topic, channel_name
