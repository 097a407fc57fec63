"""The two response writers cloudflared gives an origin proxy, recorded instead of sent.

cloudflared hands every edge request to an *origin proxy* together with a
*response writer*. We don't speak the edge protocol, so the writers here stand in for
the two transports cloudflared would give us and record what they would have put on
the wire into a :class:`RecordedResponse`:

- :class:`Http2TransportWriter` — user headers packed into the
  ``cf-cloudflared-response-headers`` blob with control prefixes dropped, ``101`` sent
  as ``200``, hijack only after the status, trailers only after the status;
- :class:`QuicTransportWriter` — headers as they are, ``101`` kept, trailers dropped.

:func:`stream_pair` is the in-memory byte stream a hijacked (upgraded) request talks
over, bounded like a socket buffer.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from typing import Final, Protocol

from proxy.flow.buffer import BodyBuffer
from proxy.request import ByteStream, Headers
from tunnel import headers as blob
from tunnel.headers import encode_bytes, is_control_lowered

log = logging.getLogger("tunnelgate.tunnel")

STATUS_NOT_WRITTEN: Final = "status not yet written before attempting to hijack connection"
TRACING_HEADER: Final = b"cf-int-cloudflared-tracing"
# cloudflared flushes every write of a response with one of these content types, or
# without a Content-Length, or chunked (cloudflared flushes those per write).
_STREAMING_TYPES: Final = (b"text/event-stream", b"application/grpc", b"application/x-ndjson")
STREAM_HIGH_WATER: Final = 64 * 1024
_RESPONSE_HEADERS: Final = blob.RESPONSE_HEADERS.encode("ascii")
_RESPONSE_META: Final = blob.RESPONSE_META.encode("ascii")
_META_ORIGIN: Final = blob.META_ORIGIN.encode("ascii")


class WriterError(Exception):
    """The response writer refused an operation (e.g. hijack before the status)."""


class HijackedError(WriterError):
    """The connection was already hijacked (Go's ``http.ErrHijacked``)."""

    def __init__(self) -> None:
        super().__init__("http: connection has been hijacked")



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


def stream_pair(high_water: int = STREAM_HIGH_WATER) -> tuple[ByteStream, ByteStream]:
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
