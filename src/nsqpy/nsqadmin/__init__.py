"""nsqadmin: the operator's web UI for an NSQ cluster (Go: nsqadmin/).

:mod:`nsqpy.internal.clusterinfo` queries and aggregates the cluster (nsq_stat uses it too);
:class:`NSQAdmin` is the daemon as a library; ``python -m nsqpy.nsqadmin`` the command.
"""

from .nsqadmin import ConfigError, NSQAdmin
from .options import Options

__all__ = ["ConfigError", "NSQAdmin", "Options"]
