"""Cooperative pauses for long parses and compiles."""

from __future__ import annotations

from typing import Callable, Final, Iterable, Iterator, TypeVar

Pause = Callable[[], None]
"""Called every :data:`PAUSE_EVERY` steps of a long parse or compile. A caller that
builds beside the event loop passes one that gives the loop its turn once the build's
time slice is used up, and costs a clock read otherwise (proxy.control.builds):
compiled code never gives up the GIL by itself, and a 10,000-rule config would
otherwise hold it for tens of milliseconds at a time (requests wait that long)."""

# A step is a rule (or a bucket, a table entry): 2-5 us each in a compiled build, so
# the loop waits at most ~20 us past the build's slice. Each call costs ~0.3 us, about
# 3 ms per cold 10,000-rule push in all (2026-12-07).
PAUSE_EVERY: Final = 4

T = TypeVar("T")


def paced(items: Iterable[T], pause: Pause | None) -> Iterator[T]:
    """``items``, calling ``pause`` (if any) after every :data:`PAUSE_EVERY` of them:
    a long loop of a build, written as a plain loop."""
    if pause is None:
        yield from items
        return
    for count, item in enumerate(items, 1):
        yield item
        if count % PAUSE_EVERY == 0:
            pause()
