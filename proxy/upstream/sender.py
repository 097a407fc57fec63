"""Writing one request on an upstream HTTP/1.1 connection: the head, then the body.

A body the client connection pushes (:class:`~proxy.flow.push.PushBody`) is
written from its own callbacks as its bytes arrive, with no task: when the backend's
socket buffer is full the client's reading pauses, and resumes when it drained. Any
other body (in memory, an in-process iterator, a mirror's copy) is read by a sender
task — those really wait on something else.

Either way the sender tells its connection once the request went out whole
(:meth:`UpstreamConnection.request_sent`), which is when the head timeout starts; a backend
that answers before that stops the sender (an early answer), and the connection is
then not reused.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from proxy.flow.push import PushBody
from proxy.request import Body, BodyError, Headers, Piece
from proxy.upstream.base import UpstreamError
from proxy.wire.framing import forwardable_trailers
from proxy.wire.head import render_head

if TYPE_CHECKING:
    from proxy.upstream.http1 import UpstreamConnection

_LAST_CHUNK: Final = b"0\r\n\r\n"


class RequestSender:
    """Streams one request body to its connection (the
    :class:`~proxy.flow.push.BodySink` of a pushed body). The connection hears
    ``request_sent()`` once the whole request is written, ``body_failed()`` with an
    :class:`UpstreamError` (``canceled``) when the client's body broke off."""

    __slots__ = ("conn", "chunked", "_push", "_task")

    def __init__(self, conn: "UpstreamConnection", chunked: bool) -> None:
        self.conn = conn
        self.chunked = chunked
        self._push: PushBody | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, head: bytes, body: Body) -> None:
        """Write ``head`` and as much of ``body`` as is there; stream the rest."""
        conn = self.conn
        if not isinstance(body, PushBody):
            conn.write(head)
            self._task = asyncio.get_running_loop().create_task(self._pull(body))
            self._task.add_done_callback(_retrieve)
            return
        push = body
        pieces = push.attach(self)
        complete = push.complete
        if not complete:
            self._push = push
        if pieces and not self.chunked:
            conn.writelines([head, *pieces])  # one writev, the body not copied
        elif pieces:
            size = sum(len(piece) for piece in pieces)
            conn.writelines([head, b"%x\r\n" % size, *pieces, b"\r\n"])
        else:
            conn.write(head)
        if complete:
            self.body_end(push.trailers)
        elif conn.flow.write_paused:
            push.pause()

    def resume(self) -> None:
        """The backend drained its socket buffer: let the client send again."""
        if self._push is not None:
            self._push.resume()

    def stop(self) -> None:
        """The exchange ended (answered early, failed, abandoned): send no more."""
        push, self._push = self._push, None
        if push is not None:
            push.detach()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()

    # -- BodySink (a pushed body calls these)

    def body_data(self, data: Piece) -> None:
        conn = self.conn
        if self.chunked:
            conn.writelines([b"%x\r\n" % len(data), data, b"\r\n"])
        else:
            conn.write(data)
        if conn.flow.write_paused and self._push is not None:
            self._push.pause()

    def body_end(self, trailers: Headers) -> None:
        self._push = None
        if self.chunked:
            self.conn.write(_last_chunk(trailers))
        self.conn.request_sent()

    def body_failed(self, error: BaseException) -> None:
        self._push = None
        self.conn.body_failed(UpstreamError("canceled", f"request body failed: {error}"))

    # -- a body that is read

    async def _pull(self, body: Body) -> None:
        conn = self.conn
        flow = conn.flow
        try:
            while chunk := await body.read():
                if conn.closing:
                    return
                self.body_data(chunk)
                if flow.write_paused:
                    await flow.drain()
        except BodyError as broken:
            self._task = None
            self.body_failed(broken)
            return
        except ConnectionError:
            return
        self._task = None
        if self.chunked:
            self.conn.write(_last_chunk(getattr(body, "trailers", None) or []))
        if not conn.closing:
            conn.request_sent()


def _last_chunk(trailers: Headers) -> bytes:
    """The last chunk; request trailers travel with it (RFC 9112 §7.1.2), minus the
    fields no trailer may carry."""
    if trailers:
        return render_head(b"0\r\n", forwardable_trailers(trailers))
    return _LAST_CHUNK


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a late failure only matters to the socket
