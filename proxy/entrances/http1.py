"""The HTTP/1.1 entrance: a raw asyncio Protocol per client connection (llhttp parser).

Shape: :class:`HTTP1Protocol` builds the requests on a
:class:`~proxy.entrances.connection.ClientConnection` (the transport side: the
connection's state and its one transition function, admission, timers, closing); its
:class:`~proxy.entrances.reader.RequestReader` parses (the callbacks only collect) and
turns each head into a :class:`Cycle` — the request/response exchange, which is also
the Handler's :class:`~proxy.request.Responder` — driven by callbacks or run in a task
of its own; flow control lives in :class:`proxy.flow.control.FlowControl`.

Behaviour, in RFC 9112 terms:

- keep-alive; pipelined requests are answered in order, one at a time (reading pauses
  while a complete request waits);
- Content-Length and chunked request bodies stream to the Handler with backpressure;
  ``Expect: 100-continue`` is answered when the Handler first reads the body;
- response framing: the Handler's Content-Length, else chunked (HTTP/1.1), else
  close-delimited (HTTP/1.0); no body for HEAD, 1xx, 204, 304;
- llhttp runs in strict mode (it rejects CL+TE, repeated Content-Length, bare LF/CR,
  obs-fold, NUL/CTL in values, whitespace before the colon, bad chunk sizes) but for
  the version digits and Transfer-Encoding; the reader adds what it leaves open:
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
from typing import TYPE_CHECKING

from proxy.entrances.admission import shed_at_read
from proxy.entrances.connection import (BODY_TIMER, HEAD_TIMER, IDLE_TIMER,
                                        LINGER_TIMER, ClientConnection)
from proxy.entrances.cycle import CONTINUE, FINISHED, IDLE as CYCLE_IDLE, Cycle
from proxy.entrances.output import Output
from proxy.entrances.reader import RequestReader
from proxy.entrances.states import (BODY, CLOSED, HALTED, HEAD, IDLE, LINGERING, REFRAME,
                                    REJECTED, UPGRADED)
from proxy.flow.control import PIPELINE, UPGRADE
from proxy.request import BodyError

if TYPE_CHECKING:
    from proxy.entrances.listener import Entrance

log = logging.getLogger("tunnelgate.http1")


class HTTP1Protocol(ClientConnection):
    """One client connection of an entrance: its requests and their answers.

    ``_cycle`` is the request the Handler serves, ``_queue`` the pipelined ones (or
    refusal statuses) answered after it. ``_eof`` (the client half-closed) is apart
    from the state: what it sent before is still answered, bytes kept aside at an
    upgrade request included.
    """

    def __init__(self, entrance: Entrance) -> None:
        super().__init__(entrance)
        # Dropped once the connection is gone: the reader refers back to it, a
        # reference cycle only the cyclic GC could free (proxy.control.admin explains
        # why such garbage must not wait for it).
        self._reader: RequestReader | None = RequestReader(self)
        self._cycle: Cycle | None = None  # the one the Handler is serving
        self._queue: deque[Cycle | int] = deque()  # pipelined cycles / error statuses
        # The send queue every cycle writes through: one at a time (answers go out in
        # order), and each leaves it empty (its end flushes, its abort drops).
        self.output = Output(self)
        self._eof = False

    # -- transport callbacks

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.enter(CLOSED)
        self.entrance.discard(self)
        if self.refusal:
            self.entrance.refusing -= 1
        self.disarm()
        self.flow.connection_lost()
        if self._stream is not None:
            self._stream.feed_eof()
        gone = BodyError("client went away")
        reader, self._reader = self._reader, None
        assert reader is not None  # (the transport is lost once)
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
        self.output.release()
        self.unbind()

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
        reader = self._reader
        parsing = reader.parsing if reader is not None else None
        if parsing is not None and parsing.body is not None:
            parsing.aborted = True  # gone: no answer owed, nothing to log (counted)
            parsing.body.fail(BodyError("client closed before the body ended"))
        return bool(self._queue)

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state > REFRAME:  # not HTTP to parse now
            data = self.received_aside(state, data)
            if not data:
                return
        shedder = self.settings.shedder
        if shedder is not None and shed_at_read(self, shedder, data):
            return  # overloaded: answered 503 before parsing (load shedding)
        if self.timer_kind == IDLE_TIMER:
            self.arm(HEAD_TIMER)  # first byte of the next request
        reader = self._reader
        if reader is not None:  # (always, while HTTP is parsed)
            reader.feed(data)

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
        assert reader is not None  # (refusals come from it)
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
            if self.state == LINGERING:
                return  # (answered here already: it closes once the client is done)
            if body is not None and not body.complete and not cycle.aborted:
                self.linger()
            else:
                transport.close()
            return
        # Parsing stopped at an upgrade request. Resume it only once that request was
        # answered without switching; while it still waits in the queue, the bytes
        # after its head belong to the stream it may switch to, not to HTTP.
        if self.state == HALTED and not self._queue:
            self._resume_after_upgrade()
            if self._cycle is not None or self.output_closed():
                return
        if self._queue:
            self._next()
        elif self._eof or self.state == REJECTED:
            transport.close()
        else:
            self.flow.resume_reading(PIPELINE)
            busy = self.state == HEAD or self.state == BODY
            self.arm(HEAD_TIMER if busy else IDLE_TIMER)

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
        if not self._queue and self.state != REJECTED:
            self.flow.resume_reading(PIPELINE)

    def _resume_after_upgrade(self) -> None:
        """An upgrade request was answered without switching: parse on from where
        llhttp stopped (the request had no body, so the next request starts there)."""
        self.enter(IDLE)
        assert self._reader is not None  # (the connection is open)
        self._reader.restart()
        stash, self._stash = self._stash, []
        self.flow.resume_reading(UPGRADE)
        for data in stash:
            self.data_received(data)  # stashes again if another upgrade halts it

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
                and state != LINGERING and not self.opening()):
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
        elif kind == HEAD_TIMER and self.state == HEAD:
            if self.settings.rejected is not None:
                self.settings.rejected(self.settings.name, 408, "request head timeout",
                                       self.client_ip)
            self.send_error(408)  # part of a head arrived, not all of it
        else:
            self.close()  # idle, or mid-PROXY-header, or discarding a body
