"""JSON read and written as Go's ``encoding/json`` does with ``map[string]interface{}``.

nsq_to_nsq's ``--whitelist-json-field`` re-encodes messages, so the bytes must be Go's: keys
sorted, no spaces, numbers as float64 in shortest form (``5`` not ``5.0``, ``1e-7``,
``1e+21``), ``<``, ``>``, ``&``, U+2028 and U+2029 escaped, other non-ASCII text left as UTF-8.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

__all__ = ["GoJSONError", "go_float", "marshal", "unmarshal_object"]


class GoJSONError(ValueError):
    """Not a JSON object Go would decode into a map."""


def _reject_constant(name: str) -> float:
    raise GoJSONError(f"invalid character in {name}")  # NaN/Infinity are not JSON


def unmarshal_object(data: bytes) -> dict[str, Any]:
    """``json.Unmarshal(data, &map[string]interface{}{})``: numbers are floats, ``null`` is an
    empty map, anything but an object is an error."""
    text = data.decode("utf-8", errors="replace")  # Go replaces invalid UTF-8 with U+FFFD
    try:
        value = json.loads(
            text, parse_int=float, parse_float=float, parse_constant=_reject_constant
        )
    except ValueError as exc:
        raise GoJSONError(str(exc)) from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise GoJSONError(f"cannot unmarshal {type(value).__name__} into map")
    return value


def go_float(value: float) -> str:
    """encoding/json's float64: shortest digits, ``'f'`` form unless the exponent is < -6 or
    >= 21, and ``e-07`` cleaned to ``e-7``."""
    if value != value or value in (float("inf"), float("-inf")):
        raise GoJSONError(f"json: unsupported value: {value}")
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        text = repr(value)
        mantissa, _, exponent = text.partition("e")
        sign = exponent[0]
        digits = exponent[1:].lstrip("0") or "0"
        if sign == "+" and len(digits) < 2:
            digits = digits.rjust(2, "0")
        return f"{mantissa}e{sign}{digits}"
    text = format(Decimal(repr(value)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def _string(text: str) -> str:
    out = ['"']
    for char in text:
        escaped = _ESCAPES.get(char)
        if escaped is not None:
            out.append(escaped)
        elif char < " ":
            out.append(f"\\u{ord(char):04x}")
        elif "\ud800" <= char <= "\udfff":  # a lone surrogate: Go writes U+FFFD
            out.append("\ufffd")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(go_float(value))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, dict):
        out.append("{")
        for i, key in enumerate(sorted(value)):
            if i:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _encode(value[key], out)
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise GoJSONError(f"json: unsupported type: {type(value).__name__}")


def marshal(value: Any) -> bytes:
    """``json.Marshal`` of decoded JSON values (maps with sorted keys)."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out).encode("utf-8", errors="surrogatepass")
