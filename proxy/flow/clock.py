"""The clocks the request path reads, as compiled constants.

A function a compiled module imports from a module mypyc does not compile (``from time
import monotonic``) stays a name in the module's globals, looked up in that dictionary
at every call (about 130 instructions, four times a request); a ``Final`` name of a
compiled module is a static load, in every compiled module that imports it.
"""

from __future__ import annotations

import time
from typing import Final

MONOTONIC: Final = time.monotonic  # durations (metrics, access log)
WALL_CLOCK: Final = time.time  # the Date field of responses
