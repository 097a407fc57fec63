"""One HTTP/2 stream to a backend (:class:`H2Response`): the request going out, the
response coming in, and the request's header block (:func:`request_fields`).

The connection that carries it is :class:`proxy.upstream.h2link.Link`; the pool is
:class:`proxy.upstream.h2c.H2Pool`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final, cast

import h2.errors

from proxy.flow.buffer import BodyBuffer
from proxy.request import Body, BodyError, ByteStream, Headers
from proxy.upstream.base import UpstreamError, expire_head
from proxy.wire.framing import BODY_METHODS

if TYPE_CHECKING:
    from proxy.upstream.h2link import Link

_CANCEL = h2.errors.ErrorCodes.CANCEL
# RFC 9113 §8.2.2: connection-specific fields never go out on HTTP/2; Host becomes
# :authority (RFC 9113 §8.3.1); HTTP2-Settings belongs to the HTTP/1.1 Upgrade dance.
_NOT_SENT: Final = frozenset({b"connection", b"keep-alive", b"proxy-connection",
                       b"transfer-encoding", b"upgrade", b"host", b"http2-settings"})


class Unanswered(Exception):
    """A stream ended before any response byte; ``processed`` is False when the backend
    guarantees it never acted on the request (so any method may be retried)."""

    def __init__(self, processed: bool, error: UpstreamError) -> None:
        super().__init__(str(error))
        self.processed = processed
        self.error = error


def request_fields(method: str, scheme: bytes, target: str, headers: Headers,
                   length: int | None) -> Headers:
    """The HTTP/2 header block of a request (RFC 9113 §8.3.1, §8.2.2).

    Pseudo-headers first; ``:authority`` from the leading ``Host`` item the caller
    passes; names lower-cased; connection-specific fields dropped and ``TE`` kept only
    as ``trailers`` (always sent for gRPC, ``content-type: application/grpc*``);
    ``content-length`` from the body's declared length (as the
    HTTP/1.1 pool frames it).
    """
    authority = headers[0][1] if headers and headers[0][0].lower() == b"host" else b""
    fields: Headers = [(b":method", method.encode("ascii")), (b":scheme", scheme),
                       (b":authority", authority), (b":path", target.encode("latin-1"))]
    te_trailers = False
    for name, value in headers:
        lname = name.lower()
        if lname in _NOT_SENT or lname == b"content-length":
            continue
        if lname == b"te":
            te_trailers = te_trailers or b"trailers" in (
                token.strip() for token in value.lower().split(b","))
            continue
        if lname == b"content-type" and value[:16].lower() == b"application/grpc":
            # gRPC over HTTP/2 requires "te: trailers" on every request (servers such
            # as grpc-go refuse one without it). The client may not have sent it: an
            # HTTP/1.1 hop (cloudflared, the edge) does not pass hop-by-hop TE on.
            te_trailers = True
        fields.append((lname, value))
    if te_trailers:
        fields.append((b"te", b"trailers"))
    if length or (length == 0 and method in BODY_METHODS):
        fields.append((b"content-length", b"%d" % length))
    return fields


class H2Response:
    """One stream: the request going out, the backend's response coming in.

    A :class:`proxy.upstream.base.BackendResponse`, like the HTTP/1.1 pool's answer;
    HTTP/2 has no reason phrase, so ``reason`` stays empty. ``trailers`` is set once
    the stream ended with a trailing header block (gRPC's ``grpc-status``).
    """

    __slots__ = ("status", "reason", "headers", "length", "trailers", "link", "stream_id",
                 "_head_wait", "_body", "_unacked", "_sender", "_window", "_request_done",
                 "_over", "_abandoned")

    def __init__(self, link: "Link") -> None:
        self.status = 0
        self.reason = ""
        self.headers: Headers = []
        self.length: int | None = None
        self.trailers: Headers = []
        self.link = link
        self.stream_id = 0
        self._head_wait: asyncio.Future[None] = link.loop.create_future()
        # The stream window bounds what is buffered; every read hands the bytes taken
        # back to the backend as window (high water 0: each take drains). The buffer is
        # done once END_STREAM arrived (or close() gave up on the response).
        self._body: BodyBuffer[bytes] = BodyBuffer(0, on_drained=self._acknowledge)
        self._unacked = 0  # flow-controlled bytes received, not yet handed to the caller
        self._sender: asyncio.Future[None] | None = None
        self._window: asyncio.Future[None] | None = None  # the sender awaits window
        self._request_done = False  # END_STREAM sent
        self._over = False  # the stream is closed for the link (no more frames)
        self._abandoned = False  # close() was called

    # -- the caller's side

    async def read(self) -> bytes:
        """Next body bytes; ``b""`` at the end. Raises UpstreamError (``other``) when
        the backend breaks off the body. Reading hands window back to the backend."""
        try:
            return await self._body.read()
        except asyncio.CancelledError:
            self.close()  # a reader that leaves must not pin a stream slot
            raise

    @property
    def failed(self) -> UpstreamError | None:
        """The stream's fault, if it already has one (see
        :attr:`proxy.upstream.base.BackendResponse.failed`)."""
        # Only UpstreamErrors ever fail the body buffer (fail(), _sender_done).
        return cast("UpstreamError | None", self._body.error)

    def whole_body(self) -> bytes | None:
        """The entire body if the stream already ended cleanly and nothing was read
        yet, else None (then :meth:`read` streams it)."""
        body = self._body
        if not body.done or self._abandoned:
            return None
        data = body.take()
        return b"" if data is None else data

    def detach(self) -> ByteStream:
        """Refused: HTTP/2 cannot switch protocols (RFC 9113 §8.6)."""
        raise UpstreamError("other", "protocol switch over HTTP/2 backends is not supported")

    def close(self) -> None:
        """Give up on the response: an unfinished stream is reset with CANCEL."""
        self._abandoned = True
        self._body.clear()
        # What was not read (or arrived after a failure) goes back as window.
        self._acknowledge()
        self._body.end()  # a reader still waiting gets b""
        self._cancel()

    def _cancel(self) -> None:
        """RST_STREAM CANCEL unless the stream is already over; stop the sender."""
        self._stop_sender()
        if not self._over:
            self._over = True
            if self.stream_id:
                self.link.reset(self.stream_id, _CANCEL)
                self.link.streams.forget(self)
        _wake(self._window)

    # -- the exchange

    async def exchange(self, method: str, target: str, headers: Headers, body: Body,
                       head_timeout: float | None) -> None:
        """Open the stream, send the body, wait for the response head (its deadline
        starts once the body was sent). Raises UpstreamError,
        :class:`Unanswered`, or CancelledError; the stream is reset on any of them."""
        link = self.link
        length = body.length
        fields = request_fields(method, link.scheme, target, headers, length)
        link.open_stream(self, fields, end_stream=length == 0)
        head = self._head_wait
        try:
            if length == 0:
                self._request_done = True
            else:
                await self._start_body(body, head)
            if not head.done():
                await _wait_head(link.loop, head, head_timeout)
            head.result()
        except BaseException as exc:
            self.close()
            if isinstance(exc, BodyError):
                raise UpstreamError("canceled", f"request body failed: {exc}") from None
            raise

    async def _start_body(self, body: Body, head: asyncio.Future[None]) -> None:
        """Stream the body in a task of its own: a backend may answer before reading
        it all (gRPC server streaming, early errors), and then the body goes on."""
        sender = self._sender = asyncio.ensure_future(self._send_body(body))
        await asyncio.wait((sender, head), return_when=asyncio.FIRST_COMPLETED)
        if sender.done():
            sender.result()  # a BodyError surfaces here
        else:
            sender.add_done_callback(self._sender_done)

    async def _send_body(self, body: Body) -> None:
        link = self.link
        while chunk := await body.read():
            while chunk:
                if self._over:
                    return
                room = link.room(self.stream_id)
                if room <= 0:
                    await self._wait_window()
                    continue
                chunk = link.send_data(self.stream_id, chunk, room)
                if link.flow.write_paused:
                    try:
                        await link.flow.drain()
                    except ConnectionError:
                        return
        if not self._over:
            link.end_stream(self.stream_id)
            self._request_done = True
            self._settle()

    def _sender_done(self, sender: asyncio.Future[None]) -> None:
        if sender.cancelled():
            return
        exc = sender.exception()
        if isinstance(exc, BodyError):
            # The client's body broke off after the response head: the request is
            # incomplete, so is the answer — the reader must see a failure, not an end.
            self._cancel()
            self._body.fail(UpstreamError("canceled", f"request body failed: {exc}"))

    async def _wait_window(self) -> None:
        waiter = self._window = self.link.loop.create_future()
        try:
            await waiter
        finally:
            self._window = None

    def _stop_sender(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None and not sender.done():
            sender.cancel()

    def _acknowledge(self) -> None:
        count, self._unacked = self._unacked, 0
        if count:
            self.link.acknowledge(self.stream_id, count)

    def _settle(self) -> None:
        """Both directions ended: the stream is closed (its unread bytes stay here)."""
        if self._body.done and self._request_done and not self._over:
            self._over = True
            self.link.streams.forget(self)

    # -- fed by the link

    def on_head(self, fields: Headers) -> None:
        """The response head; raises ValueError for a missing or malformed
        ``:status`` (the link then resets the stream)."""
        status = 0
        headers: Headers = []
        for name, value in fields:
            if name[:1] == b":":
                if name == b":status" and len(value) == 3 and value.isdigit():
                    status = int(value)
                continue
            if name == b"content-length":
                self.length = int(value)  # h2 validated it (RFC 9113 §8.1.1)
            headers.append((name, value))
        if status < 200:
            raise ValueError("no valid :status")  # 1xx come as informational events
        self.status = status
        self.headers = headers
        if not self._head_wait.done():
            self._head_wait.set_result(None)

    def on_data(self, data: bytes, flow_length: int) -> None:
        self._unacked += flow_length
        if self._abandoned or not data:
            self._acknowledge()  # padding only, or nobody will read it
            return
        self._body.feed(data)

    def on_trailers(self, fields: Headers) -> None:
        self.trailers = [(name, value) for name, value in fields if name[:1] != b":"]

    def on_end(self) -> None:
        self._body.end()
        self._settle()

    def on_window(self) -> None:
        _wake(self._window)

    def fail(self, processed: bool, error: UpstreamError) -> None:
        """The stream is gone (reset, refused, or its connection ended). A complete
        response stays readable: only the request body stops (RFC 9113 §8.1)."""
        self._over = True
        _wake(self._window)
        head = self._head_wait
        if not head.done():
            head.set_exception(Unanswered(processed, error))
        else:
            self._body.fail(error)  # ignored by a body that already ended


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


async def _wait_head(loop: asyncio.AbstractEventLoop, head: asyncio.Future[None],
                     timeout: float | None) -> None:
    timer = loop.call_later(timeout, expire_head, head) if timeout is not None else None
    try:
        await head
    finally:
        if timer is not None:
            timer.cancel()
