"""A request body that pushes its bytes to a sink as they arrive, and that sink.

The client connection's body (:class:`proxy.entrances.body.RequestBody`) is one: the
upstream connection's request sender attaches to it and writes each piece from the
parser's callback, with no task and no buffer between them. Any other body is read.

:class:`PushBody` is a base class rather than a protocol: whoever forwards a body tells
a pushed one from any other with an ``isinstance`` test, then reads its fields and
calls its methods.
"""

from __future__ import annotations

from typing import Protocol

from proxy.request import Headers, Piece


class BodySink(Protocol):
    """Receives a pushed request body."""

    def body_data(self, data: Piece) -> None: ...

    def body_end(self, trailers: Headers) -> None: ...

    def body_failed(self, error: BaseException) -> None: ...


class PushBody:
    """A request body (a :class:`proxy.request.Body`) that can push its bytes.

    ``length`` is the declared Content-Length (None: chunked), ``count`` the bytes
    received so far, ``trailers`` the trailer fields of a chunked body (complete once
    it ended). Subclasses implement every method.
    """

    __slots__ = ("length", "count", "trailers")

    def __init__(self, length: int | None) -> None:
        self.length = length
        self.count = 0
        self.trailers: Headers = []

    @property
    def complete(self) -> bool:
        """All body bytes arrived (they may still be buffered)."""
        raise NotImplementedError

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
