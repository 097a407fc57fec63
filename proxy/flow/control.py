"""Flow control for one transport: read pausing by reason, write draining.

Both sides of the proxy (the client entrance and the upstream connection) stream bodies
with backpressure: a protocol stops reading
when the consumer of its bytes falls behind, and a writer waits while the peer's socket
buffer is above the transport's high-water mark.

Reading can be paused for several independent reasons at once (a pipelined request is
queued *and* a body buffer is full); the transport resumes only when the last reason
is lifted. Reasons are bit flags so the bookkeeping is one integer.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Final

from proxy.request import Piece

# Reasons to stop reading (bit flags).
PIPELINE: Final = 1  # a complete pipelined request waits for the current one to finish
BODY: Final = 2  # the request/response body buffer is above its high-water mark
UPGRADE: Final = 4  # an upgrade request waits for the handler to decide
STREAM: Final = 8  # an upgraded stream's buffer is above its high-water mark
HELD: Final = 16  # a shed client's next request waits for its Retry-After


class FlowControl:
    """Pause/resume reading with a reason; let writers wait for the peer to drain.

    The owning protocol calls :meth:`pause_writing` / :meth:`resume_writing` from the
    transport callbacks of the same names, and :meth:`connection_lost` from its own.
    """

    __slots__ = ("_transport", "_read_paused", "_write_paused", "_waiters", "_lost")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._read_paused = 0
        self._write_paused = False
        self._waiters: list[asyncio.Future[None]] = []
        self._lost = False

    # -- reading

    def pause_reading(self, reason: int) -> None:
        """Stop reading from the socket until ``reason`` (and any other) is lifted."""
        if not self._read_paused and not self._lost:
            self._transport.pause_reading()
        self._read_paused |= reason

    def resume_reading(self, reason: int) -> None:
        """Lift ``reason``; reading resumes when no reason is left."""
        if self._read_paused & reason:
            self._read_paused &= ~reason
            if not self._read_paused and not self._lost:
                self._transport.resume_reading()

    def resume_all(self) -> None:
        """Lift every reason: read again whatever held reading."""
        if self._read_paused:
            self._read_paused = 0
            if not self._lost:
                self._transport.resume_reading()

    # -- writing

    @property
    def write_paused(self) -> bool:
        """True while the transport's write buffer is above its high-water mark."""
        return self._write_paused

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake(None)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait until the peer has taken enough bytes; returns at once if it has.

        Raises :class:`ConnectionError` if the connection is (or gets) lost, and
        :class:`TimeoutError` if ``timeout`` seconds pass without draining — a client
        that stops reading must not pin a response (and its backend) forever.
        """
        if self._lost:
            raise ConnectionError("connection lost")
        if not self._write_paused:
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiters.append(waiter)
        timer = None
        if timeout is not None:
            timer = loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def connection_lost(self) -> None:
        """Fail every drain waiter; later drains raise at once."""
        self._lost = True
        self._wake(ConnectionError("connection lost"))

    def _wake(self, exc: BaseException | None) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("peer did not drain in time"))


class DrainWait:
    """A callback waiting for a client connection to drain, with a deadline: it runs
    once, when :meth:`drained` is called or ``timeout`` after :meth:`wait` — then after
    ``on_timeout``, which cuts the connection (a client that stops reading must not pin
    a response, and its backend, forever)."""

    __slots__ = ("_on_timeout", "_callback", "_timer")

    def __init__(self, on_timeout: Callable[[], None]) -> None:
        self._on_timeout = on_timeout
        self._callback: Callable[[], None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def wait(self, callback: Callable[[], None], loop: asyncio.AbstractEventLoop,
             timeout: float) -> None:
        """Run ``callback`` on the next drain; the deadline runs from the first wait
        since the last drain."""
        self._callback = callback
        if self._timer is None:
            self._timer = loop.call_later(timeout, self._timed_out)

    def drained(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()

    def _timed_out(self) -> None:
        self._timer = None
        self._on_timeout()
        self.drained()


class GuardedOutput(asyncio.BaseProtocol):
    """A connection protocol's output side: bytes for a transport that is gone or
    closing are dropped (the peer left; the request cycle learns it from
    ``connection_lost``), so writers never have to check first. ``closing`` turns
    true as soon as this side decided to end the connection.

    A memoryview handed to a transport that already has bytes queued is copied
    first: the transport would keep it until the peer reads, and with it the whole
    buffer it views (an upstream read buffer, which could not be reused meanwhile).

    :meth:`attach` (from ``connection_made``) must come before the first write. A
    subclass adds the reading side: a plain or a buffered protocol's callbacks.
    """

    transport: asyncio.Transport | None
    closing = False
    # The transport's methods every write calls, bound once per connection.
    _send: Callable[[Piece], object]
    _send_all: Callable[[list[Piece]], object]
    _is_closing: Callable[[], bool]
    _queued: Callable[[], int]

    def attach(self, transport: asyncio.Transport) -> None:
        """Write to ``transport`` from now on."""
        self.transport = transport
        self._send = transport.write
        self._send_all = transport.writelines
        self._is_closing = transport.is_closing
        self._queued = transport.get_write_buffer_size

    def output_closed(self) -> bool:
        """Whether bytes written now would be dropped (the transport is closing or
        gone)."""
        return self.transport is None or self._is_closing()

    def close(self) -> None:
        """End the connection after what was written is flushed."""
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection at once, unsent bytes included."""
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def write(self, data: Piece) -> None:
        if self.transport is not None and not self._is_closing():
            if not isinstance(data, bytes) and self._queued():
                data = bytes(data)
            self._send(data)

    def writelines(self, data: list[Piece]) -> None:
        if self.transport is not None and not self._is_closing():
            if self._queued():
                data = [piece if isinstance(piece, bytes) else bytes(piece)
                        for piece in data]
            self._send_all(data)
