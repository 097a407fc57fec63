"""The sending half of a response on a client connection: body bytes framed (chunked,
or cut at the declared Content-Length), gathered, and written in as few calls as
possible.

What is queued within one loop turn goes out together: one ``write`` when it is small
(head and a small body in one segment), one ``writelines`` otherwise, so a large body
is never joined into a copy. Bytes for a transport that is gone are dropped by the
connection (``GuardedOutput``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from proxy.request import Headers, Piece
from proxy.wire.head import render_head

if TYPE_CHECKING:
    from proxy.entrances.http1 import HTTP1Protocol

COALESCE_LIMIT: Final = 16 * 1024  # queued bytes up to this size are joined into one write
FLUSH_LIMIT: Final = 64 * 1024  # bytes queued within one loop turn before a flush
_LAST_CHUNK: Final = b"0\r\n\r\n"


class Output:
    """Queued response bytes of one client connection. Its cycles take turns: the
    one answering leaves it empty when it is done (``end`` flushes, ``drop`` forgets),
    so the next one starts from nothing queued."""

    __slots__ = ("conn", "chunked", "remaining", "_out", "_size", "_pending")

    def __init__(self, conn: "HTTP1Protocol") -> None:
        self.conn: "HTTP1Protocol | None" = conn  # None once the connection is gone
        self.chunked = False
        self.remaining: int | None = None  # bytes still owed to a declared length
        self._out: list[Piece] = []
        self._size = 0
        self._pending = False  # a flush is scheduled for the end of this loop turn

    def begin(self, head: bytes, chunked: bool, remaining: int | None) -> None:
        """Queue a streamed response's head; the body is framed as given."""
        self.chunked = chunked
        self.remaining = remaining
        self._queue(head)

    def push(self, data: Piece) -> None:
        """Queue body bytes, never past the declared length; flush past FLUSH_LIMIT."""
        remaining = self.remaining
        if remaining is not None:
            if len(data) > remaining:
                data = data[:remaining]
            self.remaining = remaining - len(data)
        if self.chunked:
            self._queue(b"%x\r\n" % len(data))
            self._queue(data)
            self._queue(b"\r\n")
        else:
            self._queue(data)
        if self._size >= FLUSH_LIMIT:
            self.flush()

    def end(self, trailers: Headers | None) -> None:
        """Queue the end of a chunked body (with ``trailers``, if any) and flush."""
        if self.chunked:
            self._queue(render_head(b"0\r\n", trailers) if trailers else _LAST_CHUNK)
        self.flush()

    def flush(self) -> None:
        """Send what is queued (drop it, the connection being gone)."""
        self._pending = False
        out = self._out
        if not out:
            return
        conn = self.conn
        if conn is not None:
            if len(out) == 1:
                conn.write(out[0])
            elif self._size <= COALESCE_LIMIT:
                conn.write(b"".join(out))
            else:
                conn.writelines(out)  # (a transport takes the items, not the list)
        out.clear()
        self._size = 0

    def flush_soon(self) -> None:
        """Flush at the end of this loop turn (for a writer that may await next)."""
        if not self._pending and self.conn is not None:
            self._pending = True
            self.conn.loop.call_soon(self.flush)

    def release(self) -> None:
        """The connection is gone: forget it and what is queued, so that the two do
        not keep each other alive (a cycle only the cyclic GC could free)."""
        self.conn = None
        self.drop()

    def drop(self) -> None:
        """Forget what is queued (the connection is being cut)."""
        self._out.clear()
        self._size = 0

    def _queue(self, data: Piece) -> None:
        self._out.append(data)
        self._size += len(data)
