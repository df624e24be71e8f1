"""Topic and channel name rules (Go: internal/protocol/names.go)."""

import re

EPHEMERAL_SUFFIX = "#ephemeral"
MAX_NAME_LENGTH = 64

# fullmatch, not match with `$`: Python's `$` also matches before a trailing newline, Go's does not
_VALID_NAME = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")


def is_valid_name(name: str) -> bool:
    """True if ``name`` is a legal topic or channel name (1-64 chars of ``[.a-zA-Z0-9_-]``)."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _VALID_NAME.fullmatch(name) is not None


is_valid_topic_name = is_valid_name
is_valid_channel_name = is_valid_name


def is_ephemeral(name: str) -> bool:
    return name.endswith(EPHEMERAL_SUFFIX)
