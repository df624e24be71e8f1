"""Exceptions shared across nsqd's modules."""


class BackendWriteError(Exception):
    """A message could not be written to its disk queue (full disk, I/O error)."""


class NeedsReauth(Exception):
    """A command needs the expired AUTH state refreshed (asynchronously) before it can run."""
