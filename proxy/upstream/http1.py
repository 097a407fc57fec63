"""One HTTP/1.1 connection to a backend (llhttp parser): its transport side.

:meth:`UpstreamConnection.begin` writes a request (:class:`~proxy.upstream.sender.
RequestSender` streams its body) and the answer reaches the request's listener from the
parser callbacks (the contract is :mod:`proxy.upstream.request`). The exchange's states,
their one transition function and what the reader reports into are
:class:`~proxy.upstream.machine.ExchangeMachine`'s, the base class; this module is the
transport side, and the steps that hand the connection itself on (to its pool, to the
listener with a final head or a 101).

Failures reach the listener as :class:`~proxy.upstream.base.UpstreamError` with a
``reason`` of the backend-error metric (``dial``, ``tls``, ``timeout``, ``other``,
``canceled``). A connection that closed before a single response byte goes back to its
pool (:meth:`~proxy.upstream.pool.Pool.stale`), which retries an idempotent request once.
The head timeout (route timeouts) covers only the wait for the response head and starts
once the request was sent whole.

The connection is a buffered protocol: the event loop reads into the pools' shared
:class:`~proxy.upstream.readbuffer.ReadBuffer`, and a large body is relayed as views of
it (the lending rules are that module's).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING, Callable

import httptools

from proxy.flow.control import BODY, FlowControl
from proxy.flow.stream import TransportStream
from proxy.request import Headers, Piece
from proxy.upstream.base import UpstreamError
from proxy.upstream.machine import (
    AWAITING_HEAD, CLOSED, IDLE, RECEIVING, SWITCHED, ExchangeMachine)
from proxy.upstream.readbuffer import LEND_MIN
from proxy.upstream.reader import ResponseReader
from proxy.upstream.request import UpstreamRequest
from proxy.upstream.sender import RequestSender
from proxy.upstream.unread import UNREAD
from proxy.wire.framing import poolable, request_framing
from proxy.wire.head import render_head, request_line

if TYPE_CHECKING:
    from proxy.upstream.pool import Pool


class UpstreamConnection(ExchangeMachine):
    """One HTTP/1.1 connection to a backend; one exchange at a time, driven by the
    transport and parser callbacks (no task, no future).

    Response bytes are trusted only as the answer to the request being exchanged:
    bytes on an idle connection, or a message after the complete answer, mean the
    backend is out of step with us, and the connection is closed rather than letting
    them reach the next request's client (a response desync).
    """

    # ``loop.time``, bound on connect: read at every release to the pool (a call by
    # name would look the method up on the loop's type each time).
    clock: Callable[[], float]

    def __init__(self, pool: "Pool") -> None:
        super().__init__()
        self.pool = pool
        self.flow = None  # type: ignore[assignment]  # set on connect
        self.loop = None  # type: ignore[assignment]  # set on connect
        self.idle_since = 0.0
        self.stream: TransportStream | None = None
        self.reader = ResponseReader(self, pool.head_limits)
        self._reads = pool.reads
        self._fd = -1

    # -- transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.loop = asyncio.get_running_loop()
        self.clock = self.loop.time
        self.attach(transport)  # type: ignore[arg-type]  # a stream transport
        self.flow = FlowControl(transport)  # type: ignore[arg-type]
        self.reader.bind()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._fd = sock.fileno()

    def quiet(self) -> bool:
        """No byte waits unread in the socket. Asked before an idle connection is
        reused: bytes that arrived before the new request is written cannot be its
        answer (the event loop just has not delivered them yet)."""
        if self._fd < 0:
            return True
        return UNREAD(self._fd) == 0  # (-1: the ioctl failed, so not known quiet)

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        if self._sender is not None:
            self._sender.resume()

    def get_buffer(self, sizehint: object) -> memoryview:
        """Where the event loop reads to (a buffered protocol's; ``sizehint``, an int,
        is only advice: the store's size is what is read at most, and the hint is not
        even converted)."""
        return self._reads.take()

    def buffer_updated(self, nbytes: int) -> None:
        reads = self._reads
        self._received(reads.view[:nbytes], reads.store)

    def data_received(self, data: bytes) -> None:
        """Bytes read by a transport that does not take a buffer: the pure asyncio
        loop's, which hands one only to a subclass of ``asyncio.BufferedProtocol``
        (uvloop's, plain or TLS, asks any protocol that has ``get_buffer``)."""
        self._received(data, data)

    def _received(self, data: Piece, whole: bytes | bytearray) -> None:
        """``data`` was read; ``whole`` holds it from its first byte (the store it was
        read into, or ``data`` itself), for the reader to search in place."""
        if self.stream is not None:
            self.stream.feed(bytes(data))  # kept until the stream is read: a copy
            return
        listener = self._listener
        if listener is None:
            self.abort()  # bytes nobody asked for: the connection is out of sync
            return
        self._got_bytes = True
        reader = self.reader
        try:
            reader.feed(data, whole)
        except httptools.HttpParserUpgrade as exc:
            self._switched(bytes(data[exc.args[0]:]))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError("other", f"invalid response from backend: {exc}"))
        if self.state == AWAITING_HEAD and self._listener is listener:
            # Still no final head: all of this was head bytes (interim ones included).
            # Counted per read, so a head is never buffered much past the cap.
            reader.head_bytes += len(data)
            if reader.head_bytes > reader.max_bytes:
                self._fail(UpstreamError("other", "response head too large"))
        listener.on_read_end()

    def eof_received(self) -> bool:
        if self.state == RECEIVING and self._length is None and not self._chunked:
            self._message_done()  # a close-delimited body ends here (RFC 9112 §6.3 item 8)
        self._lost()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(exc, ssl.SSLError):
            # e.g. a TLS 1.3 server rejecting our client certificate after the
            # handshake: a TLS failure, not a stale connection.
            self._fail(UpstreamError("tls", f"TLS failure: {exc}"))
        self._lost()
        self.flow.connection_lost()
        if self.stream is not None:
            self.stream.feed_eof()
        self.reader.unbind()  # (a reference cycle otherwise, as on the client side)

    def _lost(self) -> None:
        self.closing = True
        self.pool.forget(self)
        state = self.state
        if state == AWAITING_HEAD and not self._got_bytes:
            request = self._end_exchange()
            assert request is not None  # (every detach leaves AWAITING_HEAD)
            self.pool.stale(request)  # retried once, or answered 502
        elif state == AWAITING_HEAD:
            self._fail(UpstreamError(
                "other", "backend closed the connection before the response head"))
        elif state == RECEIVING:
            self._fail(UpstreamError("other", "backend closed the connection mid-body"))
        if self.state != CLOSED:
            self._to(CLOSED)

    # -- the exchange

    def begin(self, request: UpstreamRequest) -> None:
        """Write ``request`` on this idle connection and expect its answer; the answer
        goes to ``request.listener`` (see :mod:`proxy.upstream.request`)."""
        self._to(AWAITING_HEAD)
        request.conn = self
        self._request = request
        self._listener = request.listener
        self.reader.expect(request.method == "HEAD")
        self._sent = False
        self._got_bytes = False
        self._length = None
        self._chunked = False
        body = request.body
        length = body.length
        head = render_head(request_line(request.method, request.target),
                           request.headers, request_framing(request.method, length))
        if length == 0:
            self.write(head)
            self.request_sent()
            return
        sender = self._sender = RequestSender(self, length is None)
        sender.start(head, body)

    def abandon(self, request: UpstreamRequest) -> None:
        """``request``'s side gave up: an exchange still running cannot be finished,
        so the connection closes (one already over is left alone)."""
        if self._request is request:
            self._end_exchange()
            self._to(CLOSED)  # (connection_lost, which follows, finds nothing to end)
            self.abort()

    def detach(self) -> TransportStream:
        """The raw stream after a ``101`` (bytes after the head come first)."""
        if self.state != SWITCHED or self.stream is None:
            raise RuntimeError("only a switched connection can be detached")
        self._end_exchange()
        return self.stream

    def message_complete(self) -> None:
        if self.state == RECEIVING:
            # Read here, after any trailer section: llhttp honours a ``Connection:
            # close`` even there, and would refuse the next response on this parser.
            if not self.reader.keep_alive():
                self._reusable = False
            self._message_done()

    def _message_done(self) -> None:
        """The whole answer arrived: back to the pool if the exchange allows it."""
        listener = self._listener
        trailers = self._trailers
        sent = self._sent
        self._end_exchange()
        self.flow.resume_reading(BODY)
        if sent and self._reusable and not self.closing:
            self._to(IDLE)
            self.pool.release(self)
        else:
            self._to(CLOSED)
            self.close()
        if listener is not None:
            listener.on_end(trailers)

    def _switched(self, rest: bytes) -> None:
        """A 101 arrived: the rest of the connection is a raw byte stream."""
        assert self.transport is not None
        listener = self._listener
        head, self._switch_head = self._switch_head, None
        if self.state != AWAITING_HEAD or listener is None or head is None:
            self.abort()
            return
        self._reusable = False
        self._to(SWITCHED)
        self.stream = TransportStream(self.transport, self.flow, rest)
        listener.on_head(self, 101, head[0], head[1], None)

    def final_head(self, status: int, reason: str, headers: Headers, length: int | None,
                   chunked: bool, coded: bool, trailers: Headers) -> None:
        request = self._request
        assert request is not None
        self._length = length
        self._chunked = chunked
        self._trailers = trailers
        head_only = self.reader.head_only
        if not poolable(head_only, status, length, coded):
            self._reusable = False
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self._to(RECEIVING)
        request.listener.on_head(self, status, reason, headers, length)
        if head_only and self._request is request:
            self.message_complete()

    def body(self, data: Piece) -> None:
        listener = self._listener
        if listener is None or self.state != RECEIVING:
            self._reusable = False  # a body where none belongs (HEAD answered with one)
            self.abort()
            return
        if not isinstance(data, bytes):  # a view of the read buffer (see ResponseReader)
            if len(data) < LEND_MIN:
                data = bytes(data)  # a few bytes must not keep a whole store
            else:
                self._reads.lent = True
        listener.on_body(data)
