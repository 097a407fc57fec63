"""A backend's HTTP/1.1 response for a side that awaits it (:meth:`Pool.send`).

:class:`UpstreamResponse` is a :class:`~proxy.upstream.request.ResponseListener` that
turns the callbacks into awaitables: the head as a future, the body through
:meth:`UpstreamResponse.read`. The Handler's common path listens to the connection
directly and needs none of this; mirroring, protocol switches and tests use it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from proxy.flow.buffer import BodyBuffer
from proxy.request import ByteStream, Headers, Piece
from proxy.upstream.base import UpstreamError
from proxy.upstream.request import ResponseListener, ResponseSource
from proxy.wire.scan import as_bytes

if TYPE_CHECKING:
    from proxy.upstream.request import UpstreamRequest

RESPONSE_HIGH_WATER: Final = 64 * 1024  # response bytes buffered before reading pauses


class UpstreamResponse(ResponseListener):
    """A backend's response: head fields once :attr:`head` is done, body through
    :meth:`read`. Buffered body bytes stay readable after the connection went back to
    its pool; reading from the backend pauses while more than ``RESPONSE_HIGH_WATER``
    bytes wait here."""

    __slots__ = ("status", "reason", "headers", "length", "trailers", "head", "request",
                 "_conn", "_body")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.status = 0
        self.reason = ""
        self.headers: Headers = []
        self.length: int | None = None
        """Declared Content-Length, or None (chunked / read to EOF)."""
        self.trailers: Headers = []
        self.head: asyncio.Future[None] = loop.create_future()
        self.request: UpstreamRequest | None = None  # set by whoever sends it
        self._conn: ResponseSource | None = None
        self._body: BodyBuffer[bytes] = BodyBuffer(RESPONSE_HIGH_WATER)  # its callbacks: once connected

    @property
    def buffered(self) -> int:
        """Body bytes received and not yet read."""
        return self._body.buffered

    async def read(self) -> bytes:
        """Next body bytes; ``b""`` at the end. Raises UpstreamError (``other``) when
        the backend breaks off the body."""
        return await self._body.read()

    @property
    def failed(self) -> UpstreamError | None:
        """The error that already broke this response off, if any (a head that parsed,
        followed in the same read by bytes that did not): checked before relaying, it
        lets the caller answer 502 instead of a truncated response."""
        error = self._body.error
        return error if isinstance(error, UpstreamError) else None

    def whole_body(self) -> bytes | None:
        """The entire body if all of it has already arrived (and nothing was read or
        went wrong yet), else None — then :meth:`read` streams it."""
        body = self._body
        if not body.done:
            return None
        return body.take() or b""

    def detach(self) -> ByteStream:
        """The raw stream after a ``101`` (bytes after the head come first)."""
        conn = self._conn
        if self.status != 101 or conn is None:
            raise RuntimeError("only a 101 response can be detached")
        self._conn = None
        self._body.end()
        return conn.detach()

    def close(self) -> None:
        """Give up on the response: an unfinished exchange closes its connection."""
        self._conn = None
        request, self.request = self.request, None
        if request is not None and not self._body.done:
            request.cancel()
        self._body.clear()
        self._body.end()

    # -- ResponseListener

    def on_interim(self, status: int, headers: Headers) -> None:
        request = self.request
        if request is not None and request.interim is not None:
            request.interim(status, headers)

    def on_head(self, conn: ResponseSource, status: int, reason: str,
                headers: Headers, length: int | None) -> None:
        self._conn = conn
        self._body = BodyBuffer(RESPONSE_HIGH_WATER, conn.pause, conn.resume)
        self.status = status
        self.reason = reason
        self.headers = headers
        self.length = length
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, data: Piece) -> None:
        # A task reads this body (an awaited exchange): it gets bytes.
        self._body.feed(as_bytes(data))

    def on_end(self, trailers: Headers) -> None:
        self.trailers = trailers
        self._conn = None
        self.request = None
        self._body.end()

    def on_error(self, error: Exception) -> None:
        self._conn = None
        self.request = None
        if not self.head.done():
            self.head.set_exception(error)
        else:
            self._body.fail(error)

    def on_read_end(self) -> None:
        pass
