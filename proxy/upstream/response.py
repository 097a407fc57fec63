"""A backend's HTTP/1.1 response as the awaiting side reads it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from proxy.flow.control import BODY
from proxy.upstream.base import UpstreamError

if TYPE_CHECKING:
    from proxy.upstream.http1 import UpstreamConnection
from proxy.request import ByteStream, Headers

RESPONSE_HIGH_WATER = 64 * 1024  # response bytes buffered before reading pauses


class UpstreamResponse:
    """A backend's response: head fields now, body through :meth:`read`.

    The connection goes back to its pool as soon as the whole message has arrived and
    the exchange allows keep-alive; buffered body bytes stay readable here.
    """

    __slots__ = ("status", "reason", "headers", "length", "trailers", "_conn", "_chunks",
                 "_buffered", "_done", "_error", "_waiter", "_head_only", "_chunked")

    def __init__(self, conn: "UpstreamConnection", head_only: bool) -> None:
        self.status = 0
        self.reason = ""
        self.headers: Headers = []
        self.length: int | None = None
        """Declared Content-Length, or None (chunked / read to EOF)."""
        self.trailers: Headers = []
        self._conn: UpstreamConnection | None = conn
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._done = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._head_only = head_only  # the answer to a HEAD: never a body
        self._chunked = False

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
                    self._conn.flow.resume_reading(BODY)
                return data
            if self._done:
                return b""
            if self._error is not None:
                raise self._error
            assert self._conn is not None  # attached until done or failed
            self._waiter = self._conn.loop.create_future()
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
        if self.status != 101 or conn is None or conn.stream is None:
            raise RuntimeError("only a 101 response can be detached")
        self._conn = None
        return conn.stream

    def close(self) -> None:
        """Give up on the response: an unfinished exchange closes its connection."""
        conn, self._conn = self._conn, None
        if conn is not None and not self._done:
            conn.abort()
        self._done = True
        self._chunks = []

    # -- fed by the connection

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > RESPONSE_HIGH_WATER and self._conn is not None:
            self._conn.flow.pause_reading(BODY)
        self._wake()

    def _end(self) -> None:
        self._done = True
        self._conn = None
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if not self._done:
            self._error = error
            self._conn = None
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


