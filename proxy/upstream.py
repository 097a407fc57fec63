"""Upstream side: connection pools per backend and HTTP/1.1 exchanges (llhttp parser).

:class:`Pools` hands out one :class:`Pool` per backend key — (scheme, host, port,
protocol, TLS identity), created on first use. Pools outlive config
snapshots so keep-alive connections survive pushes; :meth:`Pools.retain` closes the
pools no backend of a new config uses any more.

:meth:`Pool.send` writes one request and returns an :class:`UpstreamResponse` as soon as
the response head arrived; the body is then read with :meth:`UpstreamResponse.read`.
Request bodies stream with backpressure; a small body goes out with the head in one
write. The deadline (route timeouts) covers only the wait for the response head and starts once
the request body has been sent.

Failures raise :class:`UpstreamError` with a ``reason`` of the backend-error metric
(``dial``, ``tls``, ``timeout``, ``other``); the Handler maps dial/tls/other to 502 and
timeout to 504. Cancellation (the client went away) closes the connection and
propagates :class:`asyncio.CancelledError` unchanged.

A reused keep-alive connection the backend closed before answering is retried once on a
fresh connection when the request is idempotent and no body byte was consumed (RFC 9110
§9.2.2), so a stale pool never surfaces as a 502.

Only HTTP/1.1 (plain or TLS) is spoken here; ``protocol == "h2c"`` backends get the
HTTP/2 pool of :mod:`proxy.h2c`, registered in ``_POOL_TYPES`` (the wire validation
admits no other protocol).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import socket
import ssl
import tempfile
import termios
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

import httptools

from proxy.flow import BODY, FlowControl, GuardedOutput, TransportStream
from proxy.framing import (
    HeadLimits, forwardable_trailers, poolable, transfer_codings, valid_status)
from proxy.http1 import render_head
from proxy.request import Body, BodyError, ByteStream, Headers
from routing.model import BackendTLS
from routing.values import split_backend_url

if TYPE_CHECKING:
    from routing.model import Backend, Config, Filter

log = logging.getLogger("tunnelgate.upstream")

DIAL_TIMEOUT = 5.0  # TCP connect, and again for a TLS handshake. Go's dialer allows 30 s;
# 5 s fails fast enough for a 502 to beat client timeouts while tolerating a slow SYN.
# Idle keep-alive connections kept per pool, at most. A pool keeps every connection an
# exchange released, up to this bound: reuse takes the newest, so those beyond what the
# recent concurrency needs stay unused and expire after IDLE_TIMEOUT. A smaller cap
# (it was 64) closes connections a load above it dials again a moment later: at 100
# concurrent requests, 18,000 dials in 5 s and as many sockets in TIME_WAIT.
MAX_IDLE = 1024
IDLE_TIMEOUT = 60.0  # an idle connection older than this is closed
RESPONSE_HIGH_WATER = 64 * 1024  # response bytes buffered before reading pauses
COALESCE_LIMIT = 16 * 1024  # request bodies up to this size go out with the head

# RFC 9110 §9.2.2: safe to repeat after a connection failure.
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# Methods whose empty body is still announced (as Go's client does).
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_CHUNKED = b"Transfer-Encoding: chunked\r\n"
_LENGTH_ZERO = b"Content-Length: 0\r\n"
_LAST_CHUNK = b"0\r\n\r\n"

Interim = Callable[[int, Headers], None]
"""Receives a backend's 1xx interim response other than 100 and 101 (status, fields)."""


