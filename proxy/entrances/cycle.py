"""One request/response exchange on a client connection: the Handler's Responder."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable, Final

from proxy.entrances.body import DISCARD_LIMIT, RequestBody
from proxy.entrances.output import COALESCE_LIMIT
from proxy.flow.control import DrainWait
from proxy.request import (
    ByteStream, Handle, Headers, Piece, Request, Responder, Running, Serve)
from proxy.wire.framing import ResponseFraming, accepts_trailers, response_framing
from proxy.wire.head import error_response, render_head, status_line

if TYPE_CHECKING:
    from proxy.entrances.http1 import HTTP1Protocol

log = logging.getLogger("tunnelgate.http1")

CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"

IDLE: Final = 0
STARTED: Final = 1
FINISHED: Final = 2
UPGRADED: Final = 3


class Cycle(Responder):
    """One request/response exchange on a connection; the Handler's Responder.

    Output produced within one loop turn is gathered and written with a single
    ``writelines`` (head + small body in one syscall); large pieces are never joined.
    """

    __slots__ = ("conn", "request", "body", "keep_alive", "aborted", "relays_interim",
                 "running", "driven", "state", "_no_body", "_version10",
                 "_drain")

    def __init__(self, conn: "HTTP1Protocol", request: Request, body: RequestBody | None,
                 keep_alive: bool) -> None:
        self.conn = conn
        self.request = request
        self.body = body
        self.keep_alive = keep_alive
        self.aborted = False
        self.running: Running | None = None  # the Handler's work on it (a task, or not)
        # The Handler drives this cycle by callbacks and flushes what it writes itself
        # (set once its start() returned; a coroutine Handler in a task leaves it off).
        self.driven = False
        self.state = IDLE
        self._no_body = False
        self._version10 = request.http_version == "1.0"
        self.relays_interim = not self._version10  # (RFC 9110 §15.2, see interim)
        self._drain: DrainWait | None = None  # made by the first when_writable

    # -- running the Handler

    def serve(self, handler: Serve) -> None:
        """Hand the request to a Handler that needs no task; it tells
        :meth:`exchange_over` when done."""
        request = self.request
        try:
            self._prepare()
            running = handler.start(request, self, self)
            if self.conn.serving(self):  # (not answered yet: a finished one keeps none)
                self.running = running
                self.driven = True
        except Exception:
            log.exception("handler failed on %s %s", request.method, request.path)
            self._failed()
            self.conn.cycle_done(self)

    def exchange_over(self, error: BaseException | None) -> None:
        """(:class:`proxy.request.Done`) the Handler is done with this cycle."""
        self.running = None
        if error is None:
            self._settle()
        else:
            request = self.request
            log.error("handler failed on %s %s", request.method, request.path,
                      exc_info=error)
            self._failed()
        self.conn.cycle_done(self)

    async def run(self, handle: Handle) -> None:
        """Run a coroutine Handler (one that awaits ``write``, say) to its end."""
        request = self.request
        try:
            self._prepare()
            await handle(request, self)
        except asyncio.CancelledError:
            if not self.aborted:
                raise
        except Exception:
            log.exception("handler failed on %s %s", request.method, request.path)
            self._failed()
        else:
            self._settle()
        finally:
            self.conn.cycle_done(self)

    def _prepare(self) -> None:
        """The entrance's own step before the Handler (its trust rules), if any."""
        prepare = self.conn.settings.prepare
        if prepare is not None:
            prepare(self.request)

    def _failed(self) -> None:
        """The Handler raised: a 500 if nothing was sent yet, else a cut connection."""
        if self.state == IDLE and not self.aborted:
            self._answer_500()
        elif self.state == STARTED:
            self.abort()

    def _settle(self) -> None:
        """The Handler is done: end a response it left open; a missing one is a 500."""
        if self.state == IDLE and not self.aborted:
            log.error("handler returned without answering %s %s",
                      self.request.method, self.request.path)
            self._answer_500()
        elif self.state == STARTED:
            self.finish()

    def _answer_500(self) -> None:
        self.keep_alive = False
        self.conn.write(error_response(500, self.conn.entrance.dates.line()))
        self.state = FINISHED

    # -- Responder

    def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        """Send a complete response; Content-Length is ``len(body)`` — for HEAD and
        304 the Handler's own Content-Length wins (it describes the GET body)."""
        if self.aborted:
            return  # the client is gone (or was already answered): dropped silently
        self._begin(status)
        framing = self._frame(status, headers, len(body))
        head = render_head(status_line(status), framing.headers, framing.lines)
        self.state = FINISHED
        if framing.no_body or not body:
            self.conn.write(head)
        elif len(body) <= COALESCE_LIMIT:
            self.conn.write(head + body)
        else:
            self.conn.writelines([head, body])

    def start(self, status: int, headers: Headers) -> None:
        """Begin a streamed response; the head goes out with the first body bytes or at
        the end of this loop turn, whichever comes first."""
        if self.aborted:
            return
        self._begin(status)
        framing = self._frame(status, headers, None)
        self._no_body = framing.no_body
        head = render_head(status_line(status), framing.headers, framing.lines)
        self.state = STARTED
        self.conn.output.begin(head, framing.chunked, framing.remaining)
        if not self.driven:
            # A coroutine Handler may await anything next (and a callback one still in
            # its start() may answer there): the head goes out at the end of this loop
            # turn. One driven by callbacks flushes (or finishes) itself.
            self.conn.output.flush_soon()

    def push(self, data: Piece) -> None:
        """Queue body bytes (sent by :meth:`flush`, at once past ``FLUSH_LIMIT``)."""
        if self.aborted:
            return
        if self.state != STARTED:
            raise RuntimeError("push() outside a started response")
        if self._no_body or not data:
            return
        self.conn.output.push(data)

    def flush(self) -> None:
        """Send what is queued now."""
        if not self.aborted:
            self.conn.output.flush()

    @property
    def congested(self) -> bool:
        return self.conn.flow.write_paused

    def when_writable(self, callback: Callable[[], None]) -> None:
        """``callback`` runs when the client drained, or when it failed to within
        ``send_timeout`` (then the connection is cut first: a client that stops
        reading must not pin a response, and its backend, forever)."""
        self.flush()
        if self._drain is None:
            self._drain = DrainWait(self.abort)
        self._drain.wait(callback, self.conn.loop, self.conn.settings.send_timeout)

    def writable(self) -> None:
        """The connection drained (or is gone): wake whoever waits to push."""
        if self._drain is not None:
            self._drain.drained()

    async def write(self, data: bytes) -> None:
        """Queue body bytes (flushed at the end of this loop turn, or at once past
        ``FLUSH_LIMIT``); waits while the client is slow, aborting after
        ``send_timeout``."""
        if self.aborted:
            return
        if self.state != STARTED:
            raise RuntimeError("write() outside a started response")
        self.push(data)
        self.conn.output.flush_soon()
        flow = self.conn.flow
        if flow.write_paused:
            self.flush()
            try:
                await flow.drain(self.conn.settings.send_timeout)
            except (ConnectionError, TimeoutError):
                self.abort()

    def finish(self, trailers: Headers | None = None) -> None:
        if self.aborted:
            return
        if self.state != STARTED:
            raise RuntimeError("finish() outside a started response")
        self.state = FINISHED
        output = self.conn.output
        if output.remaining:
            log.warning("response to %s %s ended %d bytes short of its Content-Length",
                        self.request.method, self.request.path, output.remaining)
            self.abort()
            return
        # Trailers only for a client that said it takes them (RFC 9110 §6.5: a
        # recipient may drop them otherwise, and this one is that recipient).
        if trailers and not accepts_trailers(self.request.header(b"te")):
            trailers = None
        output.end(trailers)

    def hold_reading(self, seconds: float) -> None:  # after a shed 503 (its Retry-After)
        self.conn.hold_reading(seconds)

    def abort(self) -> None:
        """Drop the connection; later Responder calls are silently ignored."""
        if self.state != UPGRADED:
            self.state = FINISHED
        self.aborted = True
        self.keep_alive = False
        self.conn.output.drop()
        self.conn.abort()

    def interim(self, status: int, headers: Headers) -> None:
        """Relay an interim answer (102, 103, ...) before the final one: sent at once
        to an HTTP/1.1 client, never to an HTTP/1.0 one (RFC 9110 §15.2), nor once the
        final answer began. 100 is the entrance's own (see send_continue), 101 is
        :meth:`upgrade`."""
        if (self._version10 or self.state != IDLE or self.aborted
                or not 102 <= status <= 199):
            return
        framing = response_framing(self.request.method, status, self._version10,
                                   headers, None, self.keep_alive, None)
        self.conn.write(render_head(status_line(status), framing.headers, framing.lines))

    async def upgrade(self, headers: Headers) -> ByteStream:
        if self.state != IDLE:
            raise RuntimeError("response already started")
        token = self.request.upgrade
        if token is None:
            raise RuntimeError("the request did not ask for a protocol switch")
        if self.aborted:
            raise ConnectionError("client went away")
        self.state = UPGRADED
        framing = response_framing(self.request.method, 101, self._version10, headers,
                                   None, False, None, token.encode("latin-1"))
        self.keep_alive = framing.keep_alive
        self.conn.write(render_head(status_line(101), framing.headers, framing.lines))
        return self.conn.switch_protocols()

    # -- helpers

    def _begin(self, status: int) -> None:
        if self.state != IDLE:
            raise RuntimeError("response already started")
        if status < 200:
            raise ValueError("1xx answers are sent by the entrance (101: use upgrade())")

    def _frame(self, status: int, headers: Headers, length: int | None) -> ResponseFraming:
        """The final response's framing (:func:`response_framing`); settles
        ``keep_alive``."""
        self.keep_alive = persists(self.keep_alive, self.body, self.conn.closing)
        framing = response_framing(self.request.method, status, self._version10, headers,
                                   length, self.keep_alive, self.conn.entrance.dates)
        self.keep_alive = framing.keep_alive
        return framing


def persists(keep_alive: bool, body: RequestBody | None, closing: bool) -> bool:
    """Whether the connection is kept after this response: not when the rest of the
    request body cannot be swallowed cheaply (RFC 9112 §9.3: a server may close
    instead of reading), nor when the connection is closing anyway."""
    if not keep_alive or closing:
        return False
    return body is None or body.complete or not (
        body.length is None or body.length > DISCARD_LIMIT or body.expect_continue)
