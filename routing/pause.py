"""Cooperative pauses for long parses and compiles."""

from __future__ import annotations

from typing import Callable, Final

Pause = Callable[[], None]
"""Called every :data:`PAUSE_EVERY` steps of a long parse or compile. A caller that
builds in a worker thread passes one that lets the event-loop thread take the GIL:
compiled code never gives it up by itself, and a 10,000-rule config would otherwise
hold it for tens of milliseconds at a time (requests wait that long)."""

PAUSE_EVERY: Final = 8  # rules: well under the pacer's slice (proxy.control.builds)
