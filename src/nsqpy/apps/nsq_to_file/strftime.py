"""``--datetime-format``: strftime directives rendered the way Go's nsq_to_file renders them.

Go (apps/nsq_to_file/strftime.go) translates each known ``%X`` into a Go reference-time
layout element and formats the whole string with ``time.Format``; every other character is
kept as layout text. So the literal text is itself read as a Go layout: ``v1`` prints ``v11``
in November, ``Mon`` prints the weekday. Drop-in file names need that quirk too, so this module
builds the same layout and formats it with a small port of Go's layout scanner.
"""

from __future__ import annotations

import datetime as _dt
import time

# strftime directive -> Go layout element (the subset Go's nsq_to_file knows)
_CONVERSION = {
    "B": "January",
    "b": "Jan",
    "m": "01",
    "A": "Monday",
    "a": "Mon",
    "d": "02",
    "H": "15",
    "I": "03",
    "M": "04",
    "S": "05",
    "Y": "2006",
    "y": "06",
    "p": "PM",
    "Z": "MST",
    "z": "-0700",
    "%": "%",
}

_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def go_layout(fmt: str) -> str:
    """The Go layout string Go's strftime() builds from a strftime format."""
    out: list[str] = []
    i = 0
    while i < len(fmt):
        if fmt[i] == "%" and i + 1 < len(fmt) and fmt[i + 1] in _CONVERSION:
            out.append(_CONVERSION[fmt[i + 1]])
            i += 2
            continue
        out.append(fmt[i])
        i += 1
    return "".join(out)


def strftime(fmt: str, when: _dt.datetime | None = None) -> str:
    """Render ``fmt`` for ``when`` (default: now, local time) as Go's nsq_to_file does."""
    moment = when if when is not None else _dt.datetime.now().astimezone()
    return go_format(go_layout(fmt), moment)


# --------------------------------------------------------------------------- Go's time.Format


def _starts_lower(text: str) -> bool:
    return bool(text) and "a" <= text[0] <= "z"


def _next_chunk(layout: str) -> tuple[str, str, str]:
    """Go's nextStdChunk: (literal prefix, layout element or "", rest)."""
    n = len(layout)
    for i, c in enumerate(layout):
        rest = layout[i:]
        if c == "J" and rest.startswith("Jan"):
            if rest.startswith("January"):
                return layout[:i], "January", layout[i + 7 :]
            if not _starts_lower(layout[i + 3 :]):
                return layout[:i], "Jan", layout[i + 3 :]
        elif c == "M" and n >= i + 3:
            if rest.startswith("Mon"):
                if rest.startswith("Monday"):
                    return layout[:i], "Monday", layout[i + 6 :]
                if not _starts_lower(layout[i + 3 :]):
                    return layout[:i], "Mon", layout[i + 3 :]
            if rest.startswith("MST"):
                return layout[:i], "MST", layout[i + 3 :]
        elif c == "0":
            if n >= i + 2 and "1" <= layout[i + 1] <= "6":
                return layout[:i], layout[i : i + 2], layout[i + 2 :]
            if rest.startswith("002"):
                return layout[:i], "002", layout[i + 3 :]
        elif c == "1":
            if rest.startswith("15"):
                return layout[:i], "15", layout[i + 2 :]
            return layout[:i], "1", layout[i + 1 :]
        elif c == "2":
            if rest.startswith("2006"):
                return layout[:i], "2006", layout[i + 4 :]
            return layout[:i], "2", layout[i + 1 :]
        elif c == "_":
            if rest.startswith("_2"):
                if rest.startswith("_2006"):  # a literal "_" then the long year
                    return layout[: i + 1], "2006", layout[i + 5 :]
                return layout[:i], "_2", layout[i + 2 :]
            if rest.startswith("__2"):
                return layout[:i], "__2", layout[i + 3 :]
        elif c in "345":
            return layout[:i], c, layout[i + 1 :]
        elif c == "P" and rest.startswith("PM"):
            return layout[:i], "PM", layout[i + 2 :]
        elif c == "p" and rest.startswith("pm"):
            return layout[:i], "pm", layout[i + 2 :]
        elif c in "-Z":
            for element in (c + "070000", c + "07:00:00", c + "0700", c + "07:00", c + "07"):
                if rest.startswith(element):
                    return layout[:i], element, layout[i + len(element) :]
        elif c in ".," and n > i + 1 and layout[i + 1] in "09":
            j = i + 1
            while j < n and layout[j] == layout[i + 1]:
                j += 1
            if not (j < n and layout[j].isdigit()):
                return layout[:i], layout[i:j], layout[j:]
    return layout, "", ""


