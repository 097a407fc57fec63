"""A request body streamed from a client connection to the Handler.

Two ways out, chosen by the consumer: pushed (:meth:`RequestBody.attach`, the upstream
connection's sender takes each piece as the parser delivers it: no task, no buffer) or
read (:meth:`RequestBody.read`, a coroutine; pieces are buffered until then). Either
way reading from the client pauses while the consumer cannot keep up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from proxy.flow.buffer import BodyBuffer
from proxy.flow.control import BODY
from proxy.flow.push import BodySink, PushBody
from proxy.request import BodyError, Piece
from proxy.wire.scan import as_bytes

if TYPE_CHECKING:
    from proxy.entrances.http1 import HTTP1Protocol

BODY_HIGH_WATER: Final = 64 * 1024  # request bytes buffered for the Handler before pausing
DISCARD_LIMIT: Final = 64 * 1024  # unread request body we swallow to keep a connection alive


class RequestBody(PushBody):
    """A request body streamed from the socket (:class:`proxy.request.Body`, and a
    :class:`proxy.flow.push.PushBody`).

    The connection feeds it from parser callbacks. Read: reading pauses above
    ``BODY_HIGH_WATER`` buffered bytes and resumes when the Handler reads. Pushed:
    the sink pauses and resumes it. ``count`` is the bytes received so far.
    """

    __slots__ = ("expect_continue", "_conn", "_discarded", "_discarding")

    def __init__(self, conn: "HTTP1Protocol", length: int | None, expect: bool) -> None:
        # Read mode keeps the bytes in the buffer; reading pauses while it is full.
        super().__init__(length, BodyBuffer(BODY_HIGH_WATER, conn.hold_body,
                                            conn.release_body))
        self.expect_continue = expect  # 100 Continue still owed on the first read
        self._conn = conn
        self._discarded = 0
        self._discarding = False

    @property
    def buffered(self) -> int:
        """Bytes received and not yet read (read mode)."""
        return self._buffer.buffered

    # -- fed by the connection

    def feed(self, data: Piece) -> None:
        self.count += len(data)
        sink = self._sink
        if sink is not None:
            self._conn.body_progress()
            sink.body_data(data)
            return
        if self._discarding:
            self._discarded += len(data)
            if self._discarded > DISCARD_LIMIT:
                self._conn.close()
            return
        self._buffer.feed(data)

    def end(self) -> None:
        self._buffer.end()
        self.expect_continue = False
        sink, self._sink = self._sink, None
        if sink is not None:
            self._conn.body_progress(False)
            sink.body_end(self.trailers)

    # -- pushed

    def attach(self, sink: BodySink) -> list[Piece]:
        """Push from now on (see :class:`proxy.flow.push.PushBody`); returns
        what was buffered. A client waiting for ``100 Continue`` gets it now."""
        data = self._take_buffered(sink, self._conn.loop)
        if self._sink is None:
            return data
        self._conn.body_progress()
        if self.expect_continue:
            self.expect_continue = False
            self._conn.send_continue()
        return data

    def detach(self) -> None:
        """Stop pushing; the rest is buffered (or discarded) like an unread body."""
        if self._sink is not None:
            self._sink = None
            self._conn.body_progress(False)
        self._conn.flow.resume_reading(BODY)

    def pause(self) -> None:
        self._conn.flow.pause_reading(BODY)
        self._conn.body_progress(False)  # the backend is slow, not the client

    def resume(self) -> None:
        self._conn.flow.resume_reading(BODY)
        if self._sink is not None:
            self._conn.body_progress()

    # -- read

    def discard(self) -> bool:
        """Drop what is buffered and swallow the rest as it arrives; False if the rest
        is known to be too large (or was never asked for) — then close instead."""
        self._sink = None
        buffer = self._buffer
        buffer.clear()
        self._conn.flow.resume_reading(BODY)
        if buffer.done:
            return True
        if self.expect_continue or buffer.error is not None:
            return False  # the client waits for a 100 that will not come
        if self.length is not None and self.length > DISCARD_LIMIT:
            return False
        self._discarding = True
        return True

    async def read(self) -> bytes:
        """Next chunk; ``b""`` at the end; BodyError if the body cannot be completed.
        A client waiting for ``100 Continue`` gets it on the first read that waits;
        a wait longer than ``body_timeout`` fails the body and closes."""
        buffer = self._buffer
        data = buffer.take()
        if data is not None:
            return as_bytes(data)
        if buffer.error is not None or buffer.done:
            return as_bytes(await buffer.read())  # b"" or the failure, at once
        if self.expect_continue:
            self.expect_continue = False
            self._conn.send_continue()
        conn = self._conn
        timer = conn.loop.call_later(conn.settings.body_timeout, self._expire)
        try:
            return as_bytes(await buffer.read())
        finally:
            timer.cancel()

    def _expire(self) -> None:
        self.fail(BodyError("request body timed out"))
        self._conn.close()
