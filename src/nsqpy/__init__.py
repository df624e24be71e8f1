"""nsqpy: a wire-compatible Python implementation of NSQ."""

__version__ = "0.1.0"

#: The NSQ protocol level we implement, reported on the wire, in /info and in /stats.
NSQ_VERSION = "1.3.0"


def version_line(program: str) -> str:
    """``nsqd v1.3.0 (built w/python3.11.7)``: Go's version string, with our runtime."""
    import platform

    return f"{program} v{NSQ_VERSION} (built w/python{platform.python_version()})"
