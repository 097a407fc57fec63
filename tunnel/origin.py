"""cloudflared's OriginProxy contract and the in-process bridge into the Handler.

:class:`OriginProxy` adapts a :class:`TunnelRequest` (a request as cloudflared hands it
over) into a ``proxy.request.Request`` (entrance ``tunnel``, the sidecar trust rules
applied) and cloudflared's response writer (:mod:`tunnel.writers`) into a
``proxy.request.Responder``, so a bridged request and a socket request take the same
path through ``routing`` and the Handler. :class:`Bridge` is the one-call entry point
for an embedding program or a load-test harness that hands requests to the proxy with
no sockets (README, *Embedding: the in-process bridge*).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import AsyncIterable, Callable, Sequence

from proxy.request import (
    EMPTY_BODY, Body, BodyError, ByteStream, BytesBody, Handle, Headers, Piece, Request,
    Responder)
from routing.model import TUNNEL
from tunnel import sidecar
from tunnel.writers import (
    STREAM_HIGH_WATER, Http2TransportWriter, QuicTransportWriter, RecordedResponse,
    ResponseWriter, WriterError)

log = logging.getLogger("tunnelgate.tunnel")

_WEBSOCKET_HEADERS: Headers = [
    (b"Connection", b"Upgrade"), (b"Upgrade", b"websocket"),
    (b"Sec-WebSocket-Version", b"13")]


class OriginError(Exception):
    """The origin did not produce a complete response; cloudflared resets the stream."""


class TCPNotSupported(Exception):
    """Raw TCP (WARP) streams are not served by tunnelgate."""



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


def _split_url(url: str) -> tuple[str, str, str, str, bool]:
    """``(scheme, authority, path, query, whether the query is present but empty)`` of
    an absolute or origin-form URL, raw (``/p?`` keeps its ``?`` upstream)."""
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
    empty_query = False
    if "?" in rest:
        at = rest.find("?")
        rest, query = rest[:at], rest[at + 1:]
        empty_query = not query
    return scheme.lower(), authority, rest or "/", query, empty_query


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
    scheme, authority, path, query, empty_query = _split_url(treq.url)
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
        scheme="https" if scheme in ("https", "wss") else "http", upgrade=upgrade,
        empty_query=empty_query)


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
        return self._queued > STREAM_HIGH_WATER

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
