"""The cap on one pool's connections to its backend (``max_connections``; 0 = none).

Connections open and dials in progress both count. A dial reserves its slot before it
starts and gives it back when it ends (the connection then counts, if it opened). A
request that finds the pool at its cap waits, first come first served, for a connection
another exchange releases or a slot a closed connection frees — only when no connection
was idle, so never on the path of a warm pool.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from proxy.upstream.http1 import UpstreamConnection

# Where a grant goes when its waiter gave up just then: a connection back to the pool,
# or (None) the slot back to the cap.
GiveBack = Callable[["UpstreamConnection | None"], None]


class ConnectionCap:
    """Slots and waiters of one pool; ``open_count`` is the pool's open connections."""

    __slots__ = ("limit", "reserved", "_waiters")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reserved = 0  # slots of dials in progress
        self._waiters: deque[asyncio.Future[UpstreamConnection | None]] = deque()

    async def slot(self, open_count: int, timeout: float,
                   give_back: GiveBack) -> UpstreamConnection | None:
        """A reserved slot to dial in (None), or a connection another exchange
        released; waits up to ``timeout`` while the pool is full (then TimeoutError).
        A grant that comes as the wait gives up goes to ``give_back``."""
        if not self.limit or open_count + self.reserved < self.limit:
            self.reserved += 1
            return None
        waiter: asyncio.Future[UpstreamConnection | None] = (
            asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                give_back(waiter.result())  # granted just as we gave up
            raise

    def hand_over(self, conn: UpstreamConnection) -> bool:
        """Give a released connection to the first request still waiting, if any."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    def unreserve(self, open_count: int) -> None:
        """A reserved slot's dial ended (``open_count`` counts its connection if one
        opened): a slot free now goes to a waiting request — a failed dial frees one."""
        self.reserved -= 1
        self.hand_slots(open_count)

    def hand_slots(self, open_count: int) -> None:
        """Let waiting requests dial into the slots that are free now."""
        while self._waiters and open_count + self.reserved < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.reserved += 1
                waiter.set_result(None)

    def open_all(self) -> None:
        """The pool closes: every waiting request dials (its own connection)."""
        waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                self.reserved += 1
                waiter.set_result(None)
