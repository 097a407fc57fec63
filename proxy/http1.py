"""The HTTP/1.1 entrance: a raw asyncio Protocol per client connection (llhttp parser).

Shape: :class:`HTTP1Protocol` owns the
transport and the parser; parser callbacks only collect; each request becomes a
:class:`_Cycle` — the request/response exchange, which is also the Handler's
:class:`~proxy.request.Responder` — run in its own task, apart from the transport
lifecycle; flow control lives in :class:`proxy.flow.FlowControl`.

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
import os
import socket
import time
from collections import deque
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Callable

import httptools

from proxy import proxyproto
from proxy.framing import (
    MAX_CHUNK_SIZE, accepts_trailers, chunk_size_before, transfer_codings)
from proxy.flow import (
    BODY, PIPELINE, UPGRADE, FlowControl, GuardedOutput, TransportStream)
from proxy.logs import RateLimit
from proxy.request import (
    EMPTY_BODY, BodyError, ByteStream, Handle, Headers, Request)

log = logging.getLogger("tunnelgate.http1")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

BODY_HIGH_WATER = 64 * 1024  # request bytes buffered for the Handler before pausing
DISCARD_LIMIT = 64 * 1024  # unread request body we swallow to keep a connection alive
COALESCE_LIMIT = 16 * 1024  # bodies up to this size are joined with the head
FLUSH_LIMIT = 64 * 1024  # streamed output buffered within one loop turn before a flush
FEED_SLICE = 16 * 1024  # large reads are fed in slices so head/chunk limits stay exact
CHUNK_OVERHEAD = 4096  # bytes of chunk framing tolerated beyond…
CHUNK_OVERHEAD_PER_CHUNK = 64  # …this much per chunk (size line, CRLFs, short extensions)
CHUNK_LINE_SCAN = CHUNK_OVERHEAD + 64  # longest chunk-size line looked at (extensions)


@dataclass(slots=True)
class EntranceSettings:
    """Per-entrance listener settings (limits are always on).

    ``prepare`` runs on every request before the Handler (the composition root sets it
    per entrance, e.g. trust rules); it may edit the request in place.
    ``allow`` restricts socket peer addresses (a PROXY-claimed source is not trusted
    for this); a refused connection is closed at once. Unix-socket peers have no address and are not
    filtered (the socket's file mode guards them).
    ``rejected(entrance, status, reason, client_ip)`` is told of every request this
    side answers itself (malformed: 4xx; head not in time: 408), for logs and metrics.
    """

    name: str = "tunnel"
    header_timeout: float = 10.0  # complete request head, from connection open / 1st byte
    idle_timeout: float = 75.0  # keep-alive wait between requests
    body_timeout: float = 300.0  # longest pause in a request body the Handler waits on
    send_timeout: float = 60.0  # longest wait for a client to take response bytes
    max_request_line: int = 8 * 1024
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    max_connections: int = 10_000
    proxy_protocol: bool = False
    prepare: Callable[[Request], None] | None = None
    allow: list[IPNetwork] | None = None
    scheme: str = "http"
    rejected: Callable[[str, int, str, str | None], None] | None = None


class _Reject(Exception):
    """Raised from parser callbacks: answer ``status`` and close the connection."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


# ----------------------------------------------------------------------------- wire


def render_head(first_line: bytes, headers: Headers, extra: bytes = b"") -> bytes:
    """A message head: ``first_line`` (CRLF-terminated), ``headers``, then ``extra``
    (pre-rendered CRLF-terminated lines), then the blank line.

    Raises ValueError if a header name or value holds CR or LF: a config value or a
    handler bug must never split a header line on the wire (response splitting).
    """
    parts = [first_line]
    for name, value in headers:  # one flat join: no per-line bytes objects
        parts.append(name)
        parts.append(b": ")
        parts.append(value)
        parts.append(b"\r\n")
    parts.append(extra)
    parts.append(b"\r\n")
    head = b"".join(parts)
    lines = len(headers) + 2  # the first line, one per header, the blank line
    if extra:
        lines += extra.count(b"\n")
    if head.count(b"\n") != lines or head.count(b"\r") != lines:
        raise ValueError("header name or value contains CR or LF")
    return head


_STATUS_LINES: dict[int, bytes] = {}


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason>\\r\\n`` (cached)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        if not 100 <= status <= 999:
            raise ValueError(f"invalid status {status}")
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} {reason}\r\n".encode("ascii")
    return line


