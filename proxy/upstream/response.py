"""A backend's HTTP/1.1 response for a side that awaits it (:meth:`Pool.send`).

:class:`UpstreamResponse` is a :class:`~proxy.upstream.request.ResponseListener` that
turns the callbacks into awaitables: the head as a future, the body through
:meth:`UpstreamResponse.read`. The Handler's common path listens to the connection
directly and needs none of this; mirroring, protocol switches and tests use it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from proxy.request import ByteStream, Headers
from proxy.upstream.base import UpstreamError

if TYPE_CHECKING:
    from proxy.upstream.http1 import UpstreamConnection
    from proxy.upstream.request import UpstreamRequest

RESPONSE_HIGH_WATER = 64 * 1024  # response bytes buffered before reading pauses


class UpstreamResponse:
    """A backend's response: head fields once :attr:`head` is done, body through
    :meth:`read`. Buffered body bytes stay readable after the connection went back to
    its pool."""

    __slots__ = ("status", "reason", "headers", "length", "trailers", "head", "request",
                 "_conn", "_chunks", "_buffered", "_done", "_error", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.status = 0
        self.reason = ""
        self.headers: Headers = []
        self.length: int | None = None
        """Declared Content-Length, or None (chunked / read to EOF)."""
        self.trailers: Headers = []
        self.head: asyncio.Future[None] = loop.create_future()
        self.request: UpstreamRequest | None = None  # set by whoever sends it
        self._conn: UpstreamConnection | None = None
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._done = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None

    async def read(self) -> bytes:
        """Next body bytes; ``b""`` at the end. Raises UpstreamError (``other``) when
        the backend breaks off the body."""
        while True:
            chunks = self._chunks
            if chunks:
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self._chunks = []
                self._buffered = 0
                if self._conn is not None:
                    self._conn.resume()
                return data
            if self._done:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    @property
    def failed(self) -> UpstreamError | None:
        """The error that already broke this response off, if any (a head that parsed,
        followed in the same read by bytes that did not): checked before relaying, it
        lets the caller answer 502 instead of a truncated response."""
        return self._error

    def whole_body(self) -> bytes | None:
        """The entire body if all of it has already arrived (and nothing was read or
        went wrong yet), else None — then :meth:`read` streams it."""
        if not self._done or self._error is not None:
            return None
        chunks, self._chunks = self._chunks, []
        self._buffered = 0
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def detach(self) -> ByteStream:
        """The raw stream after a ``101`` (bytes after the head come first)."""
        conn = self._conn
        if self.status != 101 or conn is None:
            raise RuntimeError("only a 101 response can be detached")
        self._conn = None
        self._done = True
        return conn.detach()

    def close(self) -> None:
        """Give up on the response: an unfinished exchange closes its connection."""
        self._conn = None
        request, self.request = self.request, None
        if request is not None and not self._done:
            request.cancel()
        self._done = True
        self._chunks = []

    # -- ResponseListener

    def on_head(self, conn: "UpstreamConnection", status: int, reason: str,
                headers: Headers, length: int | None) -> None:
        self._conn = conn
        self.status = status
        self.reason = reason
        self.headers = headers
        self.length = length
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > RESPONSE_HIGH_WATER and self._conn is not None:
            self._conn.pause()
        self._wake()

    def on_end(self, trailers: Headers) -> None:
        self.trailers = trailers
        self._done = True
        self._conn = None
        self.request = None
        self._wake()

    def on_error(self, error: Exception) -> None:
        assert isinstance(error, UpstreamError)
        self._conn = None
        self.request = None
        if not self.head.done():
            self.head.set_exception(error)
            return
        if not self._done:
            self._error = error
            self._wake()

    def on_read_end(self) -> None:
        pass

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
