"""NSQ protocol errors: ``<CODE> <description>`` frames, fatal or not."""

from __future__ import annotations

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


def go_quote(value: str | bytes) -> str:
    """Quote like Go's ``%q`` for the strings that appear in NSQ error messages."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="surrogateescape")
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif 0xDC80 <= code <= 0xDCFF:  # an invalid UTF-8 byte carried by surrogateescape
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)