class UpstreamError(Exception):
    """The backend could not be used; ``reason`` is a backend-error metric reason.
    ``status``, when set, is the answer the client gets instead of the reason's."""

    def __init__(self, reason: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


class _Stale(Exception):
    """The connection closed before a single response byte arrived."""


@dataclass(frozen=True, slots=True)
class PoolKey:
    """What makes two backends share connections."""

    scheme: str
    host: str
    port: int
    protocol: str
    tls: BackendTLS | None


def pool_key(backend: "Backend") -> PoolKey:
    """The pool key of a backend (raises ValueError for an unusable URL)."""
    address = split_backend_url(backend.url)
    return PoolKey(address.scheme, address.host, address.port, backend.protocol,
                   backend.tls)


# ------------------------------------------------------------------------- response


class UpstreamResponse:
    """A backend's response: head fields now, body through :meth:`read`.

    The connection goes back to its pool as soon as the whole message has arrived and
    the exchange allows keep-alive; buffered body bytes stay readable here.
    """

    __slots__ = ("status", "reason", "headers", "length", "trailers", "_conn", "_chunks",
                 "_buffered", "_done", "_error", "_waiter", "_head_only", "_chunked")

    def __init__(self, conn: "UpstreamConnection", head_only: bool) -> None:
        self.status = 0
        self.reason = ""
        self.headers: Headers = []
        self.length: int | None = None
        """Declared Content-Length, or None (chunked / read to EOF)."""
        self.trailers: Headers = []
        self._conn: UpstreamConnection | None = conn
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._done = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._head_only = head_only  # the answer to a HEAD: never a body
        self._chunked = False

    async def read(self) -> bytes:
        """Next body bytes; ``b""`` at the end. Raises UpstreamError (``other``) when
        the backend breaks off the body."""
        while True:
            chunks = self._chunks
            if chunks:
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self._chunks = []
                self._buffered = 0
                if self._conn is not None:
                    self._conn.flow.resume_reading(BODY)
                return data
            if self._done:
                return b""
            if self._error is not None:
                raise self._error
            assert self._conn is not None  # attached until done or failed
            self._waiter = self._conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    @property
    def failed(self) -> UpstreamError | None:
        """The error that already broke this response off, if any (a head that parsed,
        followed in the same read by bytes that did not): checked before relaying, it
        lets the caller answer 502 instead of a truncated response."""
        return self._error

    def whole_body(self) -> bytes | None:
        """The entire body if all of it has already arrived (and nothing was read or
        went wrong yet), else None — then :meth:`read` streams it."""
        if not self._done or self._error is not None:
            return None
        chunks, self._chunks = self._chunks, []
        self._buffered = 0
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def detach(self) -> ByteStream:
        """The raw stream after a ``101`` (bytes after the head come first)."""
        conn = self._conn
        if self.status != 101 or conn is None or conn.stream is None:
            raise RuntimeError("only a 101 response can be detached")
        self._conn = None
        return conn.stream

    def close(self) -> None:
        """Give up on the response: an unfinished exchange closes its connection."""
        conn, self._conn = self._conn, None
        if conn is not None and not self._done:
            conn.abort()
        self._done = True
        self._chunks = []

    # -- fed by the connection

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > RESPONSE_HIGH_WATER and self._conn is not None:
            self._conn.flow.pause_reading(BODY)
        self._wake()

    def _end(self) -> None:
        self._done = True
        self._conn = None
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if not self._done:
            self._error = error
            self._conn = None
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


# ----------------------------------------------------------------------- connection


class UpstreamConnection(GuardedOutput):
    """One HTTP/1.1 connection to a backend; one exchange at a time.

    Response bytes are trusted only as the answer to the request being exchanged:
    bytes on an idle connection, or a message after the complete answer, mean the
    backend is out of step with us, and the connection is closed rather than letting
    them reach the next request's client (a response desync).
    """

    def __init__(self, pool: "Pool") -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.flow: FlowControl = None  # type: ignore[assignment]  # set on connect
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # on connect
        self.idle_since = 0.0
        self.stream: TransportStream | None = None
        self.limits = pool.head_limits
        # Bound to this connection once connected: the parser holds its bound methods,
        # a reference cycle, and a dial that fails never reaches connection_lost.
        self._parser = httptools.HttpResponseParser(None)
        self._response: UpstreamResponse | None = None
        self._head: asyncio.Future[None] | None = None
        self._headers: Headers = []
        self._reason = b""
        self._interim = False
        self._on_interim: Interim | None = None
        self._got_bytes = False
        self._head_bytes = 0  # bytes received while no final head was complete
        self._head_size = 0  # field bytes of the head (or trailer section) being parsed
        self._sent = False  # the whole request (head and body) was written
        self._reusable = True
        self._fresh_parser = False
        self._request_headers: Headers = []
        self._sender: asyncio.Future[None] | None = None  # streams the request body
        self._fd = -1
        self._unread = bytearray(4)  # FIONREAD result buffer (see quiet)

    # -- transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport = transport  # type: ignore[assignment]  # a stream transport
        self.flow = FlowControl(transport)  # type: ignore[arg-type]
        self._parser = httptools.HttpResponseParser(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._fd = sock.fileno()

    def quiet(self) -> bool:
        """No byte waits unread in the socket. Asked before an idle connection is
        reused: bytes that arrived before the new request is written cannot be its
        answer (the event loop just has not delivered them yet)."""
        if self._fd < 0:
            return True
        try:
            fcntl.ioctl(self._fd, termios.FIONREAD, self._unread)
        except OSError:
            return False
        return not any(self._unread)

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()

    def data_received(self, data: bytes) -> None:
        if self.stream is not None:
            self.stream.feed(data)
            return
        response = self._response
        if response is None:
            self.abort()  # bytes nobody asked for: the connection is out of sync
            return
        self._got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._switched(data[exc.args[0]:])
        except httptools.HttpParserError as exc:
            self._broken(UpstreamError("other", f"invalid response from backend: {exc}"))
        if self._fresh_parser:
            self._fresh_parser = False
            self._parser = httptools.HttpResponseParser(self)
        if not response.status and self._response is response:
            # Still no final head: all of this was head bytes (interim ones included).
            # Counted per read, so a head is never buffered much past the cap.
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_bytes:
                self._broken(UpstreamError("other", "response head too large"))

    def eof_received(self) -> bool:
        response = self._response
        if (response is not None and response.status and response.length is None
                and not response._chunked and not response._done):
            self._response = None
            response._end()  # a close-delimited body ends here (RFC 9112 §6.3 item 8)
        self._lost()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(exc, ssl.SSLError):
            # e.g. a TLS 1.3 server rejecting our client certificate after the
            # handshake: a TLS failure, not a stale connection.
            self._broken(UpstreamError("tls", f"TLS failure: {exc}"))
        self._lost()
        self.flow.connection_lost()
        if self.stream is not None:
            self.stream.feed_eof()
        # Break the parser's reference cycle (see HTTP1Protocol.connection_lost).
        self._parser = httptools.HttpResponseParser(None)

    def _lost(self) -> None:
        self._stop_sender()
        self.closing = True
        self.pool.forget(self)
        response, self._response = self._response, None
        if response is None:
            return
        head = self._head
        if head is not None and not head.done():
            head.set_exception(_Stale() if not self._got_bytes else UpstreamError(
                "other", "backend closed the connection before the response head"))
        elif response.status:
            response._fail(UpstreamError("other", "backend closed the connection mid-body"))

    # -- parser callbacks (an exception raised here becomes a 502, see data_received)

    def on_message_begin(self) -> None:
        if self._response is None:
            # A second message after the complete answer: never anyone's response.
            raise UpstreamError("other", "backend sent bytes after its response")
        self._headers = []
        self._reason = b""
        self._head_size = 0

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        # After the head, ``_headers`` is the response's trailer list (see
        # on_headers_complete): one append, no branch, per field.
        headers = self._headers
        headers.append((name, value.rstrip(b" \t")))  # llhttp keeps trailing OWS
        self._head_size += len(name) + len(value)
        if len(headers) > self.limits.max_fields or self._head_size > self.limits.max_bytes:
            raise UpstreamError("other", "response head too large")

    def on_headers_complete(self) -> None:
        response = self._response
        if response is None:
            return
        parser = self._parser
        status = parser.get_status_code()
        if not valid_status(status, parser.get_http_version()):
            raise UpstreamError("other", f"invalid status line (status {status})")
        if status < 200 and status != 101:
            self._interim = True  # 100 Continue is ours to send; 102/103 are relayed
            relay = self._on_interim
            if status != 100 and relay is not None:
                relay(status, self._headers)
            return
        if status == 101 and not _asks_upgrade(self._request_headers):
            raise UpstreamError("other", "backend switched protocols unasked")
        response.status = status
        response.reason = self._reason.decode("latin-1")
        response.headers = headers = self._headers
        self._headers = response.trailers  # fields after the body are trailers
        self._head_size = 0
        coded = False
        for name, value in headers:
            n = len(name)
            if n == 14 and name.lower() == b"content-length":
                response.length = int(value)
            elif n == 17 and name.lower() == b"transfer-encoding":
                coded = True
                response._chunked = transfer_codings(value)[1]
        if not poolable(response._head_only, status, response.length, coded):
            self._reusable = False
        head = self._head
        if head is not None and not head.done():
            head.set_result(None)
        if response._head_only:
            if not parser.should_keep_alive():
                self._reusable = False
            self._fresh_parser = True  # llhttp would expect a body; a HEAD has none
            self._message_done()

    def on_body(self, data: bytes) -> None:
        response = self._response
        if response is None:
            self._reusable = False  # a body where none belongs (HEAD answered with one)
            self.abort()
            return
        response._feed(data)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        response = self._response
        if response is not None and response.status != 101:
            # Read here, after any trailer section: llhttp honours a ``Connection:
            # close`` even there, and would refuse the next response on this parser.
            if not self._parser.should_keep_alive():
                self._reusable = False
            self._message_done()

    def _message_done(self) -> None:
        response, self._response = self._response, None
        assert response is not None
        response._end()  # detaches: what it buffered is its own now
        self.flow.resume_reading(BODY)
        if self._sent and self._reusable and not self.closing:
            self.pool.release(self)
        else:
            self._stop_sender()
            self.close()

    def _switched(self, rest: bytes) -> None:
        """A 101 arrived: the rest of the connection is a raw byte stream."""
        assert self.transport is not None
        response, self._response = self._response, None
        self._reusable = False
        self.stream = TransportStream(self.transport, self.flow, rest)
        if response is not None:
            response._done = True  # no body; the bytes are detach()'s

    def _broken(self, error: UpstreamError) -> None:
        response, self._response = self._response, None
        head = self._head
        if head is not None and not head.done():
            head.set_exception(error)
        elif response is not None:
            response._fail(error)
        self.abort()

    # -- the exchange

    async def exchange(self, method: str, target: str, headers: Headers, body: Body,
                       head_timeout: float | None,
                       interim: Interim | None = None) -> UpstreamResponse:
        """Write the request, wait for the response head; see :meth:`Pool.send`.

        A small body is read whole before anything is written; the response is
        expected (``_response`` set) only from the moment the request head goes out, so
        bytes arriving before that are never taken for its answer.
        """
        length = body.length
        payload = b""
        if length is not None and 0 < length <= COALESCE_LIMIT:
            try:
                payload = await _read_all(body, length)
            except BodyError as broken:  # (a name of its own: mypyc types it)
                self.pool.release(self)  # nothing was written: still in step
                raise UpstreamError("canceled", f"request body failed: {broken}") from None
            except BaseException:
                self.abort()
                raise
            if self.closing:
                raise _Stale()  # closed (or desynchronised) while the body was read
        response = self._response = UpstreamResponse(self, method == "HEAD")
        head = self._head = self.loop.create_future()
        self._sent = False
        self._got_bytes = False
        self._head_bytes = 0
        self._on_interim = interim
        self._request_headers = headers
        if length is None:
            framing = _CHUNKED
        elif length:
            framing = b"Content-Length: %d\r\n" % length
        else:
            framing = _LENGTH_ZERO if method in _BODY_METHODS else b""
        request_head = render_head(
            b"%s %s HTTP/1.1\r\n" % (method.encode("ascii"), target.encode("latin-1")),
            headers, framing)
        try:
            if length == 0:
                self.write(request_head)
                self._sent = True
            elif payload:
                # One writev for head and body, the body not copied into the head.
                self.writelines([request_head, payload])
                self._sent = True
            else:
                self.write(request_head)
                await self._stream_body(body, length is None, head)
            if not head.done():
                await self._wait_head(head, head_timeout)
            head.result()
        except BaseException as exc:
            # The connection may already serve the next exchange (it returns to the
            # pool the moment a response completes): only tear down our own.
            if self._head is head:
                self._head = None
                self._response = None
                self._stop_sender()
                self.abort()
            response.close()
            if isinstance(exc, BodyError):
                # The client's side broke (gone, or a malformed body): nothing to answer.
                raise UpstreamError("canceled", f"request body failed: {exc}") from None
            raise
        if self._head is head:
            self._head = None
        return response

    async def _stream_body(self, body: Body, chunked: bool,
                           head: asyncio.Future[None]) -> None:
        """Send the body in a task of its own, so a backend that answers early (and
        stops reading) is not waited for; such a connection is not reused.

        An early answer wins over the body: it is relayed even though the sender is
        then stopped (cancelled when the answer completes, see :meth:`_message_done`)
        — that cancellation is the sender's own, never the exchange's.
        """
        sender = self._sender = asyncio.ensure_future(self._send_body(body, chunked))
        # Retrieved whatever happens: a client gone mid-body fails the sender after
        # the exchange may have stopped waiting for it (counted, not an error line).
        sender.add_done_callback(_drop_result)
        await asyncio.wait((sender, head), return_when=asyncio.FIRST_COMPLETED)
        if not sender.done():
            self._reusable = False  # answered before the body was sent: not reusable
            return
        if self._sender is sender:
            self._sender = None
        if head.done():
            # Answered while (or just as) the body went out: the answer stands whatever
            # became of the sender (a stopped or failed one never set ``_sent``).
            if sender.cancelled() or sender.exception() is not None:
                self._reusable = False
            return
        sender.result()  # a BodyError surfaces here

    async def _send_body(self, body: Body, chunked: bool) -> None:
        flow = self.flow
        while chunk := await body.read():
            if self.closing:
                return
            if chunked:
                self.writelines([b"%x\r\n" % len(chunk), chunk, b"\r\n"])
            else:
                self.write(chunk)
            if flow.write_paused:
                try:
                    await flow.drain()
                except ConnectionError:
                    return
        if chunked:
            # Request trailers travel with the last chunk (RFC 9112 §7.1.2), minus the
            # fields no trailer may carry; a body without them has none (``_LAST_CHUNK``).
            trailers = getattr(body, "trailers", None)
            if trailers:
                self.write(render_head(b"0\r\n", forwardable_trailers(trailers)))
            else:
                self.write(_LAST_CHUNK)
        # Set here, not by the waiting exchange: an answer completing in this same turn
        # must already see that the request went out whole (the connection is reusable).
        self._sent = not self.closing

    async def _wait_head(self, head: asyncio.Future[None], timeout: float | None) -> None:
        timer = None
        if timeout is not None:
            timer = self.loop.call_later(timeout, _expire_head, head)
        try:
            await head
        finally:
            if timer is not None:
                timer.cancel()

    def _stop_sender(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None and not sender.done():
            sender.cancel()


def _expire_head(head: asyncio.Future[None]) -> None:
    if not head.done():
        head.set_exception(UpstreamError("timeout", "backend response headers timed out"))


def _drop_result(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a late body failure only matters to the socket


def _asks_upgrade(headers: Headers) -> bool:
    return any(len(name) == 7 and name.lower() == b"upgrade" for name, _ in headers)


async def _read_all(body: Body, length: int) -> bytes:
    """A small body of known length, whole (it goes out with the head)."""
    first = await body.read()
    if len(first) >= length:
        return first
    parts = [first]
    size = len(first)
    while size < length:
        chunk = await body.read()
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


# ----------------------------------------------------------------------------- pools


class Pool:
    """Keep-alive HTTP/1.1 connections to one backend (plain or TLS).

    ``head_limits`` caps response heads (set by :class:`Pools` for every pool).

    ``max_connections`` (0 = no limit) caps the connections open to the backend, idle
    or busy. A request that finds none free waits, first come first served, for one to
    be released or closed — within its head timeout if it has one (then 504, as for a
    backend that does not answer in time), else within the dial timeout (then 503: the
    backend is there, but at its limit).
    """

    head_limits = HeadLimits()

    def __init__(self, key: PoolKey, *, dial_timeout: float = DIAL_TIMEOUT,
                 max_idle: int = MAX_IDLE, idle_timeout: float = IDLE_TIMEOUT,
                 max_connections: int = 0) -> None:
        self.key = key
        self.dial_timeout = dial_timeout
        self.max_idle = max_idle
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self._idle: list[UpstreamConnection] = []  # oldest first; reuse takes the newest
        self._conns: set[UpstreamConnection] = set()  # connected, not yet lost
        self._reserved = 0  # slots of dials in progress (counted against the cap)
        # Requests waiting for a slot: each gets a released connection, or None = dial.
        self._waiters: deque[asyncio.Future[UpstreamConnection | None]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False
        self._tls: _TLSSetup | None = None
        self._tls_error: str | None = None
        if key.scheme == "https" or key.tls is not None:
            try:
                self._tls = _TLSSetup(key)
            except (ssl.SSLError, ValueError, OSError) as exc:
                # An unusable CA bundle fails every handshake; never fall back to plain.
                self._tls_error = f"backend TLS settings unusable: {exc}"
                log.warning("%s:%d: %s", key.host, key.port, self._tls_error)

    async def send(self, method: str, target: str, headers: Headers, body: Body, *,
                   head_timeout: float | None = None,
                   dial_timeout: float | None = None,
                   interim: Interim | None = None) -> UpstreamResponse:
        """Send one request and return the response once its head arrived.

        ``headers`` are end-to-end headers including ``Host``; this side adds the body
        framing (Content-Length or chunked, from ``body.length``). ``head_timeout``
        bounds the wait for the response head after the body was sent;
        ``dial_timeout``, if a new connection is needed, replaces the pool's (a
        WebSocket handshake has its own, PROXY_WS_DIAL_TIMEOUT).
        ``interim`` receives the backend's 1xx answers other than 100 and 101.
        Raises UpstreamError; BodyError if the client's body broke off first.
        """
        if self._tls_error is not None:
            raise UpstreamError("tls", self._tls_error)
        conn = self._take_idle() or await self._slot(head_timeout)
        if conn is not None:
            try:
                return await conn.exchange(method, target, headers, body, head_timeout,
                                           interim)
            except _Stale:
                if method not in _IDEMPOTENT or body.length != 0:
                    raise UpstreamError(
                        "other", "backend closed a kept-alive connection") from None
                log.debug("%s:%d: stale keep-alive connection, retrying once",
                          self.key.host, self.key.port)
            conn = await self._slot(head_timeout)  # a fresh one this time
        if conn is None:
            conn = await self._dial(dial_timeout or self.dial_timeout)
        try:
            return await conn.exchange(method, target, headers, body, head_timeout,
                                       interim)
        except _Stale:
            raise UpstreamError(
                "other", "backend closed the connection without answering") from None

    # -- idle connections

    def _take_idle(self) -> UpstreamConnection | None:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.closing or conn.transport.is_closing():  # type: ignore[union-attr]
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
        while self._waiters:  # a request waiting for a slot takes it over at once
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if len(self._idle) >= self.max_idle:
            conn.close()
            return
        loop = conn.loop
        conn.idle_since = loop.time()
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
            self._hand_slots()

    # -- the connection cap

    async def _slot(self, head_timeout: float | None) -> UpstreamConnection | None:
        """Permission to dial (None), or a connection another exchange released; waits
        while the pool is at ``max_connections``. The dial that follows a None owns a
        reserved slot (:meth:`_dial` gives it back). Only reached when no connection
        is idle, so not on the path of a warm pool."""
        if not self.max_connections or self._used() < self.max_connections:
            self._reserved += 1
            return None
        waiter: asyncio.Future[UpstreamConnection | None] = (
            asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(head_timeout or self.dial_timeout):
                return await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._give_back(waiter.result())  # granted just as we gave up
            if not isinstance(exc, TimeoutError):
                raise
        if head_timeout:
            raise UpstreamError("timeout", f"{self.key.host}:{self.key.port}: no "
                                "connection free within the timeout") from None
        raise UpstreamError("timeout", f"{self.key.host}:{self.key.port}: at its "
                            f"limit of {self.max_connections} connections", 503) from None

    def _give_back(self, granted: UpstreamConnection | None) -> None:
        if granted is None:
            self._reserved -= 1
            self._hand_slots()
        else:
            self.release(granted)

    def _used(self) -> int:
        return len(self._conns) + self._reserved

    def _hand_slots(self) -> None:
        """Let waiting requests dial into the slots that are free now."""
        while self._waiters and self._used() < self.max_connections:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._reserved += 1
                waiter.set_result(None)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweeper = None
        deadline = loop.time() - self.idle_timeout
        idle = self._idle
        while idle and idle[0].idle_since <= deadline:
            idle.pop(0).close()
        if idle:
            self._sweeper = loop.call_at(idle[0].idle_since + self.idle_timeout,
                                         self._sweep, loop)

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
        waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                self._reserved += 1
                waiter.set_result(None)
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self.close_idle()

    # -- dialing

    async def _dial(self, timeout: float) -> UpstreamConnection:
        """A new connection, in the slot reserved for it (:meth:`_slot`)."""
        try:
            conn = await self._connect(timeout)
        finally:
            self._reserved -= 1
        if conn.closing:  # lost already (forget came first): its slot is free again
            self._hand_slots()
        else:
            self._conns.add(conn)
        return conn

    async def _connect(self, timeout: float) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        key = self.key
        tls = self._tls
        try:
            async with asyncio.timeout(timeout):
                if tls is None:
                    _, conn = await loop.create_connection(
                        lambda: UpstreamConnection(self), key.host, key.port)
                    return conn
                sock = await _connect(loop, key.host, key.port)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError("dial", f"cannot connect to {key.host}:{key.port}: "
                                        f"{exc or 'timed out'}") from None
        try:
            async with asyncio.timeout(timeout):
                transport, conn = await loop.create_connection(
                    lambda: UpstreamConnection(self), sock=sock, ssl=tls.context,
                    server_hostname=tls.server_name)
        except (OSError, TimeoutError, ssl.SSLError, ValueError) as exc:
            sock.close()
            raise UpstreamError("tls", f"TLS handshake with {key.host}:{key.port} "
                                       f"failed: {exc or 'timed out'}") from None
        problem = tls.check_peer(transport.get_extra_info("peercert"))
        if problem is not None:
            conn.abort()
            raise UpstreamError("tls", f"{key.host}:{key.port}: {problem}")
        return conn


async def _connect(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket (addresses tried in resolver order)."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise error


class _TLSSetup:
    """The TLS client context of one pool, built once."""

    def __init__(self, key: PoolKey) -> None:
        tls = key.tls
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if tls is not None and tls.ca_bundle:
            context.load_verify_locations(cadata=tls.ca_bundle)
        else:
            context.load_default_certs()  # no bundle: the system's trust roots
        self.dns_names = tuple(tls.subject_alt_names) if tls is not None else ()
        self.uris = tuple(tls.subject_alt_name_uris) if tls is not None else ()
        self.server_name = (tls.server_name if tls is not None and tls.server_name
                            else key.host)
        if self.dns_names or self.uris:
            # Chain still verified (verify_mode stays CERT_REQUIRED); the name check is
            # the SAN lists', done in check_peer after the handshake.
            context.check_hostname = False
        if tls is not None and tls.client_cert_pem and tls.client_key_pem:
            _load_client_pair(context, tls.client_cert_pem, tls.client_key_pem)
        self.context = context

    def check_peer(self, cert: dict | None) -> str | None:  # type: ignore[type-arg]
        """None if the leaf satisfies the SAN lists (or there are none), else why not."""
        if not self.dns_names and not self.uris:
            return None
        entries = (cert or {}).get("subjectAltName", ())
        dns = [value for kind, value in entries if kind == "DNS"]
        uris = {value for kind, value in entries if kind == "URI"}
        if any(uri in uris for uri in self.uris):
            return None
        if any(dns_matches(pattern, name) for name in self.dns_names for pattern in dns):
            return None
        return "certificate matches none of the expected subject alternative names"


def _load_client_pair(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Attach an mTLS client certificate; a bad pair is logged and left out (the
    handshake then fails closed if the backend requires one)."""
    with tempfile.TemporaryDirectory(prefix="tunnelgate-tls-") as directory:
        cert_path = os.path.join(directory, "cert.pem")
        key_path = os.path.join(directory, "key.pem")
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        try:
            context.load_cert_chain(cert_path, key_path)
        except (ssl.SSLError, ValueError) as exc:
            log.warning("backend TLS client certificate/key unusable: %s", exc)


def dns_matches(pattern: str, name: str) -> bool:
    """RFC 6125 §6.4: a certificate DNS name (``*.`` only as the whole leftmost label,
    matching exactly one label) against an expected host name; case-insensitive."""
    pattern = pattern.lower().rstrip(".")
    name = name.lower().rstrip(".")
    if pattern == name:
        return True
    if not pattern.startswith("*.") or "*" in pattern[2:]:
        return False
    head, dot, rest = name.partition(".")
    return bool(head) and bool(dot) and rest == pattern[2:] and "." in rest


# protocol -> pool implementation; proxy.h2c adds "h2c".
_POOL_TYPES: dict[str, type[Pool]] = {"": Pool}
from proxy import h2c as _h2c  # noqa: E402,F401  registers "h2c"; needs the names above


class Pools:
    """Every upstream pool of the process, keyed by backend."""

    def __init__(self, *, dial_timeout: float = DIAL_TIMEOUT, max_idle: int = MAX_IDLE,
                 idle_timeout: float = IDLE_TIMEOUT,
                 head_limits: HeadLimits = HeadLimits(), max_connections: int = 0) -> None:
        self.dial_timeout = dial_timeout
        self.max_idle = max_idle
        self.idle_timeout = idle_timeout
        self.head_limits = head_limits
        self.max_connections = max_connections  # per pool; 0 = no limit (see Pool)
        self._pools: dict[PoolKey, Pool] = {}
        # Backend object -> pool, by identity: hashing a Backend (filters and all) on
        # every request would cost more than the lookup. The entry holds the backend,
        # so its id cannot be reused while cached; cleared on every retain.
        self._by_backend: dict[int, tuple[Backend, Pool]] = {}

    def get(self, backend: "Backend") -> Pool:
        """The pool for ``backend``, created on first use."""
        entry = self._by_backend.get(id(backend))
        if entry is not None and entry[0] is backend:
            return entry[1]
        key = pool_key(backend)
        pool = self._pools.get(key)
        if pool is None:
            pool_type = _POOL_TYPES[key.protocol]
            pool = self._pools[key] = pool_type(
                key, dial_timeout=self.dial_timeout, max_idle=self.max_idle,
                idle_timeout=self.idle_timeout, max_connections=self.max_connections)
            pool.head_limits = self.head_limits
        if len(self._by_backend) > 4096:
            self._by_backend.clear()
        self._by_backend[id(backend)] = (backend, pool)
        return pool

    def peek(self, backend: "Backend") -> Pool | None:
        """The pool ``backend`` uses if it exists (never creates one)."""
        try:
            return self._pools.get(pool_key(backend))
        except ValueError:
            return None

    def retain(self, keys: Iterable[PoolKey]) -> None:
        """Close and drop every pool whose key is not in ``keys`` (after a config push:
        the :func:`config_pool_keys` of the new config)."""
        keep = set(keys)
        for key in [key for key in self._pools if key not in keep]:
            self._pools.pop(key).close()
        self._by_backend.clear()

    def close(self) -> None:
        """Close everything (shutdown)."""
        self.retain(())


def config_pool_keys(config: "Config") -> frozenset[PoolKey]:
    """The pools the backends and mirrors of ``config`` use. Computed while a pushed
    config is compiled (off the event loop): for 10,000 rules it is tens of ms of URL
    parsing, so each distinct (url, protocol, tls) is split once."""
    targets: set[tuple[str, str, BackendTLS | None]] = set()
    filters: list[Filter] = []
    for rule in config.rules:
        filters.extend(rule.filters)
        for backend in rule.backends:
            targets.add((backend.url, backend.protocol, backend.tls))
            filters.extend(backend.filters)
    for f in filters:
        mirror = f.request_mirror
        if mirror is not None:
            targets.add((mirror.backend_url, mirror.protocol, mirror.tls))
    keys = set()
    for url, protocol, tls in targets:
        try:
            address = split_backend_url(url)
        except ValueError:
            continue
        keys.add(PoolKey(address.scheme, address.host, address.port, protocol, tls))
    return frozenset(keys)
