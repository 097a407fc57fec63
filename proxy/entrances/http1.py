"""The HTTP/1.1 entrance: a raw asyncio Protocol per client connection (llhttp parser).

Shape: :class:`HTTP1Protocol` owns the transport and the connection's state
(:mod:`proxy.entrances.states`); its :class:`~proxy.entrances.reader.RequestReader`
parses (callbacks only collect) and turns each head into a :class:`Cycle` — the
request/response exchange, which is also the Handler's :class:`~proxy.request.Responder`
— driven by callbacks or run in a task of its own, apart from the transport lifecycle;
admission (limit, allow list, PROXY header) is :mod:`proxy.entrances.admission`; flow
control lives in :class:`proxy.flow.control.FlowControl`.

Behaviour, in RFC 9112 terms:

- keep-alive; pipelined requests are answered in order, one at a time (reading pauses
  while a complete request waits);
- Content-Length and chunked request bodies stream to the Handler with backpressure;
  ``Expect: 100-continue`` is answered when the Handler first reads the body;
- response framing: the Handler's Content-Length, else chunked (HTTP/1.1), else
  close-delimited (HTTP/1.0); no body for HEAD, 1xx, 204, 304;
- llhttp runs in strict mode (it rejects CL+TE, repeated Content-Length, bare LF/CR,
  obs-fold, NUL/CTL in values, whitespace before the colon, bad chunk sizes); the
  reader adds what it leaves open: Host presence/uniqueness/syntax, Transfer-Encoding
  other than exactly ``chunked``, TE on HTTP/1.0, HTTP versions other than 1.0/1.1,
  CONNECT, request-target form, head-size and header-count limits, chunk-extension
  size, and timeouts. Every rejection is a small ``Connection: close`` answer and the
  connection ends, so nothing after a malformed message can be smuggled through.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING

from proxy.entrances import proxyproto
from proxy.entrances.admission import (over_limit, peer_allowed, plain_ip,
                                       read_proxy_header)
from proxy.entrances.cycle import CONTINUE, FINISHED, IDLE as CYCLE_IDLE, Cycle
from proxy.entrances.reader import RequestReader
from proxy.entrances.states import (BODY, CLOSED, HALTED, HEAD, IDLE, LINGERING, NAMES,
                                    NEW, PROXY, REFRAME, REJECTED, UPGRADED, allowed)
from proxy.flow.control import PIPELINE, UPGRADE, FlowControl, GuardedOutput
from proxy.flow.stream import TransportStream
from proxy.request import BodyError
from proxy.wire.head import ERRORS

if TYPE_CHECKING:
    from proxy.entrances.listener import Entrance

log = logging.getLogger("tunnelgate.http1")

# ----------------------------------------------------------------------- connection

_NO_TIMER, _HEAD_TIMER, _IDLE_TIMER, _LINGER_TIMER, _BODY_TIMER = range(5)
LINGER_TIMEOUT = 2.0  # longest wait for a client's EOF after a close-after-answer
LINGER_LIMIT = 256 * 1024  # most bytes read and dropped meanwhile
_NEVER = float("inf")


class HTTP1Protocol(GuardedOutput):
    """One client connection of an entrance.

    ``state`` (:mod:`proxy.entrances.states`) says what is done with received bytes;
    it changes only in :meth:`enter`. ``_cycle`` is the request the Handler serves,
    ``_queue`` the pipelined ones (or refusal statuses) answered after it. ``_eof``
    (the client half-closed) is apart from the state: what it sent before is still
    answered, bytes kept aside at an upgrade request included.
    """

    def __init__(self, entrance: Entrance) -> None:
        self.entrance = entrance
        self.settings = entrance.settings
        self.loop = entrance.loop
        self.transport: asyncio.Transport | None = None
        self.flow: FlowControl = None  # type: ignore[assignment]  # set on connect
        self.state = NEW
        self.closing = False
        self.draining = entrance.draining  # answer with Connection: close, then close
        self.client_ip: str | None = None
        self.deadline = _NEVER  # loop time the current timer expires
        self._reader = RequestReader(self)
        self._cycle: Cycle | None = None  # the one the Handler is serving
        self._queue: deque[Cycle | int] = deque()  # pipelined cycles / error statuses
        self._stream: TransportStream | None = None  # UPGRADED: the raw stream
        self._stash: list[bytes] = []  # HALTED: bytes after the upgrade request
        self._proxy_buf: bytearray | None = None  # PROXY: the header so far
        self._linger_left = 0  # LINGERING: bytes still dropped before closing
        self._timer_kind = _NO_TIMER
        self._eof = False

    def enter(self, state: int) -> None:
        """The one place the state changes; a transition not in the table is a bug."""
        if not allowed(self.state, state):
            raise RuntimeError(f"client connection: {NAMES[self.state]} -> "
                               f"{NAMES[state]}")
        self.state = state

    # -- transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport
        self.flow = FlowControl(transport)  # type: ignore[arg-type]
        entrance = self.entrance
        if over_limit(entrance):
            self.abort()
            return
        entrance.add(self)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.client_ip = plain_ip(peer[0])
        if not peer_allowed(self.settings, self.client_ip):
            self.abort()
            return
        if self.settings.proxy_protocol:
            self._proxy_buf = bytearray()
            self.enter(PROXY)
        self._arm(_HEAD_TIMER)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.enter(CLOSED)
        self.entrance.discard(self)
        self._disarm()
        self.flow.connection_lost()
        if self._stream is not None:
            self._stream.feed_eof()
        gone = BodyError("client went away")
        reader = self._reader
        for cycle in (self._cycle, reader.parsing):
            if cycle is not None:
                cycle.aborted = True
                if cycle.body is not None:
                    cycle.body.fail(gone)
        cycle = self._cycle
        if cycle is not None and cycle.running is not None and cycle.state < FINISHED:
            cycle.running.cancel()  # the Handler stops waiting on its backend
        self._queue.clear()
        reader.release()

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
        parsing = self._reader.parsing
        if parsing is not None and parsing.body is not None:
            parsing.aborted = True  # gone: no answer owed, nothing to log (counted)
            parsing.body.fail(BodyError("client closed before the body ended"))
        return bool(self._queue)

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state > REFRAME:  # not HTTP to parse now
            data = self._received_aside(state, data)
            if not data:
                return
        if self._timer_kind == _IDLE_TIMER:
            self._arm(_HEAD_TIMER)  # first byte of the next request
        self._reader.feed(data)

    def _received_aside(self, state: int, data: bytes) -> bytes:
        """Bytes that arrived while the connection is not parsing; returns what is
        left to parse (nothing unless the connection started parsing now)."""
        if state == UPGRADED:
            assert self._stream is not None
            self._stream.feed(data)
        elif state == HALTED:
            self._stash.append(data)
        elif state == LINGERING:
            self._linger_left -= len(data)
            if self._linger_left < 0:
                self.close()  # lingered long enough: the rest is not worth reading
        elif state == PROXY:
            return self._read_proxy_header(data)
        elif state == NEW:
            if proxyproto.looks_like_header(data):
                log.info("%s entrance: PROXY header on a connection that expects none: "
                         "closing without an answer", self.settings.name)
                self.close()
                return b""
            self.enter(IDLE)
            return data
        return b""  # rejected (or closed): dropped

    def _read_proxy_header(self, data: bytes) -> bytes:
        """Collect the PROXY header; once complete, parse on from after it."""
        buf = self._proxy_buf
        assert buf is not None
        try:
            header = read_proxy_header(buf, data, self.settings)
        except proxyproto.ProxyHeaderError:
            self.close()
            return b""
        if header is None:
            return b""
        self._proxy_buf = None
        if header.source is not None:
            self.client_ip = plain_ip(header.source[0])
        self.enter(IDLE)
        return bytes(buf[header.consumed:])

    # -- what the reader found

    def accept(self, cycle: Cycle) -> bool:
        """A request head was parsed: True if ``cycle`` is to be served now, else it
        waits its turn (and reading pauses meanwhile)."""
        if self._cycle is None:
            self._cycle = cycle
            return True
        self._queue.append(cycle)
        self.flow.pause_reading(PIPELINE)
        return False

    def halt(self, rest: bytes) -> None:
        """llhttp stopped after an upgrade request's head; ``rest`` followed it. Until
        the request is answered, later bytes are kept aside: they belong to the stream
        it may switch to, or else to the next request."""
        self.enter(HALTED)
        if rest:
            self._stash.append(rest)
        self.flow.pause_reading(UPGRADE)

    def stash(self, data: bytes) -> None:
        """Keep ``data`` aside (HALTED)."""
        self._stash.append(data)

    def reject(self, status: int, detail: str) -> None:
        """Answer a malformed message in its turn, then close; parse nothing more.
        Moot once the connection stopped parsing (lingering, or gone)."""
        if self.state >= REJECTED:
            return
        log.debug("%s entrance: rejecting request (%d): %s", self.settings.name,
                  status, detail)
        if self.settings.rejected is not None:
            self.settings.rejected(self.settings.name, status, detail, self.client_ip)
        self.enter(REJECTED)
        self.flow.pause_reading(PIPELINE)
        reader = self._reader
        parsing, reader.parsing = reader.parsing, None
        if parsing is not None and parsing is reader.ready:
            reader.ready = None  # never seen by the Handler: answered here
            self._cycle = None
            parsing = None
        if parsing is not None and parsing.running is not None:
            self._fail_served(parsing, status, detail)
            return
        if parsing is not None:
            self._queue.remove(parsing)  # never seen by the Handler: answer it here
        if self._cycle is None and not self._queue:
            self._send_error(status)
        else:
            self._queue.append(status)

    def _fail_served(self, cycle: Cycle, status: int, detail: str) -> None:
        """The Handler already has the refused request: its body fails and it answers
        (or already did); the connection ends after that. (The body fails last: a
        Handler driven by callbacks hears of it at once.)"""
        cycle.keep_alive = False
        if self._cycle is None:
            self.close()
        elif cycle.state == CYCLE_IDLE:
            cycle.aborted = True  # whatever the Handler would say is moot now
            self._send_error(status)
        if cycle.body is not None:
            cycle.body.fail(BodyError(f"malformed request body: {detail}"))

    # -- cycles

    def start(self, cycle: Cycle) -> None:
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
        if self.state == HALTED and not self._queue:
            self._resume_after_upgrade()
            if self._cycle is not None or transport.is_closing():
                return
        if self._queue:
            self._next()
        elif self._eof or self.state == REJECTED:
            transport.close()
        else:
            self.flow.resume_reading(PIPELINE)
            busy = self.state == HEAD or self.state == BODY
            self._arm(_HEAD_TIMER if busy else _IDLE_TIMER)

    def _next(self) -> None:
        """Answer what waited in the queue: a refusal, or the next request."""
        item = self._queue.popleft()
        if isinstance(item, int):
            self._send_error(item)
            return
        # Started on the next loop turn: requests pipelined together and answered at
        # once must not nest one inside the other's completion.
        self._cycle = item
        self.loop.call_soon(self.start, item)
        if not self._queue and self.state != REJECTED:
            self.flow.resume_reading(PIPELINE)

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
        self.enter(LINGERING)
        self._linger_left = LINGER_LIMIT
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_all()
        self._arm(_LINGER_TIMER)

    def _resume_after_upgrade(self) -> None:
        """An upgrade request was answered without switching: parse on from where
        llhttp stopped (the request had no body, so the next request starts there)."""
        self.enter(IDLE)
        self._reader.restart()
        stash, self._stash = self._stash, []
        self.flow.resume_reading(UPGRADE)
        for data in stash:
            self.data_received(data)  # stashes again if another upgrade halts it

    def switch_protocols(self) -> TransportStream:
        """Hand the raw connection to an upgraded stream (after the 101 was written)."""
        assert self.transport is not None
        self._disarm()
        self.enter(UPGRADED)
        stash, self._stash = self._stash, []
        self._stream = TransportStream(self.transport, self.flow, b"".join(stash))
        self.flow.resume_reading(UPGRADE)
        return self._stream

    def send_continue(self) -> None:
        """Interim 100 for a client that waits before sending its body (RFC 9110 §10.1.1)."""
        cycle = self._cycle
        if cycle is not None and cycle.state == CYCLE_IDLE:
            self.write(CONTINUE)

    def drain(self) -> None:
        """Close now if idle — no request in progress or queued, no byte of a next one
        received — else after the current response (see :meth:`Entrance.drain`)."""
        self.draining = True
        cycle = self._cycle
        state = self.state
        if cycle is not None:
            cycle.keep_alive = False  # a head not yet rendered says Connection: close
        elif (not self._queue and not HEAD <= state <= REFRAME and state != UPGRADED
                and state != LINGERING and not self._proxy_buf):
            self.close()  # (a lingering one closes on its own, once the client read)

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
        elif kind == _BODY_TIMER:
            cycle = self._cycle
            if cycle is not None and cycle.body is not None:
                cycle.body.fail(BodyError("request body timed out"))
            self.close()
        elif self._cycle is not None or self.closing:
            return
        elif kind == _HEAD_TIMER and self.state == HEAD:
            if self.settings.rejected is not None:
                self.settings.rejected(self.settings.name, 408, "request head timeout",
                                       self.client_ip)
            self._send_error(408)  # part of a head arrived, not all of it
        else:
            self.close()  # idle, or mid-PROXY-header, or discarding a body
