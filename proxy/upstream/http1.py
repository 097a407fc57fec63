"""One HTTP/1.1 connection to a backend: the asyncio adapter of a
:class:`~proxy.upstream.core.ClientCore`.

:meth:`UpstreamConnection.begin` writes a request (:class:`~proxy.upstream.sender.
RequestSender` streams its body); the bytes read go to the core, and the events it
returns go to the request's listener (the contract is :mod:`proxy.upstream.request`).
The states and their one transition table are the core's; this side holds the
exchange (request, listener, sender, head timer) and hands the connection on: to its
pool once an answer is complete, to the listener with a final head or a 101.

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
from typing import TYPE_CHECKING

from proxy.flow.control import BODY, FlowControl, GuardedOutput
from proxy.flow.stream import TransportStream
from proxy.request import Headers, Piece
from proxy.upstream.base import UpstreamError
from proxy.upstream.core import AWAITING_HEAD, SWITCHED, ClientCore
from proxy.upstream.events import Data, End, Event, Failed, Head, Interim, Upgrade
from proxy.upstream.readbuffer import LEND_MIN
from proxy.upstream.request import ResponseListener, UpstreamRequest
from proxy.upstream.sender import RequestSender
from proxy.wire.framing import request_framing
from proxy.wire.head import render_head, request_line

if TYPE_CHECKING:
    from proxy.upstream.pool import Pool


class UpstreamConnection(GuardedOutput):
    """One HTTP/1.1 connection to a backend; one exchange at a time, driven by the
    transport's callbacks (no task, no future).

    Response bytes are trusted only as the answer to the request being exchanged:
    bytes on an idle connection, or a message after the complete answer, mean the
    backend is out of step with us, and the connection is closed rather than letting
    them reach the next request's client (a response desync).
    """

    flow: FlowControl
    loop: asyncio.AbstractEventLoop

    def __init__(self, pool: "Pool") -> None:
        self.transport: asyncio.Transport | None = None
        self.pool = pool
        self.core = ClientCore(pool.head_limits)
        self.idle_since = 0.0
        self.stream: TransportStream | None = None
        self._reads = pool.reads
        self.fd = -1  # the socket's, once connected
        self._request: UpstreamRequest | None = None
        self._listener: ResponseListener | None = None
        self._sender: RequestSender | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._sent = False  # the whole request (head and body) was written
        self._reusable = True

    # -- transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.loop = asyncio.get_running_loop()
        self.attach(transport)  # type: ignore[arg-type]  # a stream transport
        self.flow = FlowControl(transport)  # type: ignore[arg-type]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.fd = sock.fileno()

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        if self._sender is not None:
            self._sender.resume()

    def get_buffer(self, sizehint: object) -> memoryview:
        """Where the event loop reads to (``sizehint`` is only advice)."""
        return self._reads.take()

    def buffer_updated(self, nbytes: int) -> None:
        reads = self._reads
        self._received(reads.view[:nbytes], reads.store)

    def data_received(self, data: bytes) -> None:
        """Bytes read by a transport that does not take a buffer (asyncio's own loop
        gives one only to an ``asyncio.BufferedProtocol``; uvloop to any protocol)."""
        self._received(data, data)

    def _received(self, data: Piece, whole: bytes | bytearray) -> None:
        """``data`` was read; ``whole`` holds it from its first byte (the store it was
        read into, or ``data`` itself), for the core to search in place."""
        if self.stream is not None:
            self.stream.feed(bytes(data))  # kept until the stream is read: a copy
            return
        listener = self._listener
        if listener is None:
            self.abort()  # bytes nobody asked for: the connection is out of sync
            return
        for event in self.core.receive(data, whole):
            self._handle(event)
        listener.on_read_end()

    def eof_received(self) -> bool:
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

    def _lost(self) -> None:
        self.closing = True
        self.pool.forget(self)
        for event in self.core.closed():
            self._handle(event)

    # -- what the core read

    def _handle(self, event: Event) -> None:
        listener = self._listener
        if isinstance(event, Failed):
            request = self._request
            if event.unanswered and request is not None:
                self._end_exchange()
                self.pool.stale(request)  # retried once, or answered 502
            else:
                self._fail(UpstreamError("other", event.message))
        elif listener is None:
            return  # the exchange was given up while its answer was being read
        elif isinstance(event, Data):
            self._body(listener, event.data)
        elif isinstance(event, Head):
            self._head(listener, event)
        elif isinstance(event, End):
            self._message_done(listener, event.trailers, event.keep_alive)
        elif isinstance(event, Interim):
            listener.on_interim(event.status, event.headers)
        elif isinstance(event, Upgrade):
            self._switched(listener, event.reason, event.headers, event.rest)

    def _head(self, listener: ResponseListener, head: Head) -> None:
        if not head.reusable:
            self._reusable = False
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        listener.on_head(self, head.status, head.reason, head.headers, head.length)

    def _body(self, listener: ResponseListener, data: Piece) -> None:
        if not isinstance(data, bytes):  # a view of the read buffer
            if len(data) < LEND_MIN:
                data = bytes(data)  # a few bytes must not keep a whole store
            else:
                self._reads.lent = True
        listener.on_body(data)

    def _message_done(self, listener: ResponseListener, trailers: Headers,
                      keep_alive: bool) -> None:
        """The whole answer arrived: back to the pool if the exchange allows it."""
        sent = self._sent
        self._end_exchange()
        self.flow.resume_reading(BODY)
        if sent and keep_alive and self._reusable and not self.closing:
            self.pool.release(self)
        else:
            self.core.close()
            self.close()
        listener.on_end(trailers)

    def _switched(self, listener: ResponseListener, reason: str, headers: Headers,
                  rest: bytes) -> None:
        """A 101 arrived: the rest of the connection is a raw byte stream."""
        assert self.transport is not None
        self._reusable = False
        self.stream = TransportStream(self.transport, self.flow, rest)
        listener.on_head(self, 101, reason, headers, None)

    # -- the exchange

    def begin(self, request: UpstreamRequest) -> None:
        """Write ``request`` on this idle connection and expect its answer; the answer
        goes to ``request.listener`` (see :mod:`proxy.upstream.request`)."""
        self.core.send(request.method == "HEAD", _asks_upgrade(request.headers))
        request.conn = self
        self._request = request
        self._listener = request.listener
        self._sent = False
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

    def request_sent(self) -> None:
        """The whole request went out: the head timeout starts now (route timeouts
        do not count the upload)."""
        self._sent = True
        request = self._request
        if self.core.state is AWAITING_HEAD and request is not None:
            timeout = request.head_timeout
            if timeout is not None:
                self._timer = self.loop.call_later(timeout, self._head_timed_out)

    def head_overdue(self, now: float, limit: float) -> None:
        """The pool's sweep (:meth:`proxy.upstream.pool.Pool._watch_heads`) at loop time
        ``now``: a request sent whole that waits for its head with no timeout of its
        own fails once it waited ``limit`` seconds, counted from the sweep that first
        found it waiting (so never early). A head already received ends the wait."""
        request = self._request
        if (request is None or self.core.state is not AWAITING_HEAD or not self._sent
                or request.head_timeout is not None):
            return
        if request.waiting_since < 0:
            request.waiting_since = now
        elif now - request.waiting_since >= limit:
            self._head_timed_out()

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.core.state is AWAITING_HEAD:
            self._fail(UpstreamError("timeout", "backend response headers timed out"))

    def body_failed(self, error: UpstreamError) -> None:
        """The client's body broke off (gone, or malformed). Before the answer there is
        nothing to relay; an answer already relayed stands, but the connection, half
        way through a request, cannot be reused."""
        self._reusable = False
        if self.core.state is AWAITING_HEAD:
            self._fail(error)

    def pause(self) -> None:
        """The listener cannot take more body now: stop reading from the backend."""
        self.flow.pause_reading(BODY)

    def resume(self) -> None:
        self.flow.resume_reading(BODY)

    def abandon(self, request: UpstreamRequest) -> None:
        """``request``'s side gave up: an exchange still running cannot be finished,
        so the connection closes (one already over is left alone)."""
        if self._request is request:
            self._end_exchange()
            self.core.close()  # (connection_lost, which follows, finds nothing to end)
            self.abort()

    def detach(self) -> TransportStream:
        """The raw stream after a ``101`` (bytes after the head come first)."""
        if self.core.state is not SWITCHED or self.stream is None:
            raise RuntimeError("only a switched connection can be detached")
        self._end_exchange()
        return self.stream

    def _end_exchange(self) -> UpstreamRequest | None:
        """Detach the exchange: no listener call follows. Returns its request."""
        request, self._request = self._request, None
        self._listener = None
        if request is not None:
            request.conn = None
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.stop()
        return request

    def _fail(self, error: UpstreamError) -> None:
        """The exchange cannot complete: close, and tell the listener (once)."""
        listener = self._listener
        self._end_exchange()
        self.core.close()
        self.abort()
        if listener is not None:
            listener.on_error(error)


def _asks_upgrade(headers: Headers) -> bool:
    return any(len(name) == 7 and name.lower() == b"upgrade" for name, _ in headers)
