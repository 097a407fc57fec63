"""Keep-alive HTTP/1.1 connections to one backend, with an optional connection cap."""

from __future__ import annotations

import asyncio
import logging
import ssl

from proxy.request import Body, Headers
from proxy.upstream.base import (
    DIAL_TIMEOUT, IDLE_TIMEOUT, MAX_IDLE, RESPONSE_HEADER_TIMEOUT, BackendResponse,
    Interim, PoolKey, UpstreamError, retry_unanswered, within_route)
from proxy.upstream.cap import ConnectionCap
from proxy.upstream.dial import TLSSetup, dial_tcp, open_over, unreachable
from proxy.upstream.http1 import UpstreamConnection
from proxy.upstream.readbuffer import ReadBuffer
from proxy.upstream.request import UpstreamRequest
from proxy.upstream.response import UpstreamResponse
from proxy.wire.framing import HeadLimits

log = logging.getLogger("tunnelgate.upstream")



# ----------------------------------------------------------------------------- pools


class Pool:
    """Keep-alive HTTP/1.1 connections to one backend (plain or TLS).

    ``head_limits`` caps response heads and ``reads`` is where its connections read
    to (both set by :class:`Pools` for every pool; a pool made alone has its own).

    ``max_connections`` (0 = no limit) caps the connections open to the backend, idle
    or busy (:mod:`proxy.upstream.cap`). A request that finds none free waits for one
    within its head timeout if it has one (then 504, as for a backend that does not
    answer in time), else within the dial timeout (then 503: the backend is there, but
    at its limit). ``head_timeout`` is the wait for the head of an answer whose route
    sets no timeout (None: no wait; see :meth:`_watch_heads`).
    """

    head_limits = HeadLimits()
    head_timeout: float | None = RESPONSE_HEADER_TIMEOUT

    def __init__(self, key: PoolKey, *, dial_timeout: float = DIAL_TIMEOUT,
                 max_idle: int = MAX_IDLE, idle_timeout: float = IDLE_TIMEOUT,
                 max_connections: int = 0) -> None:
        self.key = key
        self.reads = ReadBuffer()
        self.dial_timeout = dial_timeout
        self.max_idle = max_idle
        self.idle_timeout = idle_timeout
        self._idle: list[UpstreamConnection] = []  # oldest first; reuse takes the newest
        self._conns: set[UpstreamConnection] = set()  # connected, not yet lost
        self._cap = ConnectionCap(max_connections)  # (the one copy of the limit)
        self._sweeper: asyncio.TimerHandle | None = None
        self._watcher: asyncio.TimerHandle | None = None  # see _watch_heads
        self._closed = False
        self._tls: TLSSetup | None = None
        self._tls_error: str | None = None
        if key.scheme == "https" or key.tls is not None:
            try:
                self._tls = TLSSetup(key)
            except (ssl.SSLError, ValueError, OSError) as exc:
                # An unusable CA bundle fails every handshake; never fall back to plain.
                self._tls_error = f"backend TLS settings unusable: {exc}"
                log.warning("%s:%d: %s", key.host, key.port, self._tls_error)

    def start(self, request: UpstreamRequest) -> None:
        """Send ``request``; its answer goes to ``request.listener``. An idle
        connection takes it at once (no task, no wait); otherwise a task dials (or
        waits for a free slot under ``max_connections``) and the request follows on
        the new connection."""
        if self._tls_error is not None:
            request.listener.on_error(UpstreamError("tls", self._tls_error))
            return
        conn = self._take_idle()
        if conn is not None:
            request.reused = True
            conn.begin(request)
            return
        request.dial = asyncio.get_running_loop().create_task(self._connect_for(request))

    def stale(self, request: UpstreamRequest) -> None:
        """The connection ``request`` went out on closed before a byte of answer.
        A kept-alive one may have been closed by the backend just then: the request
        is sent once more, on a new connection, if
        :func:`~proxy.upstream.base.retry_unanswered` allows; anything else fails."""
        if not request.reused:
            request.listener.on_error(UpstreamError(
                "other", "backend closed the connection without answering",
                unanswered=True))
        elif not retry_unanswered(request.method, request.body.length, True):
            request.listener.on_error(UpstreamError(
                "other", "backend closed a kept-alive connection", unanswered=True))
        else:
            log.debug("%s:%d: stale keep-alive connection, retrying once",
                      self.key.host, self.key.port)
            request.reused = False
            request.dial = asyncio.get_running_loop().create_task(
                self._connect_for(request))

    async def _connect_for(self, request: UpstreamRequest) -> None:
        try:
            conn = await self._slot(request.head_timeout)
            if conn is not None:
                request.reused = True  # released by another exchange: kept alive
            else:
                conn = await self._dial_for(request)
        except UpstreamError as exc:
            request.dial = None
            request.listener.on_error(exc)
            return
        request.dial = None
        if request.cancelled:
            self.release(conn)
        else:
            conn.begin(request)

    async def _dial_for(self, request: UpstreamRequest) -> UpstreamConnection:
        """A new connection for ``request``, within the route's timeout too."""
        timeout = request.dial_timeout or self.dial_timeout
        return await within_route(self._dial(timeout), request.head_timeout, timeout,
                                  f"{self.key.host}:{self.key.port}")

    async def send(self, method: str, target: str, headers: Headers, body: Body, *,
                   head_timeout: float | None = None,
                   dial_timeout: float | None = None,
                   interim: Interim | None = None) -> BackendResponse:
        """Send one request and return the response once its head arrived (the
        awaiting form of :meth:`start`).

        ``headers`` are end-to-end headers including ``Host``; this side adds the body
        framing (Content-Length or chunked, from ``body.length``). Raises
        UpstreamError (``canceled`` if the client's body broke off first).
        """
        response = UpstreamResponse(asyncio.get_running_loop())
        request = response.request = UpstreamRequest(
            method, target, headers, body, response, head_timeout, dial_timeout, interim)
        self.start(request)
        try:
            await response.head
        except asyncio.CancelledError:
            request.cancel()
            raise
        return response

    # -- idle connections

    def _take_idle(self) -> UpstreamConnection | None:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.closing or conn.output_closed():
                continue
            if conn.quiet():
                return conn
            conn.abort()  # the backend spoke out of turn (or closed): never reused
        return None

    def release(self, conn: UpstreamConnection) -> None:
        """Take back a connection whose exchange ended cleanly."""
        if self._closed:
            conn.close()
            return
        if self._cap.hand_over(conn):  # a request waiting for a slot takes it at once
            return
        if len(self._idle) >= self.max_idle:
            conn.close()
            return
        loop = conn.loop
        conn.idle_since = conn.clock()
        self._idle.append(conn)
        if self._sweeper is None:
            self._sweeper = loop.call_later(self.idle_timeout, self._sweep, loop)

    def forget(self, conn: UpstreamConnection) -> None:
        """A connection closed; drop it if it was idle here (idempotent)."""
        try:
            self._idle.remove(conn)
        except ValueError:
            pass
        if conn in self._conns:
            self._conns.discard(conn)
            self._cap.hand_slots(len(self._conns))

    # -- the connection cap

    async def _slot(self, head_timeout: float | None) -> UpstreamConnection | None:
        """Permission to dial (None), or a connection another exchange released
        (:meth:`ConnectionCap.slot`); the dial that follows a None owns a reserved slot
        (:meth:`_dial` gives it back)."""
        try:
            return await self._cap.slot(len(self._conns), head_timeout or self.dial_timeout,
                                        self._give_back)
        except TimeoutError:
            pass
        if head_timeout:
            raise UpstreamError("timeout", f"{self.key.host}:{self.key.port}: no "
                                "connection free within the timeout") from None
        raise UpstreamError("timeout", f"{self.key.host}:{self.key.port}: at its "
                            f"limit of {self._cap.limit} connections", 503) from None

    def _give_back(self, granted: UpstreamConnection | None) -> None:
        if granted is None:
            self._cap.unreserve(len(self._conns))
        else:
            self.release(granted)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweeper = None
        deadline = loop.time() - self.idle_timeout
        idle = self._idle
        while idle and idle[0].idle_since <= deadline:
            idle.pop(0).close()
        if idle:
            self._sweeper = loop.call_at(idle[0].idle_since + self.idle_timeout,
                                         self._sweep, loop)

    def _watch_heads(self, loop: asyncio.AbstractEventLoop) -> None:
        """Fail the exchanges that waited ``head_timeout`` for their head with no
        route timeout (a 504), every fifth of it (10 ms to 1 s) while the pool has
        connections: a timer per request would cost every request."""
        self._watcher = None
        limit = self.head_timeout
        if limit is None or not self._conns:
            return
        now = loop.time()
        for conn in list(self._conns):  # (a failed exchange forgets its connection)
            conn.head_overdue(now, limit)
        self._watcher = loop.call_later(_every(limit), self._watch_heads, loop)

    def state(self) -> dict[str, int]:
        """Connections now: ``idle`` (kept alive, waiting) and ``busy`` (in an
        exchange), for ``/debug/routes``."""
        idle = len(self._idle)
        return {"idle": idle, "busy": max(0, len(self._conns) - idle)}

    def close_idle(self) -> None:
        """Close every idle connection (busy ones finish their exchange first)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def close(self) -> None:
        """Close idle connections and stop pooling; busy ones close when done, and
        requests waiting for a slot dial (each its own connection, closed after)."""
        self._closed = True
        self._cap.open_all()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self.close_idle()

    # -- dialing

    async def _dial(self, timeout: float) -> UpstreamConnection:
        """A new connection, in the slot reserved for it (:meth:`_slot`)."""
        try:
            conn = await self._connect(timeout)
        except BaseException:
            self._cap.unreserve(len(self._conns))  # failed: the slot is free again
            raise
        if not conn.closing:  # (lost already if forget came first: then not counted)
            self._conns.add(conn)
            if self._watcher is None and self.head_timeout is not None:
                self._watcher = conn.loop.call_later(
                    _every(self.head_timeout), self._watch_heads, conn.loop)
        self._cap.unreserve(len(self._conns))
        return conn

    async def _connect(self, timeout: float) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        key = self.key
        if self._tls is None:
            try:
                async with asyncio.timeout(timeout):
                    _, conn = await loop.create_connection(
                        lambda: UpstreamConnection(self), key.host, key.port)
            except (OSError, TimeoutError) as exc:
                raise unreachable(key, exc) from None
            return conn
        sock = await dial_tcp(loop, key, timeout)
        _, conn = await open_over(loop, key, self._tls, lambda: UpstreamConnection(self),
                                  sock, timeout)
        return conn


def _every(wait: float) -> float:
    """How often a wait of ``wait`` seconds is checked by a sweep."""
    return min(1.0, max(0.01, wait / 5))
