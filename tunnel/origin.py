"""cloudflared's OriginProxy / ResponseWriter contract and its bridge into the Handler.

cloudflared hands every edge request to an *origin proxy* together with a
*response writer*. We don't speak the edge protocol, so the writers here stand in for
the two transports cloudflared would give us and record what they would have put on
the wire into a :class:`RecordedResponse`:

- :class:`Http2TransportWriter` — user headers packed into the
  ``cf-cloudflared-response-headers`` blob with control prefixes dropped, ``101`` sent
  as ``200``, hijack only after the status, trailers only after the status;
- :class:`QuicTransportWriter` — headers as they are, ``101`` kept, trailers dropped.

:class:`OriginProxy` adapts a :class:`TunnelRequest` into a ``proxy.request.Request``
(entrance ``tunnel``, the sidecar trust rules applied) and the writer into a
``proxy.request.Responder``, so a bridged request and a socket request take the same
path through ``routing`` and the Handler. :class:`Bridge` is the one-call entry point
for tests and load-test harnesses.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import AsyncIterable, Callable, Final, Protocol, Sequence

from proxy.flow.buffer import BodyBuffer
from proxy.request import (
    EMPTY_BODY, Body, BodyError, BytesBody, ByteStream, Handle, Headers, Piece,
    Request, Responder)
from routing.model import TUNNEL
from tunnel import headers as blob
from tunnel.headers import encode_bytes, is_control_lowered
from tunnel import sidecar

log = logging.getLogger("tunnelgate.tunnel")

STATUS_NOT_WRITTEN: Final = "status not yet written before attempting to hijack connection"
TRACING_HEADER: Final = b"cf-int-cloudflared-tracing"
# cloudflared flushes every write of a response with one of these content types, or
# without a Content-Length, or chunked (cloudflared flushes those per write).
_STREAMING_TYPES: Final = (b"text/event-stream", b"application/grpc", b"application/x-ndjson")
_WEBSOCKET_HEADERS: Headers = [
    (b"Connection", b"Upgrade"), (b"Upgrade", b"websocket"),
    (b"Sec-WebSocket-Version", b"13")]
_STREAM_HIGH_WATER: Final = 64 * 1024
_RESPONSE_HEADERS: Final = blob.RESPONSE_HEADERS.encode("ascii")
_RESPONSE_META: Final = blob.RESPONSE_META.encode("ascii")
_META_ORIGIN: Final = blob.META_ORIGIN.encode("ascii")


class WriterError(Exception):
    """The response writer refused an operation (e.g. hijack before the status)."""


class HijackedError(WriterError):
    """The connection was already hijacked (Go's ``http.ErrHijacked``)."""

    def __init__(self) -> None:
        super().__init__("http: connection has been hijacked")


class OriginError(Exception):
    """The origin did not produce a complete response; cloudflared resets the stream."""


class TCPNotSupported(Exception):
    """Raw TCP (WARP) streams are not served by tunnelgate."""


class ResponseWriter(Protocol):
    """What cloudflared gives the origin proxy to answer one request with."""

    def write_resp_headers(self, status: int, headers: Headers) -> None:
        """Send the status line and headers; later calls are ignored with a warning."""
        ...

    def add_trailer(self, name: bytes, value: bytes) -> None:
        """Queue a trailer to follow the body (only after the status was written)."""
        ...

    async def write(self, data: bytes) -> None:
        """Send body bytes (an implicit ``200`` first if no status was written)."""
        ...

    def flush(self) -> None:
        """Push buffered body bytes out now."""
        ...

    def hijack(self) -> ByteStream:
        """Take over the raw stream (WebSocket after the 101)."""
        ...

    def write_error_response(self) -> bool:
        """cloudflared's own 502 when the origin failed before any status; False after."""
        ...


class RecordedResponse:
    """What a recording writer put on the wire, for tests and the load-test harness.

    ``status`` and ``wire_headers`` are as the transport carries them (so a 101 reads
    ``200`` on HTTP/2 and the headers hide in the blob); :meth:`headers` returns what
    the eyeball sees. ``stream`` is the *edge* end of a hijacked connection: write what
    the client sends, read what the origin answers. ``error`` is what ``proxy_http``
    raised, if anything; ``completion`` finishes when ``proxy_http`` has returned (for
    an upgrade, when the piped session is over).
    """

    def __init__(self, transport: str) -> None:
        self.transport = transport
        self.status: int | None = None
        self.wire_headers: Headers = []
        self.chunks: list[bytes] = []
        self.flushes = 0
        self.trailers: Headers = []
        self.stream: ByteStream | None = None
        self.error: BaseException | None = None
        self.completion: asyncio.Future[None] | None = None
        self._hijacked: asyncio.Event | None = None

    @property
    def hijacked(self) -> asyncio.Event:
        """Set once the connection was hijacked (made when first asked for: most
        responses are never waited on for that)."""
        if self._hijacked is None:
            self._hijacked = asyncio.Event()
        return self._hijacked

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def headers(self) -> Headers:
        """The response headers the client sees (the HTTP/2 blob decoded)."""
        if self.transport != "http2":
            return list(self.wire_headers)
        packed = self.wire_header(_RESPONSE_HEADERS)
        return blob.decode_bytes(packed.decode("ascii")) if packed is not None else []

    def header(self, name: bytes) -> bytes | None:
        """First value of a client-visible header, by case-insensitive name."""
        return next((v for n, v in self.headers() if n.lower() == name.lower()), None)

    def wire_header(self, name: bytes) -> bytes | None:
        """First value of a header as the transport carried it."""
        return next((v for n, v in self.wire_headers if n.lower() == name.lower()), None)


class _Channel:
    """One direction of an in-memory stream: bounded buffer, end of stream, abandonment.

    A writer waits before writing while ``high_water`` bytes are buffered (so a write
    is never split), and goes on as soon as the reader took them.
    """

    def __init__(self, high_water: int) -> None:
        # BodyBuffer reports "full" once its bytes pass its mark; the channel is full
        # once they reach high_water.
        self._buffer: BodyBuffer[bytes] = BodyBuffer(high_water - 1, self._block,
                                                    self._unblock)
        self._room: asyncio.Future[None] | None = None  # set while the buffer is full

    async def put(self, data: bytes) -> None:
        buffer = self._buffer
        while self._room is not None and not buffer.done:
            await asyncio.shield(self._room)
        # After the end (the reader is gone) the buffer drops the data, like Responder
        # writes after an abort.
        buffer.feed(bytes(data))

    async def get(self) -> bytes:
        return await self._buffer.read()

    def end(self) -> None:
        """No more data will come: the reader drains what is buffered, then sees EOF."""
        self._buffer.end()
        self._unblock()

    def abandon(self) -> None:
        """The reader went away: buffered and future data are dropped."""
        self._buffer.clear()
        self.end()

    def _block(self) -> None:
        self._room = asyncio.get_running_loop().create_future()

    def _unblock(self) -> None:
        room, self._room = self._room, None
        if room is not None and not room.done():
            room.set_result(None)


class _StreamEnd:
    """One end of an in-memory duplex :class:`~proxy.request.ByteStream`."""

    def __init__(self, inbound: _Channel, outbound: _Channel) -> None:
        self._inbound = inbound
        self._outbound = outbound

    async def read(self) -> bytes:
        return await self._inbound.get()

    async def write(self, data: bytes) -> None:
        await self._outbound.put(data)

    def close(self) -> None:
        self._outbound.end()
        self._inbound.abandon()


def stream_pair(high_water: int = _STREAM_HIGH_WATER) -> tuple[ByteStream, ByteStream]:
    """Two connected in-memory stream ends; each write waits while the peer is behind."""
    a_to_b, b_to_a = _Channel(high_water), _Channel(high_water)
    return _StreamEnd(b_to_a, a_to_b), _StreamEnd(a_to_b, b_to_a)


def should_flush(headers: Headers) -> bool:
    """cloudflared's HTTP/2 per-write flush rule for a response with these headers."""
    length = chunked = False
    for name, value in headers:
        lname = name.lower()
        if lname == b"content-length":
            length = True
        elif lname == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif lname == b"content-type" and value.lower().startswith(_STREAMING_TYPES):
            return True
    return chunked or not length


class _RecordingWriter(abc.ABC):
    """Shared plumbing of the two transports: status, body, flushes, hijack."""

    transport = ""

    def __init__(self, record: RecordedResponse, *, flush_always: bool = False) -> None:
        self.record = record
        self.status_written = False
        self._flush_always = flush_always
        self._flush_each = flush_always
        self._origin_end: ByteStream | None = None

    def _send_status(self, status: int, wire_headers: Headers) -> None:
        self.record.status = status
        self.record.wire_headers = wire_headers
        self.status_written = True

    def _refuse_headers(self) -> bool:
        """True (with a warning) when headers can no longer be written."""
        if self._origin_end is not None or self.status_written:
            log.warning("%s writer: response headers written twice or after hijack; "
                        "ignored", self.transport)
            return True
        return False

    async def write(self, data: bytes) -> None:
        if self._origin_end is not None:
            raise HijackedError()
        if not self.status_written:
            self.write_resp_headers(200, [])
        self.record.chunks.append(bytes(data))
        if self._flush_each:
            self.flush()

    def flush(self) -> None:
        self.record.flushes += 1

    @abc.abstractmethod
    def write_resp_headers(self, status: int, headers: Headers) -> None:
        """Send the status and headers the way this transport does."""

    def _open_stream(self) -> ByteStream:
        origin_end, edge_end = stream_pair()
        self._origin_end = origin_end
        self.record.stream = edge_end
        self.record.hijacked.set()
        return origin_end


class Http2TransportWriter(_RecordingWriter):
    """cloudflared's HTTP/2-transport response writer semantics (cloudflared's connection package)."""

    transport = "http2"

    def write_resp_headers(self, status: int, headers: Headers) -> None:
        if self._refuse_headers():
            return
        wire: Headers = []
        user: Headers = []
        for pair in headers:
            lname = pair[0].lower()
            if lname == b"content-length":
                wire.append((b"content-length", pair[1]))  # the edge reads it as HTTP/2
            if lname == TRACING_HEADER:
                wire.append(pair)  # travels outside the blob
            elif not is_control_lowered(lname):
                user.append(pair)
        wire.append((_RESPONSE_HEADERS, encode_bytes(user)))
        wire.append((_RESPONSE_META, _META_ORIGIN))
        self._flush_each = self._flush_always or should_flush(headers)
        # HTTP/2 has no 101; the edge turns the 200 back into 101 for the client.
        self._send_status(200 if status == 101 else status, wire)

    def add_trailer(self, name: bytes, value: bytes) -> None:
        if not self.status_written:
            log.warning("http2 writer: trailer %r before the status; ignored", name)
            return
        self.record.trailers.append((name, value))

    def hijack(self) -> ByteStream:
        if not self.status_written:
            raise WriterError(STATUS_NOT_WRITTEN)
        if self._origin_end is not None:
            raise HijackedError()
        return self._open_stream()

    def write_error_response(self) -> bool:
        if self.status_written:
            return False
        self._send_status(502, [(_RESPONSE_META, blob.META_CLOUDFLARED.encode())])
        return True


class QuicTransportWriter(_RecordingWriter):
    """cloudflared's QUIC-transport semantics: plain metadata, 101 kept, no trailers."""

    transport = "quic"

    def write_resp_headers(self, status: int, headers: Headers) -> None:
        if not self._refuse_headers():
            self._send_status(status, list(headers))

    def add_trailer(self, name: bytes, value: bytes) -> None:
        """Dropped: the QUIC transport has no trailers (gRPC breaks)."""

    def hijack(self) -> ByteStream:
        return self._origin_end if self._origin_end is not None else self._open_stream()

    def write_error_response(self) -> bool:
        if self.status_written:
            return False
        self._send_status(502, [])
        return True


@dataclass(slots=True)
class TunnelRequest:
    """A request as cloudflared hands it over.

    ``url`` is absolute (``https://app.example.com/p?q``) or origin-form (``/p?q``);
    without an authority the ``Host`` header is used, and without either cloudflared's
    default ``localhost:8080``. Names and values may be ``str`` (UTF-8) or
    ``bytes``. ``body`` is the whole body or an async iterator of chunks; with an
    iterator, a ``Content-Length`` header declares the length and is enforced.
    ``client_ip`` is the edge connection's peer, unknown (``None``) over QUIC.
    """

    method: str
    url: str
    headers: Sequence[tuple[str | bytes, str | bytes]] = ()
    body: bytes | AsyncIterable[bytes] = b""
    client_ip: str | None = None


class _IteratorBody:
    """A request body fed from an async iterator, its declared length enforced."""

    def __init__(self, chunks: AsyncIterable[bytes], length: int | None) -> None:
        self._chunks = chunks.__aiter__()
        self.length = length
        self._seen = 0
        self._done = False

    async def read(self) -> bytes:
        while not self._done:
            try:
                chunk = bytes(await anext(self._chunks))
            except StopAsyncIteration:
                self._done = True
                if self.length is not None and self._seen != self.length:
                    raise BodyError(f"body ended after {self._seen} of {self.length} bytes")
                return b""
            except Exception as err:  # whatever the producer raised ends the body
                self._done = True
                raise BodyError(f"request body source failed: {err!r}") from err
            self._seen += len(chunk)
            if self.length is not None and self._seen > self.length:
                self._done = True
                raise BodyError(f"body longer than its Content-Length {self.length}")
            if chunk:
                return chunk
        return b""


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode("utf-8") if isinstance(text, str) else text


def _split_url(url: str) -> tuple[str, str, str, str]:
    """``(scheme, authority, path, query)`` of an absolute or origin-form URL, raw."""
    scheme, sep, rest = ("", "", url) if url.startswith("/") else url.partition("://")
    if not sep:
        scheme, authority, rest = "", "", url
    else:
        cut = len(rest)
        for mark in ("/", "?"):
            at = rest.find(mark)
            if 0 <= at < cut:
                cut = at
        authority, rest = rest[:cut], rest[cut:]
    if "#" in rest:
        rest = rest[:rest.find("#")]
    query = ""
    if "?" in rest:
        at = rest.find("?")
        rest, query = rest[:at], rest[at + 1:]
    return scheme.lower(), authority, rest or "/", query


def _content_length(headers: Headers) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


def _unbroken(field: str | bytes) -> bool:
    """No CR, LF or NUL in ``field``. Nearly every text is printable, which one C call
    tells; only the others (a tab, say) are searched (ints in bytes: a memchr each)."""
    if isinstance(field, str):
        return field.isprintable() or not ("\r" in field or "\n" in field or "\0" in field)
    return not (13 in field or 10 in field or 0 in field)


def _refuse_line_breaks(treq: TunnelRequest) -> None:
    """Raise :class:`OriginError` for a CR, LF or NUL in the method, the URL or a header.

    Every other source of header fields is checked where it enters (llhttp on HTTP/1.1
    connections, h2 for HTTP/2 backends, the config validator), and a rendered head is
    only scanned for LF; a tunnel request is the one source parsed by neither.
    cloudflared's own HTTP/2 framing cannot carry such bytes, so this never refuses
    real traffic: it keeps a caller of the bridge from splitting a head on the wire.
    """
    if not (_unbroken(treq.method) and _unbroken(treq.url)):
        raise OriginError("a tunnel request's method or URL holds CR, LF or NUL")
    for name, value in treq.headers:
        if not (_unbroken(name) and _unbroken(value)):
            raise OriginError("a tunnel request header holds CR, LF or NUL")


def to_request(treq: TunnelRequest, is_websocket: bool) -> Request:
    """The Handler's view of a tunnel request (before the trust rules run).

    ``is_websocket`` re-adds the upgrade headers cloudflared strips and drops the body,
    as cloudflared does before dialing a sidecar origin .
    """
    _refuse_line_breaks(treq)
    scheme, authority, path, query = _split_url(treq.url)
    headers: Headers = [(_as_bytes(n), _as_bytes(v)) for n, v in treq.headers]
    host = authority or next(
        (v.decode("latin-1") for n, v in headers if n.lower() == b"host"), "localhost:8080")
    body: Body
    if is_websocket:
        replaced = {name.lower() for name, _ in _WEBSOCKET_HEADERS}
        headers = [h for h in headers if h[0].lower() not in replaced] + _WEBSOCKET_HEADERS
        body, upgrade = EMPTY_BODY, "websocket"
    else:
        upgrade = None
        if isinstance(treq.body, (bytes, bytearray)):
            body = BytesBody(bytes(treq.body)) if treq.body else EMPTY_BODY
        else:
            body = _IteratorBody(treq.body, _content_length(headers))
    return Request(
        treq.method, path, query, host, headers, body, TUNNEL, client_ip=treq.client_ip,
        scheme="https" if scheme in ("https", "wss") else "http", upgrade=upgrade)


class WriterResponder(Responder):
    """A ``proxy.request.Responder`` that answers through a :class:`ResponseWriter`.

    The responder's calls are synchronous but writer writes are not: pushed body bytes
    are queued and written by a pump task once something flushes them (a streamed
    answer keeps streaming), and whatever is left — the whole body of an answer that
    arrived at once, the body of ``respond``, the trailers — by :meth:`complete`,
    which the origin proxy awaits after the Handler is done.
    """

    def __init__(self, writer: ResponseWriter, *, head_only: bool = False) -> None:
        self.writer = writer
        self.aborted = False
        self.relays_interim = False
        self._head_only = head_only
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._pump: asyncio.Task[None] | None = None
        self._on_writable: Callable[[], None] | None = None
        self._trailers: Headers = []
        self._ended = False
        self._broken = False

    def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        framed = [h for h in headers
                  if h[0].lower() not in (b"content-length", b"transfer-encoding")]
        framed.append((b"Content-Length", str(len(body)).encode("ascii")))
        self.writer.write_resp_headers(status, framed)
        if body and not self._head_only:
            self.push(body)
        self._ended = True

    def start(self, status: int, headers: Headers) -> None:
        self.writer.write_resp_headers(status, headers)

    def interim(self, status: int, headers: Headers) -> None:
        """Never called (``relays_interim``): a ResponseWriter has no call for an
        interim answer, only the final head."""

    def push(self, data: Piece) -> None:
        if self.aborted or not data:
            return
        # Kept until the writer task sends it, and the writer takes bytes.
        self._queue.append(data if isinstance(data, bytes) else bytes(data))
        self._queued += len(data)

    def flush(self) -> None:
        if self._queue and self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(self._write_queued())

    @property
    def congested(self) -> bool:
        return self._queued > _STREAM_HIGH_WATER

    def when_writable(self, callback: Callable[[], None]) -> None:
        self._on_writable = callback
        self.flush()

    async def write(self, data: bytes) -> None:
        if self.aborted or not data:
            return
        try:
            await self.writer.write(data)
        except (WriterError, ConnectionError):
            self.aborted = True

    def finish(self, trailers: Headers | None = None) -> None:
        # Trailers are replayed through add_trailer after the body (see complete).
        self._trailers = trailers or []
        self._ended = True

    def abort(self) -> None:
        self._broken = True

    async def upgrade(self, headers: Headers) -> ByteStream:
        # Status first, then hijack: the order the HTTP/2 writer demands.
        self.writer.write_resp_headers(101, headers)
        self._ended = True
        return self.writer.hijack()

    async def complete(self) -> None:
        """Write what is still queued and the trailers; raise :class:`OriginError` if
        the response broke."""
        if self._pump is not None:
            await self._pump
        if self._queue:
            await self._write_queued()
        for name, value in self._trailers:
            self.writer.add_trailer(name, value)
        if self._broken:
            raise OriginError("the origin aborted the response")
        if not self._ended:
            raise OriginError("the handler returned without finishing the response")

    async def _write_queued(self) -> None:
        try:
            queue = self._queue
            while queue:
                data = queue.popleft()
                self._queued -= len(data)
                await self.write(data)
        finally:
            self._pump = None
            callback, self._on_writable = self._on_writable, None
            if callback is not None:
                callback()


class OriginProxy:
    """tunnelgate as cloudflared's origin: every request goes to one Handler."""

    def __init__(self, handle: Handle,
                 prepare: Callable[[Request], None] = sidecar.prepare) -> None:
        self._handle = handle
        self._prepare = prepare

    async def proxy_http(self, writer: ResponseWriter, request: TunnelRequest,
                         is_websocket: bool) -> None:
        """Serve one HTTP (or WebSocket) request; returns when the response is done.

        Errors propagate: cloudflared answers 502 itself when nothing was written yet.
        """
        req = to_request(request, is_websocket)
        self._prepare(req)
        responder = WriterResponder(writer, head_only=req.method == "HEAD")
        await self._handle(req, responder)
        await responder.complete()

    async def proxy_tcp(self, *args: object, **kwargs: object) -> None:
        """Raw TCP streams are refused, as the anchor does."""
        raise TCPNotSupported("tunnelgate serves HTTP and WebSocket only; "
                              "raw TCP (WARP/private network) streams are not supported")


class Bridge:
    """Drive the Handler in-process, no sockets: ``await Bridge(handle).serve(request)``."""

    def __init__(self, handle: Handle, *, transport: str = "http2",
                 prepare: Callable[[Request], None] = sidecar.prepare) -> None:
        if transport not in ("http2", "quic"):
            raise ValueError(f"transport must be 'http2' or 'quic', not {transport!r}")
        self.transport = transport
        self.origin = OriginProxy(handle, prepare)
        self._done: asyncio.Future[None] | None = None  # one completed future for all

    def _completed(self) -> asyncio.Future[None]:
        """The ``completion`` of a request that ended with its response (no session)."""
        done = self._done
        if done is None or done.get_loop() is not asyncio.get_running_loop():
            done = self._done = asyncio.get_running_loop().create_future()
            done.set_result(None)
        return done

    async def serve(self, request: TunnelRequest,
                    is_websocket: bool = False) -> RecordedResponse:
        """Run one request; return once it completed or its connection was hijacked.

        After a hijack the session goes on in ``record.completion``; talk to the origin
        through ``record.stream`` and close it to end the session.
        """
        record = RecordedResponse(self.transport)
        kind = Http2TransportWriter if self.transport == "http2" else QuicTransportWriter
        writer = kind(record, flush_always=is_websocket)
        if not is_websocket:  # only a WebSocket request can be upgraded: no task needed
            await self._run(writer, request, is_websocket, record)
            record.completion = self._completed()
            return record
        task = asyncio.ensure_future(self._run(writer, request, is_websocket, record))
        record.completion = task
        hijacked = asyncio.ensure_future(record.hijacked.wait())
        try:
            await asyncio.wait({task, hijacked}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            hijacked.cancel()
        return record

    async def _run(self, writer: ResponseWriter, request: TunnelRequest,
                   is_websocket: bool, record: RecordedResponse) -> None:
        try:
            await self.origin.proxy_http(writer, request, is_websocket)
        except Exception as err:  # cloudflared logs the error and answers 502 itself
            log.warning("origin failed: %r", err)
            record.error = err
            writer.write_error_response()
