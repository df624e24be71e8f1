"""TextFamilies (nsqd's sliced /metrics) writes exactly what prometheus_client's exposition of
the same families writes, escapes and number formats included."""

from __future__ import annotations

from typing import Any

from nsqpy.internal.metrics import Families, TextFamilies, exposition, new_registry

LABELS = ("type", "topic", "channel", "paused")
VALUES: list[tuple[str, ...]] = [
    ("channel", "plain", "c0", "false"),
    ("channel", 'quote"d', "back\\slash", "true"),
    ("channel", "new\nline", "ünï©ødé#ephemeral", "false"),
]
NUMBERS: list[Any] = [0, 1, True, False, 7, 12345678, 2**53 + 1, 0.1, 1e-9, 3.5e21, float("inf")]


def fill(out: Any) -> None:
    out.gauge("nsq_uptime_seconds", "Seconds since start", (), (), 12.75)
    out.counter("nsq_tcp_bytes_sent", "Bytes \\ written\nto clients", (), (), 98765432101)
    for index, number in enumerate(NUMBERS):
        values = VALUES[index % len(VALUES)]
        out.gauge("nsq_channel_depth", "Queue depth", LABELS, values, number)
        out.counter("nsq_channel_message_count", "Messages", LABELS, values, number)
        quantile = (*LABELS, "quantile")
        out.gauge("nsq_channel_e2e", "Latency", quantile, (*values, "0.99"), number)


def test_text_families_match_the_registry_exposition() -> None:
    text = TextFamilies()
    fill(text)
    reference = exposition(new_registry(fill))
    assert text.exposition() == reference
    assert b"# TYPE nsq_channel_message_count counter\n" in reference  # no _total rename
    assert b'channel="back\\\\slash"' in reference  # escaped, and the same in ours


def test_empty_families_write_nothing() -> None:
    assert TextFamilies().exposition() == exposition(new_registry(lambda out: None)) == b""
    assert isinstance(Families().all(), list)