def _error_response(status: int) -> bytes:
    body = f"{HTTPStatus(status).phrase.lower()}\n".encode("ascii")
    return render_head(status_line(status), [
        (b"Content-Type", b"text/plain; charset=utf-8"),
        (b"Content-Length", str(len(body)).encode("ascii")),
        (b"Connection", b"close"),
    ]) + body


_ERRORS = {status: _error_response(status)
           for status in (400, 405, 408, 414, 431, 500, 501, 505)}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CHUNKED = b"Transfer-Encoding: chunked\r\n"
_CLOSE = b"Connection: close\r\n"
_KEEP_ALIVE = b"Connection: keep-alive\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
_NO_BODY_STATUSES = frozenset({204, 304})
_METHODS = {m.encode(): m for m in (
    "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE")}
# Host = uri-host [":" port] (RFC 9110 §7.2): reg-name/IPv4 characters, IP-literal
# brackets, the port colon. Deleting the allowed bytes must leave nothing.
_HOST_CHARS = (b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
               b"-._~!$&'()*+,;=:[]%")


def _valid_host(host: bytes) -> bool:
    return not host.translate(None, _HOST_CHARS)


def _check_transfer_coding(te: bytes, has_length: bool, version: str) -> None:
    """RFC 9112 §6.1/§6.3: a request with Transfer-Encoding must end in exactly one
    ``chunked`` (else 400), may not also carry Content-Length (400, smuggling), may not
    be HTTP/1.0 (400); other codings before chunked are not implemented (501)."""
    if has_length:
        raise _Reject(400, "both Content-Length and Transfer-Encoding")
    if version == "1.0":
        raise _Reject(400, "Transfer-Encoding in an HTTP/1.0 request")
    codings = [c.strip().lower() for c in te.split(b",")]
    if codings[-1] != b"chunked" or codings.count(b"chunked") != 1:
        raise _Reject(400, "chunked must be the final transfer coding, once")
    if len(codings) > 1:
        raise _Reject(501, "transfer codings other than chunked are not implemented")


# ----------------------------------------------------------------------------- body


