"""A request body that pushes its bytes to a sink as they arrive, and that sink.

The client connection's body (:class:`proxy.entrances.body.RequestBody`) is one: the
upstream connection's request sender attaches to it and writes each piece from the
parser's callback, with no task and no buffer between them. Any other body is read.

:class:`PushBody` is a base class rather than a protocol: whoever forwards a body tells
a pushed one from any other with an ``isinstance`` test, then reads its fields and
calls its methods.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from proxy.flow.buffer import BodyBuffer
from proxy.request import BodyError, Headers, Piece


class BodySink(Protocol):
    """Receives a pushed request body."""

    def body_data(self, data: Piece) -> None: ...

    def body_end(self, trailers: Headers) -> None: ...

    def body_failed(self, error: BaseException) -> None: ...


class PushBody:
    """A request body (a :class:`proxy.request.Body`) that can push its bytes.

    ``length`` is the declared Content-Length (None: chunked), ``count`` the bytes
    received so far, ``trailers`` the trailer fields of a chunked body (complete once
    it ended). What arrives while nobody pushes is kept in the subclass's
    ``BodyBuffer``, whose backpressure is the subclass's; the sink, once one is
    attached, gets the rest. Subclasses implement the other methods.
    """

    __slots__ = ("length", "count", "trailers", "_buffer", "_sink")

    def __init__(self, length: int | None, buffer: BodyBuffer[Piece]) -> None:
        self.length = length
        self.count = 0
        self.trailers: Headers = []
        self._buffer = buffer
        self._sink: BodySink | None = None

    @property
    def complete(self) -> bool:
        """All body bytes arrived (they may still be buffered)."""
        return self._buffer.done

    def fail(self, error: BodyError) -> None:
        """The body cannot be completed: its reader or its sink hears ``error``."""
        buffer = self._buffer
        if not buffer.done and buffer.error is None:
            buffer.fail(error)
            sink, self._sink = self._sink, None
            if sink is not None:
                sink.body_failed(error)

    def _take_buffered(self, sink: BodySink, loop: asyncio.AbstractEventLoop) -> list[Piece]:
        """What every :meth:`attach` does first: take the pieces buffered so far, and
        attach ``sink`` while the body is still arriving (a failure already met
        reaches it on ``loop`` soon, after the caller took the pieces)."""
        buffer = self._buffer
        pieces = buffer.take_pieces()
        if buffer.done:
            return pieces
        if buffer.error is not None:
            loop.call_soon(sink.body_failed, buffer.error)
            return pieces
        self._sink = sink
        return pieces

    def attach(self, sink: BodySink) -> list[Piece]:
        """Switch to pushing: return the bytes buffered so far, in the pieces they
        arrived in (none: an empty list); later bytes, the end and a failure go to
        ``sink``. A piece may be a memoryview of the read it arrived in (never of a
        buffer that is reused: it stays valid for as long as it is held). If
        ``complete`` is already true, nothing follows and the caller ends the body
        itself."""
        raise NotImplementedError

    def detach(self) -> None:
        """Stop pushing (the exchange is over); bytes still arriving are the body's."""
        raise NotImplementedError

    def pause(self) -> None:
        """The sink cannot take more now: stop reading from the client."""
        raise NotImplementedError

    def resume(self) -> None:
        """The sink can take more again."""
        raise NotImplementedError

    async def read(self) -> bytes:
        """(:class:`proxy.request.Body`) the next chunk; ``b""`` at the end."""
        raise NotImplementedError
