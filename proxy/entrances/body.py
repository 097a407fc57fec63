"""A request body streamed from a client connection to the Handler."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from proxy.flow.control import BODY
from proxy.request import BodyError, Headers

if TYPE_CHECKING:
    from proxy.entrances.http1 import HTTP1Protocol



BODY_HIGH_WATER = 64 * 1024  # request bytes buffered for the Handler before pausing
DISCARD_LIMIT = 64 * 1024  # unread request body we swallow to keep a connection alive


class RequestBody:
    """A request body streamed from the socket (:class:`proxy.request.Body`).

    The connection feeds it from parser callbacks; reading pauses above
    ``BODY_HIGH_WATER`` buffered bytes and resumes when the Handler reads.
    """

    __slots__ = ("length", "trailers", "_conn", "_chunks", "_buffered", "_done", "_error",
                 "_waiter", "expect_continue", "_discarded", "_discarding")

    def __init__(self, conn: "HTTP1Protocol", length: int | None, expect: bool) -> None:
        self.length = length
        self.trailers: Headers = []
        """The trailer fields of a chunked body, complete once ``read`` returned b""."""
        self._conn = conn
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._done = False
        self._error: BodyError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.expect_continue = expect  # 100 Continue still owed on the first read
        self._discarded = 0
        self._discarding = False

    @property
    def complete(self) -> bool:
        """All body bytes arrived (they may still be buffered)."""
        return self._done

    def feed(self, data: bytes) -> None:
        if self._discarding:
            self._discarded += len(data)
            if self._discarded > DISCARD_LIMIT:
                self._conn.close()
            return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > BODY_HIGH_WATER:
            self._conn.flow.pause_reading(BODY)
        self._wake()

    def end(self) -> None:
        self._done = True
        self.expect_continue = False
        self._wake()

    def fail(self, error: BodyError) -> None:
        if not self._done:
            self._error = error
            self._wake()

    def discard(self) -> bool:
        """Drop what is buffered and swallow the rest as it arrives; False if the rest
        is known to be too large (or was never asked for) — then close instead."""
        self._chunks.clear()
        self._buffered = 0
        self._conn.flow.resume_reading(BODY)
        if self._done:
            return True
        if self.expect_continue or self._error is not None:
            return False  # the client waits for a 100 that will not come
        if self.length is not None and self.length > DISCARD_LIMIT:
            return False
        self._discarding = True
        return True

    async def read(self) -> bytes:
        """Next chunk; ``b""`` at the end; BodyError if the body cannot be completed."""
        while True:
            chunks = self._chunks
            if chunks:
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._buffered = 0
                self._conn.flow.resume_reading(BODY)
                return data
            if self._done:
                return b""
            if self._error is not None:
                raise self._error
            if self.expect_continue:
                self.expect_continue = False
                self._conn.send_continue()
            await self._wait()

    async def _wait(self) -> None:
        loop = self._conn.loop
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(self._conn.settings.body_timeout, self._expire)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _expire(self) -> None:
        self.fail(BodyError("request body timed out"))
        self._conn.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