class RequestBody:
    """A request body streamed from the socket (:class:`proxy.request.Body`).

    The connection feeds it from parser callbacks; reading pauses above
    ``BODY_HIGH_WATER`` buffered bytes and resumes when the Handler reads.
    """

    __slots__ = ("length", "trailers", "_conn", "_chunks", "_buffered", "_done", "_error",
                 "_waiter", "_expect", "_discarded", "_discarding")

    def __init__(self, conn: "HTTP1Protocol", length: int | None, expect: bool) -> None:
        self.length = length
        self.trailers: Headers = []
        """The trailer fields of a chunked body, complete once ``read`` returned b""."""
        self._conn = conn
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._done = False
        self._error: BodyError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._expect = expect  # 100 Continue still owed on the first read
        self._discarded = 0
        self._discarding = False

    @property
    def complete(self) -> bool:
        """All body bytes arrived (they may still be buffered)."""
        return self._done

    def feed(self, data: bytes) -> None:
        if self._discarding:
            self._discarded += len(data)
            if self._discarded > DISCARD_LIMIT:
                self._conn.close()
            return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > BODY_HIGH_WATER:
            self._conn.flow.pause_reading(BODY)
        self._wake()

    def end(self) -> None:
        self._done = True
        self._expect = False
        self._wake()

    def fail(self, error: BodyError) -> None:
        if not self._done:
            self._error = error
            self._wake()

    def discard(self) -> bool:
        """Drop what is buffered and swallow the rest as it arrives; False if the rest
        is known to be too large (or was never asked for) — then close instead."""
        self._chunks.clear()
        self._buffered = 0
        self._conn.flow.resume_reading(BODY)
        if self._done:
            return True
        if self._expect or self._error is not None:
            return False  # the client waits for a 100 that will not come
        if self.length is not None and self.length > DISCARD_LIMIT:
            return False
        self._discarding = True
        return True

    async def read(self) -> bytes:
        """Next chunk; ``b""`` at the end; BodyError if the body cannot be completed."""
        while True:
            chunks = self._chunks
            if chunks:
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._buffered = 0
                self._conn.flow.resume_reading(BODY)
                return data
            if self._done:
                return b""
            if self._error is not None:
                raise self._error
            if self._expect:
                self._expect = False
                self._conn.send_continue()
            await self._wait()

    async def _wait(self) -> None:
        loop = self._conn.loop
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(self._conn.settings.body_timeout, self._expire)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _expire(self) -> None:
        self.fail(BodyError("request body timed out"))
        self._conn.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


# ---------------------------------------------------------------------------- cycle

_IDLE, _STARTED, _FINISHED, _UPGRADED = range(4)


