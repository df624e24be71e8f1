"""``nsqd`` on asyncio's own (selector) event loop instead of uvloop, for the limit tests:
``python -m tests.faults.stdlib_loop_nsqd <nsqd flags>``."""

from __future__ import annotations

import sys

from nsqpy.nsqd import __main__ as command

if __name__ == "__main__":
    command.install_event_loop_policy = lambda: None  # keep the stdlib loop
    sys.exit(command.main())
