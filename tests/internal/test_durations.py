"""Go time.Duration syntax: ParseDuration and Duration.String()."""

from __future__ import annotations

import pytest

from nsqpy.internal.durations import format_duration, parse_duration, to_ms, to_ns


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("0", 0.0),
        ("-0", 0.0),
        ("+0", 0.0),
        ("0s", 0.0),
        ("60s", 60.0),
        ("250ms", 0.25),
        ("1h30m", 5400.0),
        ("1h30m15s", 5415.0),
        ("15m", 900.0),
        ("1h", 3600.0),
        ("2.5s", 2.5),
        ("1.5h", 5400.0),
        (".5s", 0.5),
        ("5.s", 5.0),
        ("300us", 300e-6),
        ("300µs", 300e-6),  # U+00B5 micro sign
        ("300μs", 300e-6),  # U+03BC greek mu
        ("1ns", 1e-9),
        ("-1.5h", -5400.0),
        ("+2s", 2.0),
        ("1m0s", 60.0),
        ("100ms", 0.1),
        ("25ms", 0.025),
        ("3h0m0.5s", 10800.5),
    ],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-12)


def test_missing_unit_message() -> None:
    with pytest.raises(ValueError) as info:
        parse_duration("1")
    assert str(info.value) == 'time: missing unit in duration "1"'


def test_invalid_message() -> None:
    with pytest.raises(ValueError) as info:
        parse_duration("")
    assert str(info.value) == 'time: invalid duration ""'


@pytest.mark.parametrize(
    "text",
    ["", "s", "1x", "1h30", "abc", "-", "+", ".s", "1.5.5s", "1 s", " 60s", "60s ", "1e3s", "1S"],
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    "seconds,text",
    [
        (0, "0s"),
        (1e-9, "1ns"),
        (999e-9, "999ns"),
        (1.5e-6, "1.5µs"),
        (0.001, "1ms"),
        (0.025, "25ms"),
        (0.25, "250ms"),
        (1.0, "1s"),
        (2.5, "2.5s"),
        (60.0, "1m0s"),
        (90.0, "1m30s"),
        (3600.0, "1h0m0s"),
        (5400.0, "1h30m0s"),
        (900.0, "15m0s"),
        (600.0, "10m0s"),
        (1.000000001, "1.000000001s"),
        (-1.0, "-1s"),
        (-0.25, "-250ms"),
        (100 * 3600.0, "100h0m0s"),
    ],
)
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("text", ["1m0s", "250ms", "1h30m0s", "2.5s", "1.5µs", "15m0s", "7ns"])
def test_format_parse_round_trip(text: str) -> None:
    assert format_duration(parse_duration(text)) == text


def test_unit_conversions() -> None:
    assert to_ns(60.0) == 60_000_000_000
    assert to_ns(0.25) == 250_000_000
    assert to_ms(0.25) == 250
    assert to_ms(900.0) == 900_000
    assert to_ns(parse_duration("15m")) == 900_000_000_000
