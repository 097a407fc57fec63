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
HTTP/2 pool of :mod:`proxy.upstream.h2c`, registered in ``_POOL_TYPES`` (the wire validation
admits no other protocol).
"""

from __future__ import annotations

import asyncio
import fcntl
import ssl
import termios
from typing import TYPE_CHECKING

import httptools

from proxy.flow.control import BODY, FlowControl, GuardedOutput
from proxy.flow.stream import TransportStream
from proxy.upstream.base import (
    BODY_METHODS, Interim, StaleConnection, UpstreamError, expire_head)
from proxy.upstream.response import UpstreamResponse
from proxy.wire.framing import (
    forwardable_trailers, poolable, transfer_codings, valid_status)
from proxy.wire.head import render_head

if TYPE_CHECKING:
    from proxy.upstream.pool import Pool
from proxy.request import Body, BodyError, Headers

COALESCE_LIMIT = 16 * 1024  # request bodies up to this size go out with the head
_CHUNKED = b"Transfer-Encoding: chunked\r\n"
_LENGTH_ZERO = b"Content-Length: 0\r\n"
_LAST_CHUNK = b"0\r\n\r\n"






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
            head.set_exception(StaleConnection() if not self._got_bytes else UpstreamError(
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
                raise StaleConnection()  # closed (or desynchronised) while the body was read
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
            framing = _LENGTH_ZERO if method in BODY_METHODS else b""
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
            timer = self.loop.call_later(timeout, expire_head, head)
        try:
            await head
        finally:
            if timer is not None:
                timer.cancel()

    def _stop_sender(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None and not sender.done():
            sender.cancel()




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

