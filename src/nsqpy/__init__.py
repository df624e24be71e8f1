"""nsqpy: a wire-compatible Python implementation of NSQ."""

__version__ = "0.1.0"

#: The NSQ protocol level we implement, reported on the wire, in /info and in /stats.
NSQ_VERSION = "1.3.0"
