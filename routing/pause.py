"""Cooperative pauses for long parses and compiles."""

from __future__ import annotations

from typing import Callable, Final

Pause = Callable[[], None]
"""Called every :data:`PAUSE_EVERY` steps of a long parse or compile. A caller that
builds in a worker thread passes one that lets the event-loop thread take the GIL:
compiled code never gives it up by itself, and a 10,000-rule config would otherwise
hold it for tens of milliseconds at a time (requests wait that long)."""

# Measured on a quiet 2-core host with a compiled build (2026-12-07): pausing every 8
# rules with a 0.2 ms time slice brought request p99 during a cold 10,000-rule push from
# 3.3x to 2.7x the p99 without pushes, but raised add -> first 200 at 5,000 routes from
# 7.4 to 10.5 ms (p50; each pause's sleep costs timer slack): 128 stays.
PAUSE_EVERY: Final = 128
