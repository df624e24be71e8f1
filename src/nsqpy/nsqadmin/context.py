"""What every nsqadmin handler reads (the options, the logger, the cluster client, the ACL),
and how a handler reports the daemons that did not answer (Go's ``WARNING:`` message)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from ..internal import clusterinfo as cluster
from ..internal import lg
from ..internal.http_api import ApiError
from .options import Options

if TYPE_CHECKING:
    from .nsqadmin import NSQAdmin


def warning_message(messages: list[str]) -> str:
    """Go's ``maybeWarnMsg``."""
    return "WARNING: " + "; ".join(messages) if messages else ""


class Warnings:
    """The partial failures of one request: Go's message list plus nsqpy's ``unreachable``."""

    def __init__(self, logger: lg.Logger) -> None:
        self.logger = logger
        self.messages: list[str] = []
        self.failures: list[cluster.Failure] = []

    def add(self, failures: list[cluster.Failure]) -> None:
        if failures:
            text = "\n".join(f.error for f in failures)
            self.logger.warn(text)
            self.messages.append(text)
            self.failures.extend(failures)

    @property
    def message(self) -> str:
        return warning_message(self.messages)

    def unreachable(self) -> list[dict[str, str]]:
        seen: dict[str, str] = {}
        for failure in self.failures:
            seen.setdefault(failure.address, failure.error)
        return [{"address": a, "error": e} for a, e in seen.items()]


def upstream_error(logger: lg.Logger, what: str, exc: cluster.UpstreamError) -> ApiError:
    logger.error(f"failed to {what} - {exc}")
    return ApiError(502, f"UPSTREAM_ERROR: {exc}")


class AdminContext:
    """The state behind every route handler; ``admin`` holds the options, the cluster client
    and the poller."""

    def __init__(self, admin: NSQAdmin) -> None:
        self.admin = admin
        self.base = admin.base_path

    @property
    def opts(self) -> Options:
        return self.admin.options

    @property
    def logger(self) -> lg.Logger:
        return self.admin.logger

    @property
    def ci(self) -> cluster.ClusterInfo:
        return self.admin.ci

    @property
    def lookupds(self) -> list[str]:
        return self.opts.nsqlookupd_http_addresses

    @property
    def nsqds(self) -> list[str]:
        return self.opts.nsqd_http_addresses

    # ------------------------------------------------------------------ ACL

    def admin_user(self, request: web.Request) -> str:
        return request.headers.get(self.opts.acl_http_header, "")

    def is_admin(self, request: web.Request) -> bool:
        users = self.opts.admin_users
        return not users or self.admin_user(request) in users

    def require_admin(self, request: web.Request) -> None:
        if not self.is_admin(request):
            raise ApiError(403, "FORBIDDEN")
