"""When an HTTP/2 backend connection is pinged, given up on, or closed for idleness.

A connection of :mod:`proxy.upstream.h2c` carries many streams and may stay quiet for
long. A backend that hung, or vanished without a FIN or RST (a dead node, a dropped NAT
entry), would hold all of them: TCP keepalive notices only a dead peer, and slowly. So,
as Go's h2c backend does, a connection that read nothing for a while asks for a sign of
life (a PING) and is given up when none comes; one without streams closes after the
pool's idle timeout.

One timer per connection covers all three deadlines: it is set for the nearest one
and, when it fires, decides what is due and sets itself for the next. A read only
notes the time: one clock read per read, never a timer reset on the hot path.
"""

from __future__ import annotations

import asyncio
from typing import Callable


class Liveness:
    """The read silence and idleness of one connection, watched with one timer.

    ``ping`` is called once ``ping_after`` seconds passed without a byte read (the
    owner sends a PING); ``unanswered`` when still nothing was read ``ping_timeout``
    seconds after that PING; ``expired`` once the connection has been idle ``idle_timeout``
    seconds. After ``unanswered`` or ``expired`` the timer is not set again: the owner
    closes the connection. The owner reports each read (:meth:`heard`) and each change
    between idle and busy (:meth:`idle`, :meth:`busy`); the timer runs from :meth:`start`
    until :meth:`stop`.
    """

    __slots__ = ("_loop", "_ping_after", "_ping_timeout", "_idle_timeout", "_ping",
                 "_unanswered", "_expired", "_last_read", "_ping_sent", "_idle_since",
                 "_timer", "_stopped")

    def __init__(self, loop: asyncio.AbstractEventLoop, *, ping_after: float,
                 ping_timeout: float, idle_timeout: float, ping: Callable[[], None],
                 unanswered: Callable[[], None], expired: Callable[[], None]) -> None:
        self._loop = loop
        self._ping_after = ping_after
        self._ping_timeout = ping_timeout
        self._idle_timeout = idle_timeout
        self._ping = ping
        self._unanswered = unanswered
        self._expired = expired
        self._last_read = loop.time()
        self._ping_sent: float | None = None  # when the PING still unanswered went out
        self._idle_since: float | None = None  # None while the connection is busy
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = False

    def start(self) -> None:
        """The connection is open, idle and just heard from: set the timer."""
        self._idle_since = self._last_read = self._loop.time()
        self._arm()

    def heard(self) -> None:
        """Bytes arrived from the backend: it is alive."""
        self._last_read = self._loop.time()

    def busy(self) -> None:
        """A stream started: the connection is not idle."""
        self._idle_since = None

    def idle(self) -> None:
        """The last stream ended: the idle timeout runs from now. The timer is not
        reset for it: it fires within ``ping_after`` anyway and then sees the deadline."""
        self._idle_since = self._loop.time()

    def stop(self) -> None:
        """The connection is closed: cancel the timer for good."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        if self._ping_sent is not None:
            due = self._ping_sent + self._ping_timeout
        else:
            due = self._last_read + self._ping_after
        if self._idle_since is not None:
            due = min(due, self._idle_since + self._idle_timeout)
        self._timer = self._loop.call_at(due, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self._stopped:
            return
        now = self._loop.time()
        if self._ping_sent is not None:
            if self._last_read > self._ping_sent:
                self._ping_sent = None  # the backend is alive
            elif now >= self._ping_sent + self._ping_timeout:
                self._unanswered()
                return
        if self._idle_since is not None and now >= self._idle_since + self._idle_timeout:
            self._expired()
            return
        if self._ping_sent is None and now >= self._last_read + self._ping_after:
            self._ping()
            self._ping_sent = now
        self._arm()
