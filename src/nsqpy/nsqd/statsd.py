"""Push stats to statsd over UDP (Go: nsqd/statsd.go, internal/statsd, internal/writers).

Every --statsd-interval: counters (deltas since the last push) and gauges for each topic and
channel, plus memory figures, as ``<prefix><stat>:<value>|c`` / ``|g`` lines packed into
datagrams of at most --statsd-udp-packet-size bytes (a line is never split) and spread evenly
over the interval minus a second.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..internal.net import split_host_port
from .stats import get_stats, memory_stats

if TYPE_CHECKING:
    from .nsqd import NSQD

MEM_GAUGES = (
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
)


def statsd_prefix(template: str, broadcast_address: str, broadcast_http_port: int) -> str:
    """``nsq.%s`` with %s the host key ``<address>_<http port>`` (dots and colons as _)."""
    host_key = f"{broadcast_address}:{broadcast_http_port}".replace(".", "_").replace(":", "_")
    prefix = template.replace("%s", host_key)
    if prefix and not prefix.endswith("."):
        prefix += "."
    return prefix


def pack_datagrams(lines: list[bytes], size: int) -> list[bytes]:
    """Go's BoundaryBufferedWriter: lines packed into datagrams of at most ``size`` bytes."""
    datagrams: list[bytes] = []
    current = b""
    for line in lines:
        if current and len(current) + len(line) > size:
            datagrams.append(current)
            current = b""
        current += line
    if current:
        datagrams.append(current)
    return datagrams


class StatsdPusher:
    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self._last: dict[str, int] = {}

    async def run(self) -> None:
        opts = self.nsqd.options
        while True:
            await asyncio.sleep(opts.statsd_interval)
            try:
                await self.push()
            except OSError as exc:
                self.nsqd.logger.error(f"failed to create UDP socket to statsd({exc})")

    def collect(self) -> list[bytes]:
        """One push's lines; counters are deltas since the previous collect."""
        opts = self.nsqd.options
        prefix = statsd_prefix(
            opts.statsd_prefix,
            opts.broadcast_address,
            opts.broadcast_http_port or self.nsqd.http_port,
        )
        lines: list[bytes] = []
        current: dict[str, int] = {}

        def incr(stat: str, total: int) -> None:
            current[stat] = total
            lines.append(f"{prefix}{stat}:{total - self._last.get(stat, 0)}|c\n".encode())

        def gauge(stat: str, value: Any) -> None:
            lines.append(f"{prefix}{stat}:{int(value)}|g\n".encode())

        topics, _ = get_stats(self.nsqd, "", "", include_clients=False)
        skip = opts.statsd_exclude_ephemeral
        for topic in topics or []:
            name = topic["topic_name"]
            if skip and name.endswith("#ephemeral"):
                continue
            incr(f"topic.{name}.message_count", topic["message_count"])
            incr(f"topic.{name}.message_bytes", topic["message_bytes"])
            gauge(f"topic.{name}.depth", topic["depth"])
            gauge(f"topic.{name}.backend_depth", topic["backend_depth"])
            for item in topic["e2e_processing_latency"]["percentiles"] or []:
                pct = round(item["quantile"] * 100)
                gauge(f"topic.{name}.e2e_processing_latency_{pct}", item["value"])
            for channel in topic["channels"]:
                cname = channel["channel_name"]
                if skip and cname.endswith("#ephemeral"):
                    continue
                base = f"topic.{name}.channel.{cname}"
                incr(f"{base}.message_count", channel["message_count"])
                gauge(f"{base}.depth", channel["depth"])
                gauge(f"{base}.backend_depth", channel["backend_depth"])
                gauge(f"{base}.in_flight_count", channel["in_flight_count"])
                gauge(f"{base}.deferred_count", channel["deferred_count"])
                incr(f"{base}.requeue_count", channel["requeue_count"])
                incr(f"{base}.timeout_count", channel["timeout_count"])
                gauge(f"{base}.clients", channel["client_count"])
                for item in channel["e2e_processing_latency"]["percentiles"] or []:
                    pct = round(item["quantile"] * 100)
                    gauge(f"{base}.e2e_processing_latency_{pct}", item["value"])
        if opts.statsd_mem_stats:
            memory = memory_stats()
            for key in MEM_GAUGES:
                gauge(f"mem.{key}", memory[key])
            incr("mem.gc_runs", memory["gc_total_runs"])
        self._last = current
        return lines

    async def push(self) -> None:
        opts = self.nsqd.options
        host, port = split_host_port(opts.statsd_address)
        datagrams = pack_datagrams(self.collect(), opts.statsd_udp_packet_size)
        self.nsqd.logger.info(f"STATSD: pushing stats to {opts.statsd_address}")
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            asyncio.DatagramProtocol, remote_addr=(host, int(port))
        )
        try:
            # Go's SpreadWriter: spread the datagrams over the interval minus a second
            gap = max(0.0, opts.statsd_interval - 1.0) / max(1, len(datagrams))
            for datagram in datagrams:
                transport.sendto(datagram)
                await asyncio.sleep(gap)
        finally:
            transport.close()
