"""HTTP/2 to backends: cleartext with prior knowledge (h2c), or over TLS with ALPN ``h2``.

``"protocol": "h2c"`` backends (Knative h2c revisions, gRPC services)
speak HTTP/2 with prior knowledge; a BackendTLSPolicy (``tls``) or an ``https`` URL
makes it HTTP/2 over TLS, offered by ALPN. :class:`H2Pool` is the
:class:`proxy.upstream.http1.Pool` for them: the same ``send`` contract, the same
:class:`UpstreamError` reasons (dial / tls / timeout / canceled / other).

- **One connection, many streams.** Every concurrent exchange of a pool is a stream on
  one connection (:class:`_Link`); another connection is opened only when the backend's
  SETTINGS_MAX_CONCURRENT_STREAMS is reached. A connection counts as dialed once the
  backend's SETTINGS arrived (its half of the preface, RFC 9113 §3.4), which proves it
  speaks HTTP/2 and tells how many streams it takes.
- **Bounded memory both ways.** Request bodies go out only as far as the backend's
  flow-control windows allow and the socket drains; response bytes are acknowledged
  (WINDOW_UPDATE) only as the caller reads them, so a stream buffers at most
  ``STREAM_WINDOW`` bytes and a connection at most ``CONNECTION_WINDOW``.
- **Graceful GOAWAY.** RFC 9113 §6.8 lets streams up to the GOAWAY's last stream id
  finish; the h2 library would end the whole connection on GOAWAY (python-hyper/h2
  #1181), so GOAWAY frames are taken out of the byte stream before h2 parses it and
  handled here. No new stream starts on such a connection.
- **One retry.** A stream that ends before any response byte — refused
  (REFUSED_STREAM, or above a GOAWAY's last stream id) or lost with its connection — is
  retried once on a fresh stream when the request has no body and it was either never
  processed (RFC 9113 §8.7) or its method is idempotent (RFC 9110 §9.2.2).
- **Liveness.** TCP keepalive, and a PING after ``PING_AFTER`` seconds without a byte
  from the backend; no answer within ``PING_TIMEOUT`` ends the connection
  (Go's h2c backend limits). Idle connections close after the pool's
  ``idle_timeout``.

HTTP/2 has no ``101`` (RFC 9113 §8.6), so :meth:`H2Response.detach` always refuses.

"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Callable, Final, cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from proxy.flow.buffer import BodyBuffer
from proxy.flow.control import FlowControl
from proxy.request import Body, BodyError, ByteStream, Headers
from proxy.upstream.base import (
    DIAL_TIMEOUT, IDEMPOTENT, IDLE_TIMEOUT, MAX_IDLE, BackendResponse,
    Interim, PoolKey, UpstreamError, expire_head, within_route)
from proxy.upstream.dial import dial_tcp, open_over
from proxy.upstream.liveness import Liveness
from proxy.wire.framing import BODY_METHODS
from proxy.upstream.pool import Pool
from proxy.wire.h2frames import GoAway as _GoAway, GoAwayFilter as _GoAwayFilter
from proxy.wire.h2frames import reset_stream

log = logging.getLogger("tunnelgate.h2c")

STREAM_WINDOW: Final = 256 * 1024  # our SETTINGS_INITIAL_WINDOW_SIZE: response bytes per stream
CONNECTION_WINDOW: Final = 16 * 1024 * 1024  # response bytes buffered per connection, all streams
PING_AFTER: Final = 30.0  # PING after 30 s without a frame from the backend
PING_TIMEOUT: Final = 15.0  # ... and give up on the connection 15 s later
KEEPALIVE: Final = 30  # seconds: TCP keepalive idle time and probe interval

_CANCEL = h2.errors.ErrorCodes.CANCEL
_REFUSED = h2.errors.ErrorCodes.REFUSED_STREAM
# RFC 9113 §8.2.2: connection-specific fields never go out on HTTP/2; Host becomes
# :authority (RFC 9113 §8.3.1); HTTP2-Settings belongs to the HTTP/1.1 Upgrade dance.
_NOT_SENT: Final = frozenset({b"connection", b"keep-alive", b"proxy-connection",
                       b"transfer-encoding", b"upgrade", b"host", b"http2-settings"})
_CONFIG = h2.config.H2Configuration(client_side=True, header_encoding=None)
_LOCAL_SETTINGS: Final = {
    h2.settings.SettingCodes.ENABLE_PUSH: 0,
    h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
    h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 64 * 1024,
}


class _Unanswered(Exception):
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


# ------------------------------------------------------------------------- response


class H2Response:
    """One stream: the request going out, the backend's response coming in.

    A :class:`proxy.upstream.base.BackendResponse`, like the HTTP/1.1 pool's answer;
    HTTP/2 has no reason phrase, so ``reason`` stays empty. ``trailers`` is set once
    the stream ended with a trailing header block (gRPC's ``grpc-status``).
    """

    __slots__ = ("status", "reason", "headers", "length", "trailers", "link", "stream_id",
                 "_head_wait", "_body", "_unacked", "_sender", "_window", "_request_done",
                 "_over", "_abandoned")

    def __init__(self, link: _Link) -> None:
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
        :class:`_Unanswered`, or CancelledError; the stream is reset on any of them."""
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
            head.set_exception(_Unanswered(processed, error))
        else:
            self._body.fail(error)  # ignored by a body that already ended


# ----------------------------------------------------------------------- connection


class _StreamTable:
    """The streams open on one connection, by id, and the backend's frames for them.

    A stream is here from its HEADERS until it is closed for the connection: ended both
    ways or given up (:meth:`forget`), reset by the backend, answered with a head that
    is no response, left out by a GOAWAY (:meth:`refuse_above`) or lost with the
    connection (:meth:`fail_all`). Frames for a stream no longer here are dropped, but
    their DATA is still acknowledged: it counts against the connection's window. When a
    stream leaves on its own, the link is told it may go idle (:meth:`_Link.maybe_idle`).
    """

    __slots__ = ("link", "by_id")

    def __init__(self, link: _Link) -> None:
        self.link = link
        self.by_id: dict[int, H2Response] = {}

    def forget(self, stream: H2Response) -> None:
        """The stream is closed; the connection may go idle."""
        if self.by_id.get(stream.stream_id) is stream:
            del self.by_id[stream.stream_id]
            self.link.maybe_idle()

    def refuse_above(self, last_stream_id: int, error: UpstreamError) -> None:
        """A GOAWAY (RFC 9113 §6.8): the streams above ``last_stream_id`` were never
        processed; they are reset (CANCEL) and fail as such (so any may be retried)."""
        for stream_id in [sid for sid in self.by_id if sid > last_stream_id]:
            self.link.reset(stream_id, _CANCEL)
            self.by_id.pop(stream_id).fail(False, error)

    def fail_all(self, error: UpstreamError) -> None:
        """The connection is lost: every stream fails with ``error``."""
        streams, self.by_id = self.by_id, {}
        for stream in streams.values():
            stream.fail(True, error)

    def wake_all(self) -> None:
        """Every stream's send window may have grown: their senders go on."""
        for stream in self.by_id.values():
            stream.on_window()

    # -- frames in (h2's events, through _STREAM_EVENTS)

    def _on_response(self, event: h2.events.ResponseReceived) -> None:
        stream_id: int = event.stream_id  # type: ignore[assignment]
        stream = self.by_id.get(stream_id)
        if stream is None:
            return
        try:
            stream.on_head(event.headers)  # type: ignore[arg-type]
        except ValueError as exc:
            self.link.reset(stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)
            del self.by_id[stream_id]
            stream.fail(True, UpstreamError("other", f"invalid response from backend: {exc}"))
            self.link.maybe_idle()

    def _on_data(self, event: h2.events.DataReceived) -> None:
        stream = self.by_id.get(event.stream_id)  # type: ignore[arg-type]
        if stream is not None:
            stream.on_data(event.data, event.flow_controlled_length)  # type: ignore[arg-type]
        else:  # a stream given up on: its bytes still count against the connection
            count: int = event.flow_controlled_length  # type: ignore[assignment]
            self.link.acknowledge(event.stream_id, count)  # type: ignore[arg-type]

    def _on_trailers(self, event: h2.events.TrailersReceived) -> None:
        stream = self.by_id.get(event.stream_id)  # type: ignore[arg-type]
        if stream is not None:
            stream.on_trailers(event.headers)  # type: ignore[arg-type]

    def _on_end(self, event: h2.events.StreamEnded) -> None:
        stream = self.by_id.get(event.stream_id)  # type: ignore[arg-type]
        if stream is not None:
            stream.on_end()

    def _on_reset(self, event: h2.events.StreamReset) -> None:
        stream = self.by_id.pop(event.stream_id, None)  # type: ignore[arg-type]
        if stream is None:
            return
        code = event.error_code
        name = code.name if isinstance(code, h2.errors.ErrorCodes) else str(code)
        stream.fail(code != _REFUSED, UpstreamError("other", f"backend reset the stream ({name})"))
        self.link.maybe_idle()

    def _on_window(self, event: h2.events.WindowUpdated) -> None:
        if event.stream_id:
            stream = self.by_id.get(event.stream_id)
            if stream is not None:
                stream.on_window()
        else:  # the connection's window: every stream may send more
            self.wake_all()


class _Link(asyncio.Protocol):
    """One HTTP/2 connection to a backend; its streams are :class:`H2Response`\\ s."""

    def __init__(self, pool: H2Pool) -> None:
        self.pool = pool
        self.scheme = b"https" if pool.over_tls else b"http"
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.flow: FlowControl = None  # type: ignore[assignment]  # set on connect
        self.h2 = h2.connection.H2Connection(_CONFIG)
        self.streams = _StreamTable(self)
        self.ready: asyncio.Future[None] = self.loop.create_future()  # SETTINGS seen
        self.accepting = True  # new streams may start here (no GOAWAY, not closing)
        self.closed = False
        self._filter = _GoAwayFilter()
        # The pool's timings as they are now (H2Pool: set before the first send).
        self._liveness = Liveness(self.loop, ping_after=pool.ping_after,
                                  ping_timeout=pool.ping_timeout,
                                  idle_timeout=pool.idle_timeout, ping=self._ping,
                                  unanswered=self._unanswered, expired=self.shutdown)

    # -- transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport
        self.flow = FlowControl(transport)  # type: ignore[arg-type]
        h2conn = self.h2
        h2conn.local_settings = h2.settings.Settings(client=True,
                                                     initial_values=_LOCAL_SETTINGS)
        h2conn.initiate_connection()
        h2conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self._flush()
        self._liveness.start()

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return  # after our GOAWAY: nothing more is read
        self._liveness.heard()
        try:
            parts = self._filter.feed(data)
        except ValueError as exc:
            self._die(UpstreamError("other", f"HTTP/2 protocol error from backend: {exc}"))
            return
        for part in parts:
            if isinstance(part, bytes):
                self._receive(part)
            else:
                self._go_away(part)
            if self.closed:
                return
        self._flush()

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost fails what is left

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(exc, ssl.SSLError):
            error = UpstreamError("tls", f"TLS failure: {exc}")
        else:
            error = UpstreamError("other", "backend closed the HTTP/2 connection")
        self._die(error)
        self.flow.connection_lost()

    # -- frames in

    def _receive(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._flush()  # h2 queued its GOAWAY
            self._die(UpstreamError("other", f"HTTP/2 protocol error from backend: {exc}"))
            return
        table = self.streams
        for event in events:
            handle = _STREAM_EVENTS.get(type(event))
            if handle is not None:
                handle(table, event)
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                self._on_settings(event)

    def _on_settings(self, event: h2.events.RemoteSettingsChanged) -> None:
        if not self.ready.done():
            self.ready.set_result(None)
        if h2.settings.SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
            self.streams.wake_all()

    def _go_away(self, goaway: _GoAway) -> None:
        """RFC 9113 §6.8: no new streams here; streams above ``last_stream_id`` were
        never processed, the others may still finish."""
        log.debug("%s:%d: GOAWAY (code %d, last stream %d)", self.pool.key.host,
                  self.pool.key.port, goaway.error_code, goaway.last_stream_id)
        self._retire()
        if not self.ready.done():
            self.ready.set_exception(UpstreamError(
                "other", f"backend refused the connection (GOAWAY {goaway.error_code})"))
        self.streams.refuse_above(goaway.last_stream_id, UpstreamError(
            "other", f"backend went away (GOAWAY {goaway.error_code}) "
                     "before processing the request"))
        self.maybe_idle()

    # -- frames out (used by the streams)

    def has_room(self) -> bool:
        """Whether a new stream may start here now."""
        return (self.accepting and
                len(self.streams.by_id) < self.h2.remote_settings.max_concurrent_streams)

    def open_stream(self, stream: H2Response, fields: Headers, end_stream: bool) -> None:
        """Send the HEADERS of a new stream; raises _Unanswered if the connection
        cannot take one after all, UpstreamError if h2 refuses the header block."""
        h2conn = self.h2
        try:
            stream_id = h2conn.get_next_available_stream_id()
            # (pairs, as every Headers; see proxy.request.Header)
            pairs = cast("list[tuple[bytes, bytes]]", fields)
            h2conn.send_headers(stream_id, pairs, end_stream=end_stream)
        except (h2.exceptions.NoAvailableStreamIDError, h2.exceptions.TooManyStreamsError):
            self._retire()
            raise _Unanswered(False, UpstreamError(
                "other", "backend connection takes no more streams")) from None
        except h2.exceptions.ProtocolError as exc:
            raise UpstreamError("other", f"request not expressible in HTTP/2: {exc}") from None
        stream.stream_id = stream_id
        self.streams.by_id[stream_id] = stream
        self._liveness.busy()
        self._flush()

    def room(self, stream_id: int) -> int:
        """Bytes the flow-control windows allow on this stream now (0 when closed)."""
        try:
            return self.h2.local_flow_control_window(stream_id)
        except h2.exceptions.StreamClosedError:
            return 0

    def send_data(self, stream_id: int, data: bytes, room: int) -> bytes:
        """Send up to ``room`` bytes of ``data`` as DATA frames; return the rest."""
        h2conn = self.h2
        frame = h2conn.max_outbound_frame_size
        end = min(room, len(data))
        if end <= frame and end == len(data):
            h2conn.send_data(stream_id, data)
        else:
            view = memoryview(data)
            for start in range(0, end, frame):
                h2conn.send_data(stream_id, view[start:min(start + frame, end)])
        self._flush()
        return data[end:] if end < len(data) else b""

    def end_stream(self, stream_id: int) -> None:
        self.h2.end_stream(stream_id)
        self._flush()

    def acknowledge(self, stream_id: int, count: int) -> None:
        """The caller consumed ``count`` flow-controlled bytes: hand window back."""
        if not self.closed:
            self.h2.acknowledge_received_data(count, stream_id)
            self._flush()

    def reset(self, stream_id: int, code: h2.errors.ErrorCodes) -> None:
        if not self.closed and reset_stream(self.h2, stream_id, code):
            self._flush()

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # -- life cycle

    def maybe_idle(self) -> None:
        """Once no stream is left: close if no new one may start here, else idle."""
        if self.streams.by_id:
            return
        if not self.accepting or self.pool.closing:
            self.shutdown()
        else:
            self._liveness.idle()

    def _retire(self) -> None:
        """Start no new stream here; close once the last one ended."""
        if self.accepting:
            self.accepting = False
            self.pool.drop(self)

    def retire(self) -> None:
        """Pool closing: finish the streams in flight, then close."""
        self._retire()
        self.maybe_idle()

    def shutdown(self) -> None:
        """Close cleanly with a GOAWAY of our own (RFC 9113 §6.8)."""
        if self.closed:
            return
        self._retire()
        try:
            self.h2.close_connection()
            self._flush()
        except h2.exceptions.ProtocolError:
            pass
        self.closed = True
        self._liveness.stop()
        if self.transport is not None:
            self.transport.close()

    def _die(self, error: UpstreamError) -> None:
        """The connection is unusable: fail every stream and drop it at once."""
        if self.streams.by_id:
            log.info("%s:%d: HTTP/2 connection lost with %d streams in flight: %s",
                     self.pool.key.host, self.pool.key.port, len(self.streams.by_id), error)
        self._retire()
        was_closed, self.closed = self.closed, True
        self._liveness.stop()
        if not self.ready.done():
            self.ready.set_exception(error)
        self.streams.fail_all(error)
        if not was_closed and self.transport is not None:
            self.transport.abort()

    def abort(self) -> None:
        """Drop the connection at once, failing what it carries (the dial gave up)."""
        self._die(UpstreamError("other", "HTTP/2 connection given up"))

    # -- liveness (proxy.upstream.liveness)

    def _ping(self) -> None:
        self.h2.ping(b"tgalive?")
        self._flush()

    def _unanswered(self) -> None:
        self._die(UpstreamError("other", "backend did not answer an HTTP/2 PING"))


# h2's per-stream events and their handlers; the link handles the others it needs.
_STREAM_EVENTS: Final[dict[type, Callable[[_StreamTable, h2.events.Event], None]]] = {
    h2.events.ResponseReceived: _StreamTable._on_response,  # type: ignore[dict-item]
    h2.events.DataReceived: _StreamTable._on_data,  # type: ignore[dict-item]
    h2.events.TrailersReceived: _StreamTable._on_trailers,  # type: ignore[dict-item]
    h2.events.StreamEnded: _StreamTable._on_end,  # type: ignore[dict-item]
    h2.events.StreamReset: _StreamTable._on_reset,  # type: ignore[dict-item]
    h2.events.WindowUpdated: _StreamTable._on_window,  # type: ignore[dict-item]
}


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


def _keepalive(sock: socket.socket) -> None:
    """TCP keepalive as Go's dialer sets it for h2c backends."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name in ("TCP_KEEPIDLE", "TCP_KEEPINTVL"):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, KEEPALIVE)


# ---------------------------------------------------------------------------- pool


class H2Pool(Pool):
    """HTTP/2 connections to one backend (see the module docstring).

    Shares :class:`Pool`'s constructor (TLS setup, dial timeout, idle timeout);
    ``max_idle``, ``max_connections`` and the HTTP/1.1 idle list are unused: streams
    share connections. ``ping_after`` / ``ping_timeout`` may be changed before the
    first send.
    """

    def __init__(self, key: PoolKey, *, dial_timeout: float = DIAL_TIMEOUT,
                 max_idle: int = MAX_IDLE, idle_timeout: float = IDLE_TIMEOUT,
                 max_connections: int = 0) -> None:
        super().__init__(key, dial_timeout=dial_timeout, max_idle=max_idle,
                         idle_timeout=idle_timeout, max_connections=max_connections)
        if self._tls is not None:
            self._tls.context.set_alpn_protocols(["h2"])  # TLS + ALPN
        self.ping_after = PING_AFTER
        self.ping_timeout = PING_TIMEOUT
        self._links: list[_Link] = []  # connections that take new streams, oldest first
        self._dialing: asyncio.Future[_Link] | None = None
        self.closing = False  # close() was called: connections end when idle

    @property
    def over_tls(self) -> bool:
        return self._tls is not None

    def state(self) -> dict[str, int]:
        """HTTP/2 connections now: ``idle`` (no stream) and ``busy``, plus ``streams``."""
        busy = sum(1 for link in self._links if link.streams.by_id)
        return {"idle": len(self._links) - busy, "busy": busy,
                "streams": sum(len(link.streams.by_id) for link in self._links)}

    async def send(self, method: str, target: str, headers: Headers, body: Body, *,
                   head_timeout: float | None = None,
                   dial_timeout: float | None = None,
                   interim: Interim | None = None) -> BackendResponse:
        """Send one request as a stream; return once the response head arrived.

        Same contract as :meth:`Pool.send` (the route's timeout bounds waiting for a
        connection too), except that connections are shared by streams and always
        dial with the pool's timeout (``dial_timeout`` is for
        protocol switches, which HTTP/2 cannot do) and interim (1xx) responses are not
        relayed (``interim`` is accepted and unused); ``headers[0]`` is the ``Host`` item
        and becomes ``:authority``. A stream that got no answer is retried once on a fresh
        stream when that is safe (module docstring).
        """
        if self._tls_error is not None:
            raise UpstreamError("tls", self._tls_error)
        retried = False
        where = f"{self.key.host}:{self.key.port}"
        while True:
            link = await within_route(self._link(), head_timeout, self.dial_timeout, where)
            stream = H2Response(link)
            try:
                await stream.exchange(method, target, headers, body,
                                      self.head_timeout if head_timeout is None
                                      else head_timeout)
                return stream
            except _Unanswered as exc:
                if (retried or body.length != 0
                        or (exc.processed and method not in IDEMPOTENT)):
                    exc.error.unanswered = True  # (a connection error to retries)
                    raise exc.error from None
                log.debug("%s:%d: stream unanswered (%s), retrying once",
                          self.key.host, self.key.port, exc.error)
                retried = True

    async def _link(self) -> _Link:
        """A connection with room for one more stream, dialed if none has any. Dials
        are shared: a burst of requests waits for one new connection, not one each."""
        while True:
            for link in self._links:
                if link.has_room():
                    return link
            dialing = self._dialing
            if dialing is None:
                dialing = self._dialing = asyncio.ensure_future(self._open())
                dialing.add_done_callback(self._dialed)
            link = await asyncio.shield(dialing)
            if not link.accepting or link.h2.remote_settings.max_concurrent_streams == 0:
                raise UpstreamError("other", "backend takes no streams on a new connection")

    def _dialed(self, dialing: asyncio.Future[_Link]) -> None:
        self._dialing = None
        if not dialing.cancelled():
            dialing.exception()  # retrieved: every waiter gets it through the shield

    async def _open(self) -> _Link:
        """Dial, TLS (ALPN h2), and wait for the backend's SETTINGS."""
        loop = asyncio.get_running_loop()
        key = self.key
        where = f"{key.host}:{key.port}"
        sock = await dial_tcp(loop, key, self.dial_timeout)
        _keepalive(sock)
        _, link = await open_over(loop, key, self._tls, lambda: _Link(self), sock,
                                  self.dial_timeout)
        try:
            async with asyncio.timeout(self.dial_timeout):
                await link.ready
        except TimeoutError:
            link.abort()
            raise UpstreamError("other", f"{where} sent no HTTP/2 SETTINGS "
                                         "(does it speak h2c?)") from None
        except BaseException:
            link.abort()
            raise
        self._links.append(link)
        return link

    def drop(self, link: _Link) -> None:
        """A connection stopped taking new streams."""
        try:
            self._links.remove(link)
        except ValueError:
            pass

    def close_idle(self) -> None:
        """Close every connection without streams in flight."""
        for link in list(self._links):
            if not link.streams.by_id:
                link.shutdown()

    def close(self) -> None:
        """Stop pooling: idle connections close now, busy ones after their streams."""
        self.closing = True
        for link in list(self._links):
            link.retire()