class _Cycle:
    """One request/response exchange on a connection; the Handler's Responder.

    Output produced within one loop turn is gathered and written with a single
    ``writelines`` (head + small body in one syscall); large pieces are never joined.
    """

    __slots__ = ("conn", "request", "body", "keep_alive", "aborted", "task", "_state",
                 "_chunked", "_remaining", "_out", "_out_size", "_flush_pending",
                 "_no_body", "_version10")

    def __init__(self, conn: "HTTP1Protocol", request: Request, body: RequestBody | None,
                 keep_alive: bool) -> None:
        self.conn = conn
        self.request = request
        self.body = body
        self.keep_alive = keep_alive
        self.aborted = False
        self.task: asyncio.Task[None] | None = None
        self._state = _IDLE
        self._chunked = False
        self._remaining: int | None = None
        self._out: list[bytes] = []
        self._out_size = 0
        self._flush_pending = False
        self._no_body = False
        self._version10 = request.http_version == "1.0"

    # -- running the Handler

    async def run(self, handle: Handle) -> None:
        request = self.request
        try:
            prepare = self.conn.settings.prepare
            if prepare is not None:
                prepare(request)
            await handle(request, self)
        except asyncio.CancelledError:
            if not self.aborted:
                raise
        except Exception:
            log.exception("handler failed on %s %s", request.method, request.path)
            if self._state == _IDLE and not self.aborted:
                self.keep_alive = False
                self.conn.write(_ERRORS[500])
                self._state = _FINISHED
            elif self._state == _STARTED:
                self.abort()
        else:
            if self._state == _IDLE and not self.aborted:
                log.error("handler returned without answering %s %s",
                          request.method, request.path)
                self.keep_alive = False
                self.conn.write(_ERRORS[500])
                self._state = _FINISHED
            elif self._state == _STARTED:
                self.finish()
        finally:
            self.conn.cycle_done(self)

    # -- Responder

    def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        """Send a complete response; Content-Length is ``len(body)`` — for HEAD and
        304 the Handler's own Content-Length wins (it describes the GET body)."""
        if self.aborted:
            return  # the client is gone (or was already answered): dropped silently
        self._begin(status)
        no_body = self._body_forbidden(status)
        if status == 204:
            headers, dated, _ = _without_framing(headers, False)
            extra = b""
        elif (no_body and _find_length(headers) is not None) or status == 304:
            headers, dated, _ = _without_framing(headers, True)
            extra = b""
        else:
            headers, dated, _ = _without_framing(headers, False)
            extra = b"Content-Length: %d\r\n" % len(body)
        if not dated:
            extra += self.conn.entrance.date_line()
        self._decide_keep_alive()
        head = render_head(status_line(status), headers, extra + self._connection_line())
        self._state = _FINISHED
        if no_body or not body:
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
        self._no_body = no_body = self._body_forbidden(status)
        length = None if status == 204 else _find_length(headers)
        extra = b""
        if length is not None:
            headers, dated, codings = _without_framing(headers, True)
            self._remaining = None if no_body else length
        else:
            headers, dated, codings = _without_framing(headers, False)
            if no_body:
                pass
            elif self._version10:
                self.keep_alive = False  # close-delimited body (RFC 9112 §6.3 item 8)
            else:
                extra = _CHUNKED
                self._chunked = True
        if codings and self._chunked:
            # The body still carries transfer codings (e.g. gzip, from a backend that
            # ended it by closing): announced, with chunked last so its end is clear.
            # (HTTP/1.0 has no transfer codings: RFC 9112 §6.1 forbids the field there,
            # so such a client gets the coded bytes close-delimited, unannounced.)
            extra = b"Transfer-Encoding: " + codings + b", chunked\r\n"
        if not dated:
            extra += self.conn.entrance.date_line()
        self._decide_keep_alive()
        head = render_head(status_line(status), headers, extra + self._connection_line())
        self._state = _STARTED
        self._queue(head)
        self._schedule_flush()

    async def write(self, data: bytes) -> None:
        """Queue body bytes (flushed at the end of this loop turn, or at once past
        ``FLUSH_LIMIT``); waits while the client is slow, aborting after
        ``send_timeout``."""
        if self.aborted:
            return
        if self._state != _STARTED:
            raise RuntimeError("write() outside a started response")
        if self._no_body or not data:
            return
        if self._remaining is not None:
            if len(data) > self._remaining:
                data = data[:self._remaining]  # never send past the declared length
            self._remaining -= len(data)
        if self._chunked:
            self._queue(b"%x\r\n" % len(data))
            self._queue(data)
            self._queue(b"\r\n")
        else:
            self._queue(data)
        if self._out_size >= FLUSH_LIMIT:
            self._flush()
        else:
            self._schedule_flush()
        flow = self.conn.flow
        if flow.write_paused:
            self._flush()
            try:
                await flow.drain(self.conn.settings.send_timeout)
            except (ConnectionError, TimeoutError):
                self.abort()

    def finish(self, trailers: Headers | None = None) -> None:
        if self.aborted:
            return
        if self._state != _STARTED:
            raise RuntimeError("finish() outside a started response")
        self._state = _FINISHED
        if self._remaining:
            log.warning("response to %s %s ended %d bytes short of its Content-Length",
                        self.request.method, self.request.path, self._remaining)
            self.abort()
            return
        if self._chunked:
            # Trailers only for a client that said it takes them (RFC 9110 §6.5: a
            # recipient may drop them otherwise, and this one is that recipient).
            if trailers and accepts_trailers(self.request.header(b"te")):
                self._queue(render_head(b"0\r\n", trailers))
            else:
                self._queue(_LAST_CHUNK)
        self._flush()

    def abort(self) -> None:
        """Drop the connection; later Responder calls are silently ignored."""
        if self._state != _UPGRADED:
            self._state = _FINISHED
        self.aborted = True
        self.keep_alive = False
        self._out.clear()
        self.conn.abort()

    def interim(self, status: int, headers: Headers) -> None:
        """Relay an interim answer (102, 103, ...) before the final one: sent at once
        to an HTTP/1.1 client, never to an HTTP/1.0 one (RFC 9110 §15.2), nor once the
        final answer began. 100 is the entrance's own (see send_continue), 101 is
        :meth:`upgrade`."""
        if (self._version10 or self._state != _IDLE or self.aborted
                or not 102 <= status <= 199):
            return
        self.conn.write(render_head(status_line(status),
                                    _without_framing(headers, False)[0]))

    async def upgrade(self, headers: Headers) -> ByteStream:
        if self._state != _IDLE:
            raise RuntimeError("response already started")
        token = self.request.upgrade
        if token is None:
            raise RuntimeError("the request did not ask for a protocol switch")
        if self.aborted:
            raise ConnectionError("client went away")
        self._state = _UPGRADED
        self.keep_alive = False
        headers = _without_framing(headers, keep_length=False)[0]
        extra = b"Connection: upgrade\r\n"
        if not any(len(n) == 7 and n.lower() == b"upgrade" for n, _ in headers):
            extra += b"Upgrade: " + token.encode("latin-1") + b"\r\n"
        self.conn.write(render_head(status_line(101), headers, extra))
        return self.conn.switch_protocols()

    # -- helpers

    def _begin(self, status: int) -> None:
        if self._state != _IDLE:
            raise RuntimeError("response already started")
        if status < 200:
            raise ValueError("1xx answers are sent by the entrance (101: use upgrade())")

    def _schedule_flush(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            self.conn.loop.call_soon(self._flush)

    def _body_forbidden(self, status: int) -> bool:
        return self.request.method == "HEAD" or status in _NO_BODY_STATUSES

    def _decide_keep_alive(self) -> None:
        """Close after this response unless the rest of the request body can be
        swallowed cheaply (RFC 9112 §9.3: a server may close instead of reading)."""
        body = self.body
        if self.keep_alive and body is not None and not body.complete:
            if body.length is None or body.length > DISCARD_LIMIT or body._expect:
                self.keep_alive = False
        if self.conn.closing:
            self.keep_alive = False

    def _connection_line(self) -> bytes:
        if not self.keep_alive:
            return _CLOSE
        return _KEEP_ALIVE if self._version10 else b""

    def _queue(self, data: bytes) -> None:
        self._out.append(data)
        self._out_size += len(data)

    def _flush(self) -> None:
        self._flush_pending = False
        out = self._out
        if not out or self.aborted:
            return
        if len(out) == 1:
            self.conn.write(out[0])
        elif self._out_size <= COALESCE_LIMIT:
            self.conn.write(b"".join(out))
        else:
            self.conn.writelines(out)
        self._out = []
        self._out_size = 0


def _find_length(headers: Headers) -> int | None:
    for name, value in headers:
        if len(name) == 14 and name.lower() == b"content-length":
            value = value.strip()
            if not value.isdigit():
                raise ValueError(f"invalid Content-Length {value!r}")
            return int(value)
    return None


# Hop-by-hop and framing headers the entrance owns; the Handler's copies are dropped.
_FRAMING = {b"connection", b"keep-alive", b"transfer-encoding", b"proxy-connection"}
_FRAMING_LENGTHS = frozenset(len(name) for name in _FRAMING)


def _without_framing(headers: Headers,
                     keep_length: bool) -> tuple[Headers, bool, bytes | None]:
    """``headers`` minus the entrance-owned ones (and Content-Length unless
    ``keep_length``) — the same list when there is nothing to drop — whether a
    ``Date`` is among them, and the transfer codings other than chunked that a
    dropped ``Transfer-Encoding`` named (None if none). One pass."""
    out: Headers | None = None
    dated = False
    codings: bytes | None = None
    for i, pair in enumerate(headers):
        name = pair[0]
        n = len(name)
        if (n == 14 and not keep_length and name.lower() == b"content-length") or (
                n in _FRAMING_LENGTHS and name.lower() in _FRAMING):
            if out is None:
                out = headers[:i]
            if n == 17:
                codings = transfer_codings(pair[1])[0] or None
        else:
            if n == 4 and name.lower() == b"date":
                dated = True
            if out is not None:
                out.append(pair)
    return (headers if out is None else out), dated, codings


# ----------------------------------------------------------------------- connection

_NO_TIMER, _HEAD_TIMER, _IDLE_TIMER, _LINGER_TIMER = range(4)
LINGER_TIMEOUT = 2.0  # longest wait for a client's EOF after a close-after-answer
LINGER_LIMIT = 256 * 1024  # most bytes read and dropped meanwhile
_NEVER = float("inf")


class _Entrance:
    """What every connection of one listener shares, including one coarse timer.

    Connections keep their header/idle deadline as a number; a sweep every
    ``interval`` seconds closes the expired ones. Re-arming a deadline per request is
    then a float store instead of a timer handle created and cancelled (hot path).
    Deadlines fire up to ``interval`` late: a fifth of the shortest timeout, at most 1 s.
    """

    __slots__ = ("handle", "settings", "connections", "loop", "interval", "draining",
                 "refusals", "_sweeper", "_date_second", "_date_line")

    def __init__(self, handle: Handle, settings: EntranceSettings,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.handle = handle
        self.settings = settings
        self.connections: set[HTTP1Protocol] = set()
        self.loop = loop
        shortest = min(settings.header_timeout, settings.idle_timeout)
        self.interval = min(1.0, max(0.01, shortest / 5))
        self.draining = False
        self.refusals = RateLimit()  # connections refused at max_connections
        self._sweeper: asyncio.TimerHandle | None = None
        self._date_second = -1
        self._date_line = b""

    def date_line(self) -> bytes:
        """The ``Date`` line, CRLF included (RFC 9110 §6.6.1: a proxy adds one to a
        response that lacks it), formatted once per second, not once per response."""
        now = int(time.time())
        if now != self._date_second:
            self._date_second = now
            self._date_line = b"Date: %s\r\n" % formatdate(now, usegmt=True).encode()
        return self._date_line

    def add(self, conn: "HTTP1Protocol") -> None:
        self.connections.add(conn)
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(self.interval, self._sweep)

    def discard(self, conn: "HTTP1Protocol") -> None:
        self.connections.discard(conn)

    def drain(self) -> None:
        """Graceful shutdown of the open connections: idle ones close
        now; every other one ends after the response it is serving, which says
        ``Connection: close`` unless its head already went out. Connections accepted
        later behave the same."""
        self.draining = True
        for conn in list(self.connections):
            conn.drain()

    def _sweep(self) -> None:
        self._sweeper = None
        now = self.loop.time()
        for conn in [c for c in self.connections if c.deadline <= now]:
            conn.timed_out()
        if self.connections:
            self._sweeper = self.loop.call_later(self.interval, self._sweep)


class HTTP1Protocol(GuardedOutput):
    """One client connection of an entrance."""

    def __init__(self, entrance: _Entrance) -> None:
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
        self._cycle: _Cycle | None = None  # the one the Handler is serving
        self._queue: deque[_Cycle | int] = deque()  # pipelined cycles / error statuses
        self._parsing: _Cycle | None = None  # message whose body is being parsed
        self._stream: TransportStream | None = None
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
        self._refusal: _Reject | None = None  # raised by a parser callback (see _feed)
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
        if (cycle is not None and cycle.task is not None and cycle._state < _FINISHED
                and not cycle.task.done()):
            cycle.task.cancel()  # the Handler stops waiting on its backend (client gone: nothing written)
        self._queue.clear()
        # The parser holds bound methods of this protocol, a reference cycle: without
        # this, only the cyclic GC could free a closed connection and all it still
        # refers to (proxy.admin explains why such garbage must not wait for it).
        self._parser = httptools.HttpRequestParser(None)

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()

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
        except _Reject as reject:
            raise self._refuse(reject.status, str(reject))
        if cycle.body is not None:
            self._parsing = cycle
        if self._cycle is None:
            self._start(cycle)
        else:
            self._queue.append(cycle)
            self.flow.pause_reading(PIPELINE)

    def _refuse(self, status: int, detail: str) -> _Reject:
        """The rejection a parser callback raises, recorded for :meth:`_feed`."""
        self._refusal = _Reject(status, detail)
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

    def _build_cycle(self) -> _Cycle:
        """Validate the head just parsed and turn it into a request cycle."""
        parser = self._parser
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            raise _Reject(505, f"HTTP/{version} not supported")
        raw_method = parser.get_method()
        method = _METHODS.get(raw_method) or raw_method.decode("ascii")
        if method == "CONNECT":
            raise _Reject(405, "CONNECT is not served")
        headers = self._headers
        host = None
        hosts = 0
        te = None
        length = 0
        has_length = False
        upgrade = None
        expect = False
        for name, value in headers:
            n = len(name)
            if n == 4:
                if name.lower() == b"host":
                    hosts += 1
                    host = value
            elif n == 17:
                if name.lower() == b"transfer-encoding":
                    te = value if te is None else te + b"," + value
            elif n == 14:
                if name.lower() == b"content-length":
                    length = int(value)  # llhttp checked the digits and uniqueness
                    has_length = True
            elif n == 7:
                if name.lower() == b"upgrade":
                    upgrade = value
            elif n == 6:
                if name.lower() == b"expect" and value.lower() == b"100-continue":
                    expect = version == "1.1"
        if hosts > 1:
            raise _Reject(400, "more than one Host header")
        if host is None and version == "1.1":
            raise _Reject(400, "missing Host header")
        if host is not None and not _valid_host(host):
            raise _Reject(400, "invalid Host header")
        if te is not None:
            _check_transfer_coding(te, has_length, version)
            self._in_chunked = True
        path, query, authority = self._split_target(method)
        if authority is not None:
            host = authority
        wants_upgrade = parser.should_upgrade()
        keep_alive = parser.should_keep_alive() and not self.draining
        body: RequestBody | None = None
        if te is not None or length:
            body = RequestBody(self, None if te is not None else length, expect)
            if wants_upgrade:
                # llhttp would treat the body as the upgraded stream. We ignore the
                # Upgrade (RFC 9110 §7.8 allows it) and re-frame the body ourselves.
                self._reframe = (b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 if te is not None else
                                 b"PUT / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % length)
                wants_upgrade = False
        request = Request(
            method, path, query, (host or b"").decode("latin-1"), headers,
            body if body is not None else EMPTY_BODY, self.settings.name,
            self.client_ip, self.settings.scheme, version,
            upgrade.strip().lower().decode("latin-1") if wants_upgrade and upgrade else None)
        return _Cycle(self, request, body, keep_alive)

    def _split_target(self, method: str) -> tuple[str, str, bytes | None]:
        """(path, query, authority of an absolute-form target or None)."""
        url = self._url
        authority = None
        if url[:1] != b"/":
            if url == b"*":
                if method != "OPTIONS":
                    raise _Reject(400, "asterisk-form target outside OPTIONS")
                return "*", "", None
            lowered = url[:8].lower()
            if lowered.startswith(b"http://"):
                rest = url[7:]
            elif lowered.startswith(b"https://"):
                rest = url[8:]
            else:
                raise _Reject(400, "invalid request target")
            end = len(rest)
            for sep in (b"/", b"?", b"#"):
                at = rest.find(sep)
                if 0 <= at < end:
                    end = at
            authority, url = rest[:end], rest[end:]
            if not authority or b"@" in authority or not _valid_host(authority):
                raise _Reject(400, "invalid authority in request target")
            if url[:1] != b"/":
                url = b"/" + url
        hash_at = url.find(b"#")
        if hash_at >= 0:
            url = url[:hash_at]  # a fragment is never part of the target (RFC 9112 §3.2)
        query_at = url.find(b"?")
        if query_at < 0:
            return url.decode("latin-1"), "", authority
        return (url[:query_at].decode("latin-1"), url[query_at + 1:].decode("latin-1"),
                authority)

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
        if parsing is not None and parsing.task is not None:
            # The Handler already has this request: its body fails and it answers
            # (or already did); the connection ends after that.
            parsing.keep_alive = False
            if parsing.body is not None:
                parsing.body.fail(BodyError(f"malformed request body: {detail}"))
            if self._cycle is None:
                self.close()
            elif parsing._state == _IDLE:
                parsing.aborted = True  # whatever the Handler would say is moot now
                self._send_error(status)
            return
        if parsing is not None:
            self._queue.remove(parsing)  # never seen by the Handler: answer it here
        if self._cycle is None and not self._queue:
            self._send_error(status)
        else:
            self._queue.append(status)

    # -- cycles

    def _start(self, cycle: _Cycle) -> None:
        self._disarm()
        self._cycle = cycle
        cycle.task = self.loop.create_task(cycle.run(self.entrance.handle))

    def cycle_done(self, cycle: _Cycle) -> None:
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
                self._start(item)
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
        if cycle is not None and cycle._state == _IDLE:
            self.write(_CONTINUE)

    def drain(self) -> None:
        """Close now if idle — no request in progress or queued, no byte of a next one
        received — else after the current response (see :meth:`_Entrance.drain`)."""
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
        self.write(_ERRORS[status])
        assert self.transport is not None
        self.transport.close()

    # -- timers

    def _arm(self, kind: int) -> None:
        delay = (self.settings.header_timeout if kind == _HEAD_TIMER
                 else LINGER_TIMEOUT if kind == _LINGER_TIMER
                 else self.settings.idle_timeout)
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


class EntranceServer(asyncio.AbstractServer):
    """A listening entrance: the asyncio server plus :meth:`drain` for the connections
    it accepted. Closing it stops accepting; live connections carry on."""

    def __init__(self, server: asyncio.AbstractServer, entrance: _Entrance) -> None:
        self._server = server
        self._entrance = entrance

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._server.sockets)  # type: ignore[attr-defined]

    def drain(self) -> None:
        """Close idle keep-alive connections now, the others after their current
        response (sent with ``Connection: close``)."""
        self._entrance.drain()

    def close(self) -> None:
        self._server.close()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._server.get_loop()

    def is_serving(self) -> bool:
        return self._server.is_serving()

    async def start_serving(self) -> None:
        await self._server.start_serving()

    async def serve_forever(self) -> None:
        await self._server.serve_forever()

    async def wait_closed(self) -> None:
        await self._server.wait_closed()


async def serve_entrance(
    handle: Handle,
    settings: EntranceSettings,
    *,
    host: str | None = None,
    port: int | None = None,
    path: str | None = None,
    sock: socket.socket | None = None,
    reuse_port: bool = False,
) -> EntranceServer:
    """Listen for HTTP/1.1 on TCP ``host:port``, a unix socket ``path`` (mode 0660,
    a stale socket file is replaced) or an already bound ``sock``; serve with ``handle``.

    Returns the started server; closing it stops accepting (live connections finish),
    ``drain()`` also ends its keep-alive connections gracefully.
    """
    loop = asyncio.get_running_loop()
    entrance = _Entrance(handle, settings, loop)

    def factory() -> HTTP1Protocol:
        return HTTP1Protocol(entrance)

    server: asyncio.AbstractServer
    if path is not None:
        if os.path.exists(path):
            os.unlink(path)
        server = await loop.create_unix_server(factory, path, backlog=1024)
        os.chmod(path, 0o660)
    elif sock is not None:
        server = await loop.create_server(factory, sock=sock, backlog=1024)
    else:
        server = await loop.create_server(
            factory, host, port or 0, backlog=1024, reuse_port=reuse_port or None)
    return EntranceServer(server, entrance)
