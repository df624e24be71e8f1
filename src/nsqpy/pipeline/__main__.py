"""``python -m nsqpy.pipeline`` is ``nsqpy-pipeline``."""

import sys

from .cli import main

sys.exit(main())