def _chunks(layout: str) -> list[tuple[str, str]]:
    """The layout as (literal text, element) pairs; element "" at the end."""
    chunks = []
    while layout:
        prefix, element, layout = _next_chunk(layout)
        chunks.append((prefix, element))
    return chunks


def go_format(layout: str, t: _dt.datetime) -> str:
    """Go's ``Time.Format(layout)`` for the elements Go defines."""
    return _format_chunks(_chunks(layout), t)


def _format_chunks(chunks: list[tuple[str, str]], t: _dt.datetime) -> str:
    return "".join(prefix + (_render(element, t) if element else "") for prefix, element in chunks)


class DatetimeFormat:
    """A ``--datetime-format`` parsed once; :meth:`render` is called for every message, so
    the text is reused within a second (unless the layout shows fractions of one)."""

    def __init__(self, fmt: str) -> None:
        self._chunks = _chunks(go_layout(fmt))
        self._subsecond = any(element[:1] in (".", ",") for _, element in self._chunks)
        self._second = -1
        self._text = ""

    def render(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second or self._subsecond:
            moment = _dt.datetime.fromtimestamp(now).astimezone()
            self._text = _format_chunks(self._chunks, moment)
            self._second = second
        return self._text


def _render(element: str, t: _dt.datetime) -> str:
    hour12 = t.hour % 12 or 12
    yday = t.timetuple().tm_yday
    simple = {
        "January": _MONTHS[t.month - 1],
        "Jan": _MONTHS[t.month - 1][:3],
        "1": str(t.month),
        "01": f"{t.month:02d}",
        "Monday": _DAYS[t.weekday()],
        "Mon": _DAYS[t.weekday()][:3],
        "2": str(t.day),
        "_2": f"{t.day:2d}",
        "02": f"{t.day:02d}",
        "__2": f"{yday:3d}",
        "002": f"{yday:03d}",
        "15": f"{t.hour:02d}",
        "3": str(hour12),
        "03": f"{hour12:02d}",
        "4": str(t.minute),
        "04": f"{t.minute:02d}",
        "5": str(t.second),
        "05": f"{t.second:02d}",
        "2006": f"{t.year:04d}",
        "06": f"{t.year % 100:02d}",
        "PM": "PM" if t.hour >= 12 else "AM",
        "pm": "pm" if t.hour >= 12 else "am",
    }
    if element in simple:
        return simple[element]
    delta = t.utcoffset()
    offset = int(delta.total_seconds()) if delta is not None else 0
    if element == "MST":
        name = t.tzname() or ""
        return name if name else _numeric_zone("-0700", offset)
    if element[0] in "-Z":
        if element[0] == "Z" and offset == 0:
            return "Z"
        return _numeric_zone(element, offset)
    return _fraction(element, t.microsecond * 1000)


def _numeric_zone(element: str, offset: int) -> str:
    sign = "-" if offset < 0 else "+"
    offset = abs(offset)
    minutes = offset // 60
    text = sign + f"{minutes // 60:02d}"
    colon = ":" in element
    if element[1:] not in ("07",):
        text += (":" if colon else "") + f"{minutes % 60:02d}"
    if element[1:] in ("070000", "07:00:00"):
        text += (":" if colon else "") + f"{offset % 60:02d}"
    return text


def _fraction(element: str, nanos: int) -> str:
    """``.000`` keeps every digit; ``.999`` drops trailing zeros (and the dot if nothing is
    left)."""
    digits = len(element) - 1
    text = f"{nanos:09d}"[:digits]
    if element[1] == "9":
        text = text.rstrip("0")
        return element[0] + text if text else ""
    return element[0] + text
