"""One HTTP/1.1 connection to a backend (llhttp parser), as a state machine.

:meth:`UpstreamConnection.begin` writes a request (:class:`~proxy.upstream.sender.
RequestSender` streams its body) and the answer reaches the request's listener from the
parser callbacks (the contract is :mod:`proxy.upstream.request`). The response side has
named states (``IDLE`` → ``AWAITING_HEAD`` → ``RECEIVING`` → ``IDLE``, or ``SWITCHED``
after a 101, ``CLOSED``) and every change goes through one transition function.

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
from typing import TYPE_CHECKING, Callable, Final

import httptools

from proxy.flow.control import BODY, FlowControl, GuardedOutput
from proxy.flow.push import declared_length
from proxy.flow.stream import TransportStream
from proxy.request import Headers, Piece
from proxy.upstream.base import UpstreamError
from proxy.upstream.readbuffer import LEND_MIN
from proxy.upstream.reader import ResponseReader
from proxy.upstream.request import ResponseListener, UpstreamRequest
from proxy.upstream.sender import RequestSender
from proxy.upstream.unread import UNREAD
from proxy.wire.framing import poolable, request_framing
from proxy.wire.head import render_head, request_line

if TYPE_CHECKING:
    from proxy.upstream.pool import Pool



# ----------------------------------------------------------------------- connection

# The states of the response side of the connection. The request side is apart: the
# sender may still be writing the body while the answer arrives (an early answer).
IDLE: Final = 0  # no exchange: in the pool, or just connected
AWAITING_HEAD: Final = 1  # a request went out (or is going out), no final head yet
RECEIVING: Final = 2  # the final head arrived, the body is being relayed
SWITCHED: Final = 3  # a 101 arrived: the connection is a raw byte stream now
CLOSED: Final = 4
_STATE_NAMES: Final[tuple[str, ...]] = (
    "idle", "awaiting-head", "receiving", "switched", "closed")


def _to_any(*states: int) -> int:
    mask = 0
    for state in states:
        mask |= 1 << state
    return mask


# Every transition the connection may take, as a bit mask per state (bit ``n`` set: may
# go to ``n``); anything else is a bug (raised at once). A variable-length tuple: see
# proxy.entrances.states.TRANSITIONS.
_TRANSITIONS: Final[tuple[int, ...]] = (
    _to_any(AWAITING_HEAD, CLOSED),  # IDLE
    _to_any(RECEIVING, SWITCHED, IDLE, CLOSED),  # AWAITING_HEAD (IDLE: HEAD answered)
    _to_any(IDLE, CLOSED),  # RECEIVING
    _to_any(CLOSED),  # SWITCHED
    _to_any(CLOSED),  # CLOSED (idempotent)
)


class UpstreamConnection(GuardedOutput):
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
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.flow: FlowControl = None  # type: ignore[assignment]  # set on connect
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # on connect
        self.idle_since = 0.0
        self.stream: TransportStream | None = None
        self.state = IDLE
        self.reader = ResponseReader(self, pool.head_limits)
        self._reads = pool.reads
        self._request: UpstreamRequest | None = None
        self._listener: ResponseListener | None = None
        self._sender: RequestSender | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._trailers: Headers = []
        self._switch_head: tuple[str, Headers] | None = None  # a 101's, until llhttp stops
        self._length: int | None = None  # the response's Content-Length
        self._chunked = False  # the response body is chunked
        self._got_bytes = False
        self._sent = False  # the whole request (head and body) was written
        self._reusable = True
        self._fd = -1

    def _to(self, state: int) -> None:
        """The one place the state changes; a transition not in the table is a bug."""
        if (_TRANSITIONS[self.state] >> state) & 1 != 1:
            raise RuntimeError(f"upstream connection: {_STATE_NAMES[self.state]} -> "
                               f"{_STATE_NAMES[state]}")
        self.state = state

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
        length = declared_length(body)
        head = render_head(request_line(request.method, request.target),
                           request.headers, request_framing(request.method, length))
        if length == 0:
            self.write(head)
            self.request_sent()
            return
        sender = self._sender = RequestSender(self, length is None)
        sender.start(head, body)

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
            self._to(CLOSED)  # (connection_lost, which follows, finds nothing to end)
            self.abort()

    def detach(self) -> TransportStream:
        """The raw stream after a ``101`` (bytes after the head come first)."""
        if self.state != SWITCHED or self.stream is None:
            raise RuntimeError("only a switched connection can be detached")
        self._end_exchange()
        return self.stream

    def request_sent(self) -> None:
        """The whole request went out: the head timeout starts now (route timeouts
        do not count the upload)."""
        self._sent = True
        request = self._request
        if self.state == AWAITING_HEAD and request is not None:
            timeout = request.head_timeout
            if timeout is not None:
                self._timer = self.loop.call_later(timeout, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.state == AWAITING_HEAD:
            self._fail(UpstreamError("timeout", "backend response headers timed out"))

    def body_failed(self, error: UpstreamError) -> None:
        """The client's body broke off (gone, or malformed). Before the answer there is
        nothing to relay; an answer already relayed stands, but the connection, half
        way through a request, cannot be reused."""
        self._reusable = False
        if self.state == AWAITING_HEAD:
            self._fail(error)

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
        if self.state != CLOSED:
            self._to(CLOSED)
        self.abort()
        if listener is not None:
            listener.on_error(error)

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

    # -- what the reader read (an exception raised here becomes a 502)

    def expects_head(self) -> bool:
        """A request is out and its final head has not come yet."""
        return self.state == AWAITING_HEAD

    def interim(self, status: int, headers: Headers) -> None:
        listener = self._listener
        if listener is not None:
            listener.on_interim(status, headers)

    def switching(self, reason: str, headers: Headers) -> None:
        request = self._request
        assert request is not None
        if not _asks_upgrade(request.headers):
            raise UpstreamError("other", "backend switched protocols unasked")
        self._switch_head = (reason, headers)  # the listener hears of it in _switched

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

    def message_complete(self) -> None:
        if self.state == RECEIVING:
            # Read here, after any trailer section: llhttp honours a ``Connection:
            # close`` even there, and would refuse the next response on this parser.
            if not self.reader.keep_alive():
                self._reusable = False
            self._message_done()


def _asks_upgrade(headers: Headers) -> bool:
    return any(len(name) == 7 and name.lower() == b"upgrade" for name, _ in headers)
