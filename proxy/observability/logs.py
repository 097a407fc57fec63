"""Keeping the log readable when something repeats or is huge.

:class:`RateLimit` lets one line of a repeated event through per interval and counts
the others, so that line can say how many it stands for (a connection flood must not
become a log flood). :func:`clip` caps a logged value: a log line carries a field's
beginning and its size, never a whole pushed config.
"""

from __future__ import annotations

# The one clip, shared with the config validator's error messages (routing is sans-IO
# and imports nothing from proxy, so it lives there); re-exported for the log's users.
from routing.values import MAX_VALUE_CHARS, clip

__all__ = ["MAX_VALUE_CHARS", "RateLimit", "clip"]


class RateLimit:
    """One occurrence per ``interval`` seconds gets through :meth:`allow`.

    The caller supplies the clock (``loop.time()``, ``time.monotonic()``), so one
    instance per event source needs no timer of its own.
    """

    __slots__ = ("interval", "_next", "_suppressed")

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._next = float("-inf")
        self._suppressed = 0

    def allow(self, now: float) -> int | None:
        """None: stay quiet (this occurrence is counted). Otherwise log now: the value
        is how many occurrences were kept quiet since the last one allowed."""
        if now < self._next:
            self._suppressed += 1
            return None
        self._next = now + self.interval
        suppressed, self._suppressed = self._suppressed, 0
        return suppressed
