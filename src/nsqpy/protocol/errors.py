"""NSQ protocol errors: ``<CODE> <description>`` frames, fatal or not."""

from __future__ import annotations

import unicodedata

#: The only error codes after which nsqd keeps the connection open.
NON_FATAL_CODES = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})


class ProtocolError(Exception):
    """An error the server reports to the client as ``FRAME(1, "<code> <desc>")``."""

    def __init__(self, code: str, desc: str) -> None:
        super().__init__(f"{code} {desc}")
        self.code = code
        self.desc = desc

    @property
    def fatal(self) -> bool:
        return self.code not in NON_FATAL_CODES

    def to_bytes(self) -> bytes:
        return f"{self.code} {self.desc}".encode()


#: strconv.Quote's single-letter escapes (besides the quote and the backslash).
_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    '"': '\\"',
    "\\": "\\\\",
}


def _go_printable(ch: str) -> bool:
    """Go's strconv.IsPrint: letters, marks, numbers, punctuation, symbols and ASCII space."""
    return ch == " " or unicodedata.category(ch)[0] in "LMNPS"


def go_quote(value: str | bytes) -> str:
    """Quote like Go's ``%q`` (strconv.Quote) for the strings that appear in NSQ errors.

    Bytes that are not valid UTF-8 come out as ``\\xNN``, one per byte, as Go does.
    """
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="surrogateescape")
    out = ['"']
    for ch in value:
        code = ord(ch)
        escaped = _GO_ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif 0xDC80 <= code <= 0xDCFF:  # an invalid UTF-8 byte carried by surrogateescape
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif _go_printable(ch):
            out.append(ch)
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)
