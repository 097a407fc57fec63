"""The HTTP/1.1 entrance: a raw asyncio Protocol per client connection (llhttp parser).

Shape: :class:`HTTP1Protocol` is the glue between a transport and the connection's
sans-IO core (:class:`proxy.wire.server.ServerConnection`: bytes in, events out, the
state and its one transition table), built on a
:class:`~proxy.entrances.connection.ClientConnection` (the transport side: admission,
timers, closing). It turns each request head the core reports into a :class:`Cycle` —
the request/response exchange, which is also the Handler's
:class:`~proxy.request.Responder` — driven by callbacks or run in a task of its own;
flow control lives in :class:`proxy.flow.control.FlowControl`.

Behaviour, in RFC 9112 terms:

- keep-alive; pipelined requests are answered in order, one at a time (reading pauses
  while a complete request waits);
- Content-Length and chunked request bodies stream to the Handler with backpressure;
  ``Expect: 100-continue`` is answered when the Handler first reads the body;
- response framing: the Handler's Content-Length, else chunked (HTTP/1.1), else
  close-delimited (HTTP/1.0); no body for HEAD, 1xx, 204, 304;
- llhttp runs in strict mode (it rejects CL+TE, repeated Content-Length, bare LF/CR,
  obs-fold, NUL/CTL in values, whitespace before the colon, bad chunk sizes) but for
  the version digits and Transfer-Encoding; the core adds what it leaves open:
  Host presence/uniqueness/syntax, a Transfer-Encoding list other than ``chunked``
  alone (empty elements and whitespace around them are none of it, RFC 9110 §5.6.1;
  a spelling llhttp does not frame as chunked is re-framed), TE on HTTP/1.0, major
  versions other than 1 (505; a later 1.x is served as 1.1, RFC 9112 §2.3), a request
  line without a version (HTTP/0.9: 400 at once) or after a bare CR (RFC 9112 §2.2),
  CONNECT, request-target form, head-size and header-count limits, chunk-extension
  size, and timeouts. Every rejection is a small ``Connection: close`` answer, and the
  connection ends by a lingering close, so nothing after a malformed message can be
  smuggled through and no reset destroys the answer.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Final

from proxy.entrances.admission import shed_at_read
from proxy.entrances.body import RequestBody
from proxy.entrances.connection import (BODY_TIMER, HEAD_TIMER, IDLE_TIMER,
                                        LINGER_TIMER, ClientConnection)
from proxy.entrances.cycle import CONTINUE, FINISHED, IDLE as CYCLE_IDLE, Cycle
from proxy.entrances.output import Output
from proxy.flow.control import PIPELINE, UPGRADE
from proxy.flow.turn import Deferred
from proxy.request import EMPTY_BODY, BodyError, Request
from proxy.wire.request import Rejection, RequestHead
from proxy.wire.server import (BODY, END, HALT, HALTED, HEAD, IDLE, REJECTED, Event,
                                ServerEvent, State, Trailers)

if TYPE_CHECKING:
    from proxy.entrances.listener import Entrance

log = logging.getLogger("tunnelgate.http1")

# States in which received bytes go to the core (it keeps those after an upgrade
# request); the others are the transport side's (connection.received_aside).
_TO_CORE: Final = frozenset((State.IDLE, State.HEAD, State.BODY, State.HALTED))
# States in which nothing of a request is under way (closed at once when draining).
_QUIET: Final = frozenset((State.NEW, State.PROXY, State.IDLE, State.HALTED,
                           State.REJECTED, State.CLOSED))


class HTTP1Protocol(ClientConnection):
    """One client connection of an entrance: its requests and their answers.

    ``_cycle`` is the request the Handler serves, ``_queue`` the pipelined ones (or
    refusal statuses) answered after it, ``_parsing`` the one whose body is being read.
    ``_eof`` (the client half-closed) is apart from the state: what it sent before is
    still answered, bytes kept aside at an upgrade request included.
    """

    def __init__(self, entrance: Entrance) -> None:
        super().__init__(entrance)
        self._parsing: Cycle | None = None
        self._starter = TurnStart(self)
        self._cycle: Cycle | None = None  # the one the Handler is serving
        self._queue: deque[Cycle | int] = deque()  # pipelined cycles / error statuses
        self.output = Output(self)  # every cycle's send queue, one at a time, in order
        self._eof = False

    # -- transport callbacks

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.core.handle(Event.LOST)
        self.entrance.discard(self)
        if self.refusal:
            self.entrance.refusing -= 1
        self.disarm()
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
        self._queue.clear()
        self._parsing = None
        self._starter.release()
        self.core.release()
        self.output.release()
        self.unbind()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        if self._cycle is not None:
            self._cycle.writable()

    def eof_received(self) -> bool:
        # The client stopped sending. Requests it pipelined before are still answered
        # (half-close, RFC 9112 §9.6); else it is gone, as for Go's server and nginx: a
        # request in flight is abandoned (connection_lost, after the close, cancels it).
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
        state = self.core.state
        if state is not IDLE and state not in _TO_CORE:
            data = self.received_aside(state, data)
            if not data:
                return
        if self.settings.shedder is not None and shed_at_read(self, self.settings.shedder, data):
            return  # overloaded: answered 503 before parsing (load shedding)
        events = self.core.receive(data)
        if events:
            self._dispatch(events)
        if self.timer_kind == IDLE_TIMER and self.core.state is HEAD:
            self.arm(HEAD_TIMER)  # a next head is not all there (see ClientConnection.arm)

    # -- what the core found

    def _dispatch(self, events: list[ServerEvent]) -> None:
        """Apply the core's events in order; then start a request whose head was
        read (see :meth:`TurnStart.start`)."""
        for event in events:
            body = self._parsing.body if self._parsing is not None else None
            if isinstance(event, bytes):
                if body is not None:
                    body.feed(event)
            elif isinstance(event, RequestHead):
                cycle = cycle_for(self, event)
                if cycle.body is not None:
                    self._parsing = cycle
                if self.accept(cycle):
                    self._starter.ready = cycle
            elif event is END:
                self._parsing = None
                if body is not None:
                    body.end()
            elif isinstance(event, Trailers) and body is not None:
                body.trailers.extend(event.fields)
            elif event is HALT:
                self.flow.pause_reading(UPGRADE)  # until it is answered
            elif isinstance(event, Rejection):
                self.reject(event.status, str(event))
        self._starter.start()

    def accept(self, cycle: Cycle) -> bool:
        """A request head was parsed: True if ``cycle`` is to be served now, else it
        waits its turn (and reading pauses meanwhile)."""
        if self._cycle is None:
            self._cycle = cycle
            return True
        self._queue.append(cycle)
        self.flow.pause_reading(PIPELINE)
        return False

    def reject(self, status: int, detail: str) -> None:
        """Answer a malformed message in its turn, then close (the core parses nothing
        more)."""
        log.debug("%s entrance: rejecting request (%d): %s", self.settings.name,
                  status, detail)
        if self.settings.rejected is not None:
            self.settings.rejected(self.settings.name, status, detail, self.client_ip)
        self.flow.pause_reading(PIPELINE)
        parsing, self._parsing = self._parsing, None
        if parsing is not None and parsing is self._starter.ready:
            self._starter.ready = None  # never seen by the Handler: answered here
            self._cycle = None
            parsing = None
        if parsing is not None and parsing.running is not None:
            self._fail_served(parsing, status, detail)
            return
        if parsing is not None:
            self._queue.remove(parsing)  # never seen by the Handler: answer it here
        if self._cycle is None and not self._queue:
            self.send_error(status)
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
            self.send_error(status)
        if cycle.body is not None:
            cycle.body.fail(BodyError(f"malformed request body: {detail}"))

    # -- cycles

    def start(self, cycle: Cycle) -> None:
        """Give ``cycle`` to the Handler: driven by callbacks when it can be (no
        task), else as a coroutine in a task of its own."""
        if cycle is not self._cycle or self.closing:
            return  # the connection ended before its turn came
        self.disarm()
        serve = self.entrance.serve
        if serve is not None:
            cycle.serve(serve)
        else:
            cycle.running = self.loop.create_task(cycle.run(self.entrance.handle))

    def serving(self, cycle: Cycle | None) -> bool:
        """Whether ``cycle`` is the request being answered now (None: whether none is)."""
        return self._cycle is cycle

    def cycle_done(self, cycle: Cycle) -> None:
        """The Handler returned: close, or move on to the next request."""
        self._cycle = None
        transport = self.transport
        assert transport is not None
        if self._stream is not None:
            self._stream.close()
            return
        if self.output_closed():
            return
        body = cycle.body
        if not cycle.keep_alive or self.closing or (
                body is not None and not body.discard()):
            if self.core.state is State.LINGERING:
                return  # (answered here already: it closes once the client is done)
            if body is not None and not body.complete and not cycle.aborted:
                self.linger()
            else:
                transport.close()
            return
        # Parsing stopped at an upgrade request. Resume it only once that request was
        # answered without switching; while it still waits in the queue, the bytes
        # after its head belong to the stream it may switch to, not to HTTP.
        if self.core.state is HALTED and not self._queue:
            self.flow.resume_reading(UPGRADE)
            self._dispatch(self.core.resume())
            if self._cycle is not None or self.output_closed():
                return
        if self._queue:
            self._next()
        elif self._eof or self.core.state is REJECTED:
            transport.close()
        else:
            self.flow.resume_reading(PIPELINE)
            state = self.core.state
            self.arm(HEAD_TIMER if state is HEAD or state is BODY else IDLE_TIMER)

    def _next(self) -> None:
        """Answer what waited in the queue: a refusal, or the next request."""
        item = self._queue.popleft()
        if isinstance(item, int):
            self.send_error(item)
            return
        # Started on the next loop turn: requests pipelined together and answered at
        # once must not nest one inside the other's completion.
        self._cycle = item
        self.loop.call_soon(self.start, item)
        if not self._queue and self.core.state is not REJECTED:
            self.flow.resume_reading(PIPELINE)

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
        if cycle is not None:
            cycle.keep_alive = False  # a head not yet rendered says Connection: close
        elif not self._queue and self.core.state in _QUIET and not self.opening():
            self.close()  # (a lingering one closes on its own, once the client read)

    # -- timers

    def timed_out(self) -> None:
        """The entrance's sweep found this connection's deadline passed."""
        kind = self.timer_kind
        self.disarm()
        if kind == LINGER_TIMER:
            self.close()
        elif kind == BODY_TIMER:
            cycle = self._cycle
            if cycle is not None and cycle.body is not None:
                cycle.body.fail(BodyError("request body timed out"))
            self.close()
        elif self._cycle is not None or self.closing:
            return
        elif kind == HEAD_TIMER and self.core.state is HEAD:
            if self.settings.rejected is not None:
                self.settings.rejected(self.settings.name, 408, "request head timeout",
                                       self.client_ip)
            self.send_error(408)  # part of a head arrived, not all of it
        else:
            self.close()  # idle, or mid-PROXY-header, or discarding a body


def cycle_for(conn: HTTP1Protocol, head: RequestHead) -> Cycle:
    """The request cycle of a head the core read on ``conn``."""
    body: RequestBody | None = None
    if head.chunked or head.length:
        body = RequestBody(conn, None if head.chunked else head.length,
                           head.expect_continue)
    settings = conn.settings
    request = Request(
        head.method, head.path, head.query, head.host, head.headers,
        body if body is not None else EMPTY_BODY, settings.name, conn.client_ip,
        settings.scheme, head.version, head.upgrade if head.switch else None,
        head.empty_query)
    return Cycle(conn, request, body, head.keep_alive and not conn.draining)


class TurnStart(Deferred):
    """Hands a connection's request whose head was read (``ready``) to the Handler
    once the core returned: one without a body at the end of the loop turn, with the
    other requests read in it (:mod:`proxy.flow.turn` says why; the entrance's
    ``batch_requests`` turns that off), one with a body at once (held to the end of
    the turn, its bytes would stay allocated across the turn's other reads, where
    written at once the next read reuses the memory just freed, warm in the cache).
    Until then it is still ``ready``: a refusal meanwhile answers it."""

    __slots__ = ("conn", "ready", "_due")

    def __init__(self, conn: HTTP1Protocol) -> None:
        # None once the connection is gone: it refers back to this one, a reference
        # cycle only the cyclic GC could free (proxy.control.admin explains why such
        # garbage must not wait for it).
        self.conn: HTTP1Protocol | None = conn
        self.ready: Cycle | None = None
        self._due = False

    def start(self) -> None:
        ready, conn = self.ready, self.conn
        if ready is None or conn is None:
            return
        if ready.body is not None or not conn.settings.batch_requests:
            self.ready = None
            conn.start(ready)
        elif not self._due:
            self._due = True
            conn.entrance.turn_end.add(self, conn.loop)

    def run_deferred(self) -> None:
        self._due = False
        ready, self.ready = self.ready, None
        if ready is not None and self.conn is not None:
            self.conn.start(ready)

    def release(self) -> None:
        self.conn = self.ready = None
