"""nsqadmin's secret for nsqd's inspection routes (``--nsqd-auth-secret``).

An nsqd run with ``--auth-http-address`` shows message bodies only to a caller whose secret may
SUB to the channel (``X-NSQ-Auth-Secret``, docs/beyond-go.md). nsqadmin sends its secret with
those three requests and with no other: nsqlookupd and every other nsqd route never see it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import aiohttp

from ..internal import lg
from ..internal.api_client import (
    V1_REQUEST_HEADERS,
    ApiClient,
    RequestError,
    decode_v1,
    go_http_error,
)
from ..internal.clusterinfo import ClusterInfo
from ..protocol.errors import go_quote

#: nsqd.beyond.inspect.AUTH_SECRET_HEADER (not imported: that would load all of nsqd into nsqadmin).
AUTH_SECRET_HEADER = "X-NSQ-Auth-Secret"
#: nsqd's routes that answer message bodies (``--enable-inspect``).
INSPECT_PATHS = frozenset({"/channel/peek", "/channel/inflight", "/channel/deferred"})


class SecretInspectingClusterInfo(ClusterInfo):
    """ClusterInfo whose inspection requests to nsqd carry ``secret``."""

    def __init__(self, client: ApiClient, logger: lg.Logger | None, secret: str) -> None:
        super().__init__(client, logger)
        self._headers = {**V1_REQUEST_HEADERS, AUTH_SECRET_HEADER: secret}

    async def _get(self, url: str, daemon: str) -> Any:
        if daemon != "nsqd" or urlsplit(url).path not in INSPECT_PATHS:
            return await super()._get(url, daemon)
        self._log(f"CI: querying {daemon} {url} (with the nsqd auth secret)")
        try:
            async with self.client.session().get(url, headers=self._headers) as response:
                body = await response.read()
                status, reason = response.status, response.reason or ""
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RequestError(f'Get "{url}": {go_http_error(exc)}') from None
        if status != 200:
            text = go_quote(body.decode("utf-8", "replace"))
            raise RequestError(f"got response {status} {reason} {text}", status, body)
        return decode_v1(url, body)
