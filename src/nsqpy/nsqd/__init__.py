"""nsqd: the daemon that receives, queues and delivers messages."""

from .nsqd import NSQD, NSQDError
from .options import Options

__all__ = ["NSQD", "NSQDError", "Options"]
