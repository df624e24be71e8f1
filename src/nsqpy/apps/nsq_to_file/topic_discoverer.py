"""A file logger per topic: the ``--topic`` list, or every topic nsqlookupd knows that matches
``--topic-pattern``, looked up every ``--topic-refresh`` (Go: topic_discoverer.go)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence

from ...internal import lg
from ...internal.api_client import ApiClient, RequestError, api_url
from .. import common
from .._go_config import ClientConfig
from .file_logger import FileLogger
from .options import Options

PROGRAM = "nsq_to_file"


class TopicDiscoverer:
    def __init__(self, opts: Options, config: ClientConfig, logger: lg.Logger) -> None:
        self.opts = opts
        self.config = config
        self.logger = logger
        self.topics: dict[str, FileLogger] = {}
        self._pattern = re.compile(opts.topic_pattern) if opts.topic_pattern else None

    async def run(self, stop: asyncio.Event) -> None:
        """Archive until ``stop`` is set, then flush every file and return."""
        await self.update_topics(self.opts.topic, fatal=True)
        refresher: asyncio.Task[None] | None = None
        if not self.opts.topic and self.opts.topic_refresh > 0:
            refresher = asyncio.get_running_loop().create_task(self._refresh())
        try:
            await stop.wait()
        finally:
            if refresher is not None:
                refresher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await refresher
            await asyncio.gather(*(fl.stop() for fl in self.topics.values()))

    def hup(self) -> None:
        for file_logger in self.topics.values():
            file_logger.hup()

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self.opts.topic_refresh)
            topics = await self.lookupd_topics()
            await self.update_topics(topics)

    def is_topic_allowed(self, topic: str) -> bool:
        return self._pattern is None or self._pattern.search(topic) is not None

    async def update_topics(self, topics: Sequence[str], fatal: bool = False) -> None:
        """Start a file logger for each new allowed topic; with ``fatal`` (the ``--topic``
        list at start-up) a failure ends the tool, else it is logged and retried later."""
        for topic in topics:
            if topic in self.topics:
                continue
            if not self.is_topic_allowed(topic):
                self.logger.warn(
                    f"skipping topic {topic} (doesn't match pattern {self.opts.topic_pattern})"
                )
                continue
            try:
                self.topics[topic] = await self._start_logger(topic)
            except (common.FatalError, ValueError) as exc:
                if fatal:
                    raise common.FatalError(str(exc)) from None
                self.logger.error(f"couldn't create logger for new topic {topic}: {exc}")

    async def _start_logger(self, topic: str) -> FileLogger:
        file_logger = FileLogger(self.opts, topic, self.logger)
        consumer = common.make_consumer(
            PROGRAM, topic, self.opts.channel, file_logger.handle, self.opts, self.config
        )
        await common.start_consumer(consumer)
        file_logger.start(consumer)
        return file_logger

    async def lookupd_topics(self) -> list[str]:
        """The sorted union of every nsqlookupd's ``/topics`` (Go: GetLookupdTopics); the
        lookupd that fail are logged and the others' topics still used."""
        client = ApiClient(
            self.opts.http_client_connect_timeout, self.opts.http_client_request_timeout
        )
        found: set[str] = set()
        try:
            for address in self.opts.lookupd_http_address:
                url = api_url(address, "topics")
                try:
                    body = await client.get_v1(url)
                    found.update(body["topics"] or ())
                except (RequestError, KeyError, TypeError) as e:
                    self.logger.error(f"could not retrieve topic list: {url} - {e}")
        finally:
            await client.close()
        return sorted(found)
