"""The HTTP/1.1 entrance: a raw asyncio Protocol per client connection (llhttp parser).

Shape: :class:`HTTP1Protocol` owns the
transport and the parser; parser callbacks only collect; each request becomes a
:class:`Cycle` — the request/response exchange, which is also the Handler's
:class:`~proxy.request.Responder` — run in its own task, apart from the transport
lifecycle; flow control lives in :class:`proxy.flow.control.FlowControl`.

Behaviour, in RFC 9112 terms:

- keep-alive; pipelined requests are answered in order, one at a time (reading pauses
  while a complete request waits);
- Content-Length and chunked request bodies stream to the Handler with backpressure;
  ``Expect: 100-continue`` is answered when the Handler first reads the body;
- response framing: the Handler's Content-Length, else chunked (HTTP/1.1), else
  close-delimited (HTTP/1.0); no body for HEAD, 1xx, 204, 304;
- llhttp runs in strict mode (it rejects CL+TE, repeated Content-Length, bare LF/CR,
  obs-fold, NUL/CTL in values, whitespace before the colon, bad chunk sizes); this
  module adds what it leaves open: Host presence/uniqueness/syntax, Transfer-Encoding
  other than exactly ``chunked``, TE on HTTP/1.0, HTTP versions other than 1.0/1.1,
  CONNECT, request-target form, head-size and header-count limits, chunk-extension
  size, and timeouts. Every rejection is a small ``Connection: close`` answer and the
  connection ends, so nothing after a malformed message can be smuggled through.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections import deque
from typing import TYPE_CHECKING

import httptools

from proxy.entrances import proxyproto
from proxy.entrances.body import RequestBody
from proxy.entrances.cycle import CONTINUE, FINISHED, IDLE, Cycle
from proxy.flow.control import PIPELINE, UPGRADE, FlowControl, GuardedOutput
from proxy.flow.stream import TransportStream
from proxy.request import EMPTY_BODY, BodyError, Headers, Request
from proxy.wire.framing import MAX_CHUNK_SIZE, chunk_size_before
from proxy.wire.head import ERRORS
from proxy.wire.request import Rejection, validate_head

if TYPE_CHECKING:
    from proxy.entrances.listener import Entrance

log = logging.getLogger("tunnelgate.http1")

FEED_SLICE = 16 * 1024  # large reads are fed in slices so head/chunk limits stay exact
CHUNK_OVERHEAD = 4096  # bytes of chunk framing tolerated beyond…
CHUNK_OVERHEAD_PER_CHUNK = 64  # …this much per chunk (size line, CRLFs, short extensions)
CHUNK_LINE_SCAN = CHUNK_OVERHEAD + 64  # longest chunk-size line looked at (extensions)

# ----------------------------------------------------------------------- connection

_NO_TIMER, _HEAD_TIMER, _IDLE_TIMER, _LINGER_TIMER, _BODY_TIMER = range(5)
LINGER_TIMEOUT = 2.0  # longest wait for a client's EOF after a close-after-answer
LINGER_LIMIT = 256 * 1024  # most bytes read and dropped meanwhile
_NEVER = float("inf")


class HTTP1Protocol(GuardedOutput):
    """One client connection of an entrance."""

    def __init__(self, entrance: Entrance) -> None:
        self.entrance = entrance
        self.settings = entrance.settings
        self.loop = entrance.loop
        self.transport: asyncio.Transport | None = None
        self.flow: FlowControl = None  # type: ignore[assignment]  # set on connect
        self.closing = False
        self.draining = entrance.draining  # answer with Connection: close, then close
        self.client_ip: str | None = None
        self.deadline = _NEVER  # loop time the current header/idle timer expires
        self._parser = httptools.HttpRequestParser(self)
        self._cycle: Cycle | None = None  # the one the Handler is serving
        self._queue: deque[Cycle | int] = deque()  # pipelined cycles / error statuses
        self._parsing: Cycle | None = None  # message whose body is being parsed
        self._stream: TransportStream | None = None
        self._ready: Cycle | None = None  # head complete, handed over after the parse
        self._halted = False  # parser stopped at an upgrade; later bytes are stashed
        self._stash: list[bytes] = []
        self._proxy_buf: bytearray | None = None
        self._first_bytes = True  # nothing received yet on this connection
        self._timer_kind = _NO_TIMER
        # message being parsed
        self._in_head = False
        self._url = b""
        self._headers: Headers = []
        self._head_size = 0
        self._head_stream = 0
        self._chunks = 0
        self._overhead = 0
        self._fed_body = 0
        self._seq = 0  # messages begun; tells whether a slice stayed inside one message
        self._in_chunked = False
        self._chunk_mark = -1  # _fed_body at the last chunk header of the slice fed
        self._line_start = False  # the last slice fed ended a line (see _chunk_too_large)
        self._rejected = False
        self._linger_left = -1  # bytes still dropped before a lingering close (see _linger)
        self._refusal: Rejection | None = None  # raised by a parser callback (see _feed)
        self._eof = False
        self._reframe: bytes | None = None
        self._synthetic = False

    # -- transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport
        self.flow = FlowControl(transport)  # type: ignore[arg-type]
        entrance = self.entrance
        if len(entrance.connections) >= self.settings.max_connections:
            refused = entrance.refusals.allow(self.loop.time())
            if refused is not None:  # a flood of refusals is one line per interval
                log.warning("%s entrance: connection limit %d reached, refusing",
                            self.settings.name, self.settings.max_connections,
                            extra={"refused_since_last": refused})
            self.closing = True
            self.transport.abort()  # type: ignore[union-attr]  # set just above
            return
        entrance.add(self)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.client_ip = _plain_ip(peer[0])
        # The allow list is checked against the socket peer, never against the address
        # a PROXY header claims: that one is chosen by whoever connects.
        if not self._allowed():
            return
        if self.settings.proxy_protocol:
            self._proxy_buf = bytearray()
        self._arm(_HEAD_TIMER)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.entrance.discard(self)
        self._disarm()
        self.flow.connection_lost()
        if self._stream is not None:
            self._stream.feed_eof()
        gone = BodyError("client went away")
        for cycle in (self._cycle, self._parsing):
            if cycle is not None:
                cycle.aborted = True
                if cycle.body is not None:
                    cycle.body.fail(gone)
        cycle = self._cycle
        if cycle is not None and cycle.running is not None and cycle.state < FINISHED:
            cycle.running.cancel()  # the Handler stops waiting on its backend
        self._ready = None
        self._queue.clear()
        # The parser holds bound methods of this protocol, a reference cycle: without
        # this, only the cyclic GC could free a closed connection and all it still
        # refers to (proxy.control.admin explains why such garbage must not wait for it).
        self._parser = httptools.HttpRequestParser(None)

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        if self._cycle is not None:
            self._cycle.writable()

    def eof_received(self) -> bool:
        # The client stopped sending. Requests it pipelined before that are still
        # answered (half-close, RFC 9112 §9.6); otherwise it counts as gone — like Go's
        # server and nginx, a request in flight is then abandoned (its Handler is
        # cancelled by connection_lost, which follows the close).
        if self._stream is not None:
            self._stream.feed_eof()
            return False
        self._eof = True
        parsing = self._parsing
        if parsing is not None and parsing.body is not None:
            parsing.aborted = True  # gone: no answer owed, nothing to log (counted)
            parsing.body.fail(BodyError("client closed before the body ended"))
        return bool(self._queue)

    def data_received(self, data: bytes) -> None:
        if self._stream is not None:
            self._stream.feed(data)
            return
        if self._rejected:
            if self._linger_left >= 0:
                self._linger_left -= len(data)
                if self._linger_left < 0:
                    self.close()  # lingered long enough: the rest is not worth reading
            return
        if self._proxy_buf is not None:
            data = self._read_proxy_header(data)
            if not data:
                return
        elif self._first_bytes and proxyproto.looks_like_header(data):
            log.info("%s entrance: PROXY header on a connection that expects none: "
                     "closing without an answer", self.settings.name)
            self.close()
            return
        self._first_bytes = False
        if self._halted:
            self._stash.append(data)
            return
        if self._timer_kind == _IDLE_TIMER:
            self._arm(_HEAD_TIMER)  # first byte of the next request
        if len(data) <= FEED_SLICE:
            self._feed(data)
            return
        view = memoryview(data)
        for start in range(0, len(data), FEED_SLICE):
            if self._rejected:
                return
            if self._halted:
                self._stash.append(bytes(view[start:]))
                return
            self._feed(view[start:start + FEED_SLICE])

    # -- parsing

    def _feed(self, data: bytes | memoryview) -> None:
        """Parse ``data``; a request whose head completed in it is handed to the
        Handler only now, outside the parser's callbacks (it may answer at once)."""
        self._parse(data)
        ready = self._ready
        if ready is not None:
            self._ready = None
            self._start(ready)

    def _parse(self, data: bytes | memoryview) -> None:
        seq = self._seq
        head_before = self._in_head
        chunked_before = self._in_chunked
        self._fed_body = 0
        self._chunk_mark = -1
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._upgrade_point(bytes(data[exc.args[0]:]))
            return
        except httptools.HttpParserCallbackError as exc:
            # The callback's own exception is taken from where it recorded it, not from
            # ``exc.__context__``: raised while another exception counts as handled
            # (compiled coroutines may leave one set), the context would be that one.
            reject, self._refusal = self._refusal, None
            if reject is not None:
                self._reject(reject.status, str(reject))
            else:
                log.error("parser callback failed", exc_info=exc.__context__)
                self._reject(500, "internal error")
            return
        except httptools.HttpParserError as exc:
            self._reject(400, str(exc))
            return
        if self._in_chunked:
            if self._chunk_mark >= 0 and self._chunk_too_large(data):
                self._reject(400, "chunk size too large")
                return
            self._line_start = data[-1:] == b"\n"
        if seq != self._seq:
            return
        # What callbacks cannot see, measured over slices that lie wholly inside one
        # part of one message: a head that stays incomplete (its bytes sit in the
        # parser), and chunk framing (chunk extensions produce no callback at all).
        settings = self.settings
        if head_before and self._in_head:
            self._head_stream += len(data)
            if self._head_stream > settings.max_header_bytes + settings.max_request_line:
                self._reject(431 if self._headers else 414, "request head too large")
        elif chunked_before and self._in_chunked:
            self._overhead += len(data) - self._fed_body
            if self._overhead > CHUNK_OVERHEAD + CHUNK_OVERHEAD_PER_CHUNK * self._chunks:
                self._reject(400, "chunk framing too large")

    def on_message_begin(self) -> None:
        self._seq += 1
        if self._synthetic:
            return
        self._in_chunked = False
        self._in_head = True
        self._url = b""
        self._headers = []
        self._head_size = 0
        self._head_stream = 0
        self._chunks = 0
        self._overhead = 0

    def on_url(self, url: bytes) -> None:
        if self._synthetic:
            return
        url = self._url + url if self._url else url
        if len(url) > self.settings.max_request_line:
            raise self._refuse(414, "request line too long")
        self._url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._synthetic:
            return
        value = value.rstrip(b" \t")  # llhttp keeps trailing OWS (RFC 9110 §5.5)
        self._head_size += len(name) + len(value) + 4
        if self._head_size > self.settings.max_header_bytes:
            raise self._refuse(431, "header section too large")
        if not self._in_head:
            self._fed_body += len(name) + len(value) + 4  # a trailer, not framing
            parsing = self._parsing
            if parsing is not None and parsing.body is not None:
                trailers = parsing.body.trailers
                trailers.append((name, value))  # forwarded with the last chunk
                if len(trailers) > self.settings.max_headers:
                    raise self._refuse(431, "too many trailer fields")
            return
        headers = self._headers
        headers.append((name, value))
        if len(headers) > self.settings.max_headers:
            raise self._refuse(431, "too many header fields")

    def on_headers_complete(self) -> None:
        if self._synthetic:
            self._synthetic = False
            return
        self._in_head = False
        try:
            cycle = self._build_cycle()
        except Rejection as reject:
            raise self._refuse(reject.status, str(reject))
        if cycle.body is not None:
            self._parsing = cycle
        if self._cycle is None:
            self._cycle = self._ready = cycle  # started once the parser returned
        else:
            self._queue.append(cycle)
            self.flow.pause_reading(PIPELINE)

    def _refuse(self, status: int, detail: str) -> Rejection:
        """The rejection a parser callback raises, recorded for :meth:`_feed`."""
        self._refusal = Rejection(status, detail)
        return self._refusal

    def on_chunk_header(self) -> None:
        self._chunks += 1
        self._chunk_mark = self._fed_body  # body bytes of this slice before this chunk

    def _chunk_too_large(self, data: bytes | memoryview) -> bool:
        """Whether the size of the chunk this slice ends in exceeds MAX_CHUNK_SIZE.

        Everything after the last chunk's size line is chunk data (``_fed_body`` past
        ``_chunk_mark``), so the line ends exactly that far from the slice's end; llhttp
        already checked its syntax. llhttp itself accepts sizes up to 2^64-1 and
        would wait for that body forever.
        """
        end = len(data) - (self._fed_body - self._chunk_mark)
        start = max(0, end - CHUNK_LINE_SCAN)
        size = chunk_size_before(bytes(data[start:end]), end - start,
                                 start == 0 and self._line_start)
        return size is not None and size > MAX_CHUNK_SIZE

    def on_body(self, data: bytes) -> None:
        self._fed_body += len(data)
        parsing = self._parsing
        if parsing is not None and parsing.body is not None:
            parsing.body.feed(data)

    def on_message_complete(self) -> None:
        if self._reframe is not None:
            return  # the body of an ignored upgrade follows; see _upgrade_point
        self._in_chunked = False
        parsing = self._parsing
        if parsing is not None:
            self._parsing = None
            if parsing.body is not None:
                parsing.body.end()

    def _build_cycle(self) -> Cycle:
        """Validate the head just parsed and turn it into a request cycle."""
        parser = self._parser
        version = parser.get_http_version()
        headers = self._headers
        head = validate_head(version, parser.get_method(), self._url, headers)
        if head.chunked:
            self._in_chunked = True
        wants_upgrade = parser.should_upgrade()
        keep_alive = parser.should_keep_alive() and not self.draining
        body: RequestBody | None = None
        if head.chunked or head.length:
            body = RequestBody(self, None if head.chunked else head.length,
                               head.expect_continue)
            if wants_upgrade:
                # llhttp would treat the body as the upgraded stream. We ignore the
                # Upgrade (RFC 9110 §7.8 allows it) and re-frame the body ourselves.
                self._reframe = (
                    b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                    if head.chunked else
                    b"PUT / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % head.length)
                wants_upgrade = False
        request = Request(
            head.method, head.path, head.query, head.host, headers,
            body if body is not None else EMPTY_BODY, self.settings.name,
            self.client_ip, self.settings.scheme, version,
            head.upgrade if wants_upgrade else None)
        return Cycle(self, request, body, keep_alive)

    def _upgrade_point(self, rest: bytes) -> None:
        """llhttp stopped after an upgrade (or CONNECT) head; ``rest`` followed it."""
        reframe = self._reframe
        if reframe is not None:
            self._reframe = None
            self._parser = httptools.HttpRequestParser(self)
            self._synthetic = True
            self._feed(reframe + rest)
            return
        self._halted = True
        if rest:
            self._stash.append(rest)
        self.flow.pause_reading(UPGRADE)

    def _reject(self, status: int, detail: str) -> None:
        """Answer a malformed message in its turn, then close; parse nothing more."""
        log.debug("%s entrance: rejecting request (%d): %s", self.settings.name,
                  status, detail)
        if self.settings.rejected is not None:
            self.settings.rejected(self.settings.name, status, detail, self.client_ip)
        self._rejected = True
        self._stash.clear()
        self.flow.pause_reading(PIPELINE)
        parsing, self._parsing = self._parsing, None
        if parsing is not None and parsing is self._ready:
            self._ready = None  # never seen by the Handler: answered here
            self._cycle = None
            parsing = None
        if parsing is not None and parsing.running is not None:
            # The Handler already has this request: its body fails and it answers
            # (or already did); the connection ends after that.
            # (The body fails last: a Handler driven by callbacks hears of it at once.)
            parsing.keep_alive = False
            if self._cycle is None:
                self.close()
            elif parsing.state == IDLE:
                parsing.aborted = True  # whatever the Handler would say is moot now
                self._send_error(status)
            if parsing.body is not None:
                parsing.body.fail(BodyError(f"malformed request body: {detail}"))
            return
        if parsing is not None:
            self._queue.remove(parsing)  # never seen by the Handler: answer it here
        if self._cycle is None and not self._queue:
            self._send_error(status)
        else:
            self._queue.append(status)

    # -- cycles

    def _start(self, cycle: Cycle) -> None:
        """Give ``cycle`` to the Handler: driven by callbacks when it can be (no
        task), else as a coroutine in a task of its own."""
        if cycle is not self._cycle or self.closing:
            return  # the connection ended before its turn came
        self._disarm()
        serve = self.entrance.serve
        if serve is not None:
            cycle.serve(serve)
        else:
            cycle.running = self.loop.create_task(cycle.run(self.entrance.handle))

    def serving(self, cycle: Cycle) -> bool:
        """Whether ``cycle`` is the request being answered now."""
        return self._cycle is cycle

    def cycle_done(self, cycle: Cycle) -> None:
        """The Handler returned: close, or move on to the next request."""
        self._cycle = None
        transport = self.transport
        assert transport is not None
        if self._stream is not None:
            self._stream.close()
            return
        if transport.is_closing():
            return
        body = cycle.body
        if not cycle.keep_alive or self.closing or (
                body is not None and not body.discard()):
            if body is not None and not body.complete and not cycle.aborted:
                self._linger()
            else:
                transport.close()
            return
        # Parsing stopped at an upgrade request. Resume it only once that request was
        # answered without switching; while it still waits in the queue, the bytes
        # after its head belong to the stream it may switch to, not to HTTP.
        if self._halted and not self._queue:
            self._resume_after_upgrade()
            if self._cycle is not None or transport.is_closing():
                return
        if self._queue:
            item = self._queue.popleft()
            if isinstance(item, int):
                self._send_error(item)
            else:
                # Started on the next loop turn: requests pipelined together and
                # answered at once must not nest one inside the other's completion.
                self._cycle = item
                self.loop.call_soon(self._start, item)
                if not self._queue and not self._rejected:
                    self.flow.resume_reading(PIPELINE)
            return
        if self._eof or self._rejected:
            transport.close()
            return
        self.flow.resume_reading(PIPELINE)
        busy = self._in_head or self._parsing is not None
        self._arm(_HEAD_TIMER if busy else _IDLE_TIMER)

    def _linger(self) -> None:
        """Close after an answer while the client is still sending its body.

        Closing a socket with unread input makes the kernel reset the connection, and
        a reset can destroy the answer before the client read it (RFC 9112 §9.6). So
        the sending side is shut down, the client's bytes are read and dropped (parse
        nothing more), and the socket closes on the client's EOF, after
        ``LINGER_TIMEOUT`` or after ``LINGER_LIMIT`` bytes, whichever comes first.
        """
        assert self.transport is not None
        self.closing = True
        self._rejected = True  # data_received drops everything from now on
        self._linger_left = LINGER_LIMIT
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_all()
        self._arm(_LINGER_TIMER)

    def _resume_after_upgrade(self) -> None:
        """An upgrade request was answered without switching: parse on from where
        llhttp stopped (the request had no body, so the next request starts there)."""
        self._halted = False
        self._parser = httptools.HttpRequestParser(self)
        stash, self._stash = self._stash, []
        self.flow.resume_reading(UPGRADE)
        for data in stash:
            self.data_received(data)  # stashes again if another upgrade halts it

    def switch_protocols(self) -> TransportStream:
        """Hand the raw connection to an upgraded stream (after the 101 was written)."""
        assert self.transport is not None
        self._disarm()
        stash, self._stash = self._stash, []
        self._halted = False
        self._stream = TransportStream(self.transport, self.flow, b"".join(stash))
        self.flow.resume_reading(UPGRADE)
        return self._stream

    def send_continue(self) -> None:
        """Interim 100 for a client that waits before sending its body (RFC 9110 §10.1.1)."""
        cycle = self._cycle
        if cycle is not None and cycle.state == IDLE:
            self.write(CONTINUE)

    def drain(self) -> None:
        """Close now if idle — no request in progress or queued, no byte of a next one
        received — else after the current response (see :meth:`Entrance.drain`)."""
        self.draining = True
        cycle = self._cycle
        if cycle is not None:
            cycle.keep_alive = False  # a head not yet rendered says Connection: close
        elif (self._stream is None and not self._in_head and self._parsing is None
                and not self._queue and not self._proxy_buf):
            self.close()

    # -- output

    def _send_error(self, status: int) -> None:
        self.closing = True
        self.write(ERRORS[status])
        assert self.transport is not None
        self.transport.close()

    # -- timers

    def body_progress(self, waiting: bool = True) -> None:
        """A pushed request body moved (or stopped being the client's to move): the
        longest pause in it is ``body_timeout``, counted only while the backend side
        is ready for more."""
        if waiting:
            self._arm(_BODY_TIMER)
        elif self._timer_kind == _BODY_TIMER:
            self._disarm()

    def _arm(self, kind: int) -> None:
        settings = self.settings
        delay = (settings.header_timeout if kind == _HEAD_TIMER
                 else LINGER_TIMEOUT if kind == _LINGER_TIMER
                 else settings.body_timeout if kind == _BODY_TIMER
                 else settings.idle_timeout)
        self._timer_kind = kind
        self.deadline = self.loop.time() + delay

    def _disarm(self) -> None:
        self._timer_kind = _NO_TIMER
        self.deadline = _NEVER

    def timed_out(self) -> None:
        """The entrance's sweep found this connection's deadline passed."""
        kind = self._timer_kind
        self._disarm()
        if kind == _LINGER_TIMER:
            self.close()
            return
        if kind == _BODY_TIMER:
            cycle = self._cycle
            if cycle is not None and cycle.body is not None:
                cycle.body.fail(BodyError("request body timed out"))
            self.close()
            return
        if self._cycle is not None or self.closing:
            return
        if kind == _HEAD_TIMER and self._in_head and self._parsing is None:
            if self.settings.rejected is not None:
                self.settings.rejected(self.settings.name, 408, "request head timeout",
                                       self.client_ip)
            self._send_error(408)  # part of a head arrived, not all of it
        else:
            self.close()  # idle, or mid-PROXY-header, or discarding a body

    # -- admission

    def _read_proxy_header(self, data: bytes) -> bytes:
        """Collect and parse the PROXY header that must open the connection."""
        buf = self._proxy_buf
        assert buf is not None
        buf += data
        try:
            header = proxyproto.parse(buf)
        except proxyproto.ProxyHeaderError as exc:
            log.info("%s entrance: closing connection: %s", self.settings.name, exc)
            self.close()
            return b""
        if header is None:
            return b""
        self._proxy_buf = None
        if header.source is not None:
            self.client_ip = _plain_ip(header.source[0])
        return bytes(buf[header.consumed:])

    def _allowed(self) -> bool:
        allow = self.settings.allow
        if allow is None or self.client_ip is None:
            return True
        address = ipaddress.ip_address(self.client_ip)
        if any(address in network for network in allow):
            return True
        log.info("%s entrance: refused connection from %s", self.settings.name,
                 self.client_ip)
        self.abort()
        return False


def _plain_ip(address: str) -> str:
    """IPv4-mapped IPv6 (``::ffff:a.b.c.d``) as plain IPv4; others unchanged."""
    if address.startswith("::ffff:") and "." in address:
        return address[7:]
    return address
