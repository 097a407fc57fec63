"""The one exchange with a backend, as a machine driven by the listener contract.

Once the Handler has decided where a request goes, :class:`Forward` sends it through the
backend's pool — HTTP/1.1 or HTTP/2 alike — and is the request's
:class:`~proxy.upstream.request.ResponseListener`: here the request headers are made,
the answer is counted (metrics, outlier detection), a retry is asked for
(:mod:`proxy.exchange.retry`), the response head is passed through the response filters
and relayed, body pieces are pushed to the client as they come, and the end finishes
the response with its trailers. Over HTTP/1.1 no task, no coroutine, no future: a slow
client pauses the backend connection's reading and its drain resumes it. A ``101`` to
an upgrade request hands the raw streams to :func:`proxy.exchange.awaited.switch`.

States, in order: ``SENT`` (the request is with the pool) → ``HEAD`` (the final head
arrived; it is held until the end of that socket read, so a backend that breaks off
in the same read still gets a clean 502 instead of a truncated answer) → ``RELAYING``
→ ``DONE``; the end of an answer is finished at the end of the loop turn, with the
others that ended in it (batched writes). Every exit (answered, failed, cancelled) goes
through :meth:`Forward._end`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from proxy.exchange.awaited import switch
from proxy.exchange.forwarding import (
    downstream_response_headers, upstream_request_headers, upstream_target)
from proxy.flow.clock import MONOTONIC
from proxy.request import Headers, Piece
from proxy.upstream.base import UpstreamError
from proxy.upstream.request import ResponseListener, ResponseSource, UpstreamRequest
from proxy.wire.framing import forwardable_trailers
from routing.compiled import CompiledBackend

if TYPE_CHECKING:
    from proxy.exchange.handler import Handler
    from proxy.exchange.steps import Exchange
    from proxy.upstream.pool import Pool

log = logging.getLogger("tunnelgate.handler")

SENT: Final = 0
HEAD: Final = 1
RELAYING: Final = 2
DONE: Final = 3


class Forward(ResponseListener):
    """One request relayed to a backend and its answer relayed back."""

    __slots__ = ("handler", "ex", "chosen", "request", "state", "sent", "conn",
                 "paused", "_status", "_headers", "_early", "_later", "_trailers")

    def __init__(self, handler: "Handler", ex: "Exchange", chosen: CompiledBackend) -> None:
        self.handler = handler
        self.ex = ex
        self.chosen = chosen
        self.request: UpstreamRequest | None = None
        self.state = SENT
        self.sent = 0.0
        self.conn: ResponseSource | None = None
        self.paused = False
        self._status = 0
        self._headers: Headers | None = None  # the answer's, filtered, until relayed
        # Body bytes that came with the head, held until it is relayed: the first piece
        # (nearly always the only one), then any more.
        self._early: Piece | None = None
        self._later: list[Piece] | None = None
        self._trailers: Headers | None = None  # the answer's, kept from on_end to run_deferred

    def start(self, pool: "Pool", deadline: float | None) -> None:
        """Send the request (``deadline``: the route's timeout for the answer's head)."""
        ex = self.ex
        request = ex.request
        handler = self.handler
        client_host = request.host.encode("latin-1")
        headers = upstream_request_headers(
            ex.headers, ex.upstream_host(client_host), client_host,
            request.client_ip, request.scheme, request.upgrade)
        dial_timeout = None
        if request.upgrade is not None:
            # The handshake is bounded by PROXY_WS_HANDSHAKE_TIMEOUT as well as by the
            # route's own deadline; the session after the 101 by the idle timeout only.
            limit = handler.upgrade_timeout
            if limit is not None:
                deadline = limit if deadline is None else min(deadline, limit)
            dial_timeout = handler.upgrade_dial_timeout
        chosen = self.chosen
        target = upstream_target(chosen.base_path, chosen.base_query, ex.path, ex.query,
                                 request.empty_query)
        if ex.span is not None:
            headers = handler.reporting.client_span(
                ex, pool.key.host, pool.key.port, target, headers)
        self.request = UpstreamRequest(request.method, target, headers, ex.body, self,
                                       deadline, dial_timeout)
        self.sent = MONOTONIC()
        pool.start(self.request)

    def cancel(self) -> None:
        """The client is gone: drop the backend exchange, nothing more is owed."""
        if self.state == DONE:
            return
        if self.request is not None:
            self.request.cancel()
        self.ex.status = 0
        self._end()

    # -- ResponseListener

    def on_interim(self, status: int, headers: Headers) -> None:
        # A backend's 1xx (RFC 9110 §15.2: a proxy forwards them), minus its
        # hop-by-hop fields, to an entrance that can send them.
        ex = self.ex
        responder = ex.responder
        if responder.relays_interim:
            responder.interim(status, downstream_response_headers(headers))
            if ex.retry is not None:
                ex.retry.interim = True  # the answer has started: no retry now

    def on_head(self, conn: ResponseSource, status: int, reason: str,
                headers: Headers, length: int | None) -> None:
        ex = self.ex
        self.conn = conn
        ex.upstream_status = status
        ex.upstream_s = MONOTONIC() - self.sent
        handler = self.handler
        url = self.chosen.backend.url
        handler.metrics.backend_answered(url, status, ex.upstream_s)
        outliers = handler.outliers
        if status >= 500 or outliers.failing:
            outliers.answered(url, status)
        if status == 101 and ex.request.upgrade is not None:
            self._switch(conn, headers)
            return
        if (ex.retry is not None and status != 101
                and handler.retries.after_status(ex, self.chosen, status)):
            self._drop()  # the exchange goes on without this answer
            return
        self._headers = ex.response_headers(downstream_response_headers(headers))
        self._status = status
        self.state = HEAD

    def on_body(self, data: Piece) -> None:
        ex = self.ex
        ex.bytes_written += len(data)
        if self.state == HEAD:
            if self._early is None:
                self._early = data
            elif self._later is None:
                self._later = [data]
            else:
                self._later.append(data)
            return
        responder = ex.responder
        responder.push(data)
        if responder.congested and not self.paused:
            self._pause()

    def on_end(self, trailers: Headers) -> None:
        # Finished at the end of this loop turn, with the other answers that completed
        # in it (:mod:`proxy.flow.turn` says why).
        conn, self.conn = self.conn, None
        self._trailers = trailers
        loop = conn.loop if conn is not None else asyncio.get_running_loop()
        self.handler.turn_end.add(self, loop)

    def run_deferred(self) -> None:
        """Finish the answer that ended this turn."""
        if self.state == HEAD:
            self._relay_head()
        if self.state == DONE:
            return
        trailers = self._trailers
        self.ex.responder.finish(forwardable_trailers(trailers) if trailers else None)
        self._end()

    def on_error(self, error: Exception) -> None:
        assert isinstance(error, UpstreamError)
        self.conn = None
        if self.state == DONE:
            return
        ex = self.ex
        metrics = self.handler.metrics
        if self.state == RELAYING:
            # The status line went out: it is what the client was told.
            metrics.backend_error(ex.host_pattern, error.reason)
            ex.responder.abort()
        else:
            ex.upstream_error = error.reason
            ex.bytes_written = 0
            url = self.chosen.backend.url
            metrics.backend_failed(url)
            if error.reason != "canceled":
                self.handler.outliers.failed(url)
            if ex.retry is not None and self.handler.retries.after_error(ex, self.chosen, error):
                self._drop()
                return
            self.handler.failures.upstream(ex, error)
        self._end()

    def on_read_end(self) -> None:
        if self.state == HEAD:
            self._relay_head()
        if self.state == RELAYING:
            self.ex.responder.flush()

    # -- the steps

    def _relay_head(self) -> None:
        ex = self.ex
        responder = ex.responder
        if responder.aborted:
            self.cancel()
            return
        headers = self._headers
        assert headers is not None  # (on_head set them: the state is HEAD)
        try:
            responder.start(self._status, headers)
        except ValueError:  # a response filter made a field no head may carry
            log.exception("response head for %s %s not sendable", ex.request.method,
                          ex.request.path)
            if self.request is not None:
                self.request.cancel()
            ex.answer_text(502, b"bad gateway\n")
            self._end()
            return
        self.state = RELAYING
        ex.status = self._status
        early, self._early = self._early, None
        if early is not None:
            responder.push(early)
            later, self._later = self._later, None
            if later is not None:
                for data in later:
                    responder.push(data)
            if responder.congested and not self.paused:
                self._pause()

    def _switch(self, conn: ResponseSource, headers: Headers) -> None:
        """The backend accepted a protocol switch: the session runs in a task, which
        closes the exchange when it is over."""
        ex = self.ex
        headers = ex.response_headers(downstream_response_headers(headers, keep_upgrade=True))
        stream = conn.detach()
        self.state = DONE
        self.conn = None
        self.request = None
        ex.forward = None
        ex.task = conn.loop.create_task(switch(self.handler, ex, stream, headers))

    def _pause(self) -> None:
        """The client is slow: stop reading the backend until it drained."""
        conn = self.conn
        if conn is None:
            return  # the whole answer is in already
        self.paused = True
        conn.pause()
        self.ex.responder.when_writable(self._writable)

    def _writable(self) -> None:
        self.paused = False
        if self.ex.responder.aborted:
            self.cancel()
        elif self.conn is not None:
            self.conn.resume()

    def _drop(self) -> None:
        """This try is over and the exchange goes on without it (a retry follows, or
        it was answered): close the backend side, leave the exchange open."""
        request = self.request
        self.state = DONE
        self.conn = None
        self.request = None
        if self.ex.forward is self:
            self.ex.forward = None
        if request is not None:
            request.cancel()

    def _end(self) -> None:
        self.state = DONE
        self.conn = None
        self.request = None  # (it refers back here: no cycle for the GC to find)
        ex = self.ex
        ex.forward = None
        self.handler.close(ex)
