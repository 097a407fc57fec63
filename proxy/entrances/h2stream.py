"""One HTTP/2 stream of a client connection: its request as the Handler sees it, its
request body, and its answer (the Handler's Responder).

The connection (:mod:`proxy.entrances.h2server`) owns the h2 state machine and the
socket; a stream only queues what it would send and asks the connection's output
(:mod:`proxy.entrances.h2output`) to send it,
within the flow-control windows the client grants (RFC 9113 §5.2). While its queue is
above ``HIGH_WATER`` bytes, or the socket is, the stream is ``congested`` and the
producer (the exchange relaying a backend's body) waits, so a client that grants no
window holds back the backend instead of filling memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Callable, Final

from proxy.flow.buffer import BodyBuffer
from proxy.flow.control import DrainWait
from proxy.flow.push import BodySink, PushBody
from proxy.request import (
    EMPTY_BODY, Body, BodyError, ByteStream, Headers, Piece, Request, Responder, Running)
from proxy.wire.framing import DateLine, accepts_trailers

if TYPE_CHECKING:
    from proxy.entrances.h2output import H2Output
    from proxy.entrances.h2server import H2ServerConnection

log = logging.getLogger("tunnelgate.h2")

HIGH_WATER: Final = 64 * 1024  # response bytes a stream queues before it is congested
# RFC 9113 §8.2.2: connection-specific fields are never sent on HTTP/2 (a response
# that carried one would be malformed); ``te`` has no meaning in a response.
_NOT_SENT: Final = frozenset({b"connection", b"keep-alive", b"proxy-connection",
                              b"transfer-encoding", b"upgrade", b"te"})
_NO_BODY: Final = frozenset({204, 304})

# Where a stream's answer is (``H2Stream.state``).
IDLE: Final = 0  # nothing sent
STARTED: Final = 1  # the head went out (or is queued), the body goes on
ENDING: Final = 2  # finish() was called; queued bytes (and trailers) still to send
ENDED: Final = 3  # END_STREAM (or RST_STREAM) went out


class StreamBody(PushBody):
    """A request body arriving in DATA frames (:class:`proxy.request.Body` and a
    :class:`proxy.flow.push.PushBody`).

    Backpressure is HTTP/2's own: received bytes are acknowledged (WINDOW_UPDATE) only
    once the consumer took them — read, or pushed to a sink that is not paused — so a
    client can never send more than its stream window ahead of the backend.
    """

    __slots__ = ("_out", "_stream_id", "_unacked", "_paused")

    def __init__(self, out: "H2Output", stream_id: int, length: int | None) -> None:
        # High water 0: every take drains, and the drain hands the bytes back as window.
        super().__init__(length, BodyBuffer(0, on_drained=self._acknowledge))
        # The connection's output and the stream id, not the stream: the stream holds
        # its body, and a reference back would be a cycle only the cyclic GC frees.
        self._out = out
        self._stream_id = stream_id
        self._unacked = 0  # flow-controlled bytes received and not yet acknowledged
        self._paused = False

    # -- fed by the connection

    def feed(self, data: bytes, flow_length: int) -> None:
        self.count += len(data)
        self._unacked += flow_length
        sink = self._sink
        if sink is not None:
            if data:
                sink.body_data(data)
            if not self._paused:
                self._acknowledge()
        elif data:
            self._buffer.feed(data)
        else:
            self._acknowledge()  # padding only

    def end(self, trailers: Headers) -> None:
        self.trailers = trailers
        self._buffer.end()
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.body_end(trailers)

    def _acknowledge(self) -> None:
        count, self._unacked = self._unacked, 0
        if count:
            self._out.acknowledge(self._stream_id, count)

    # -- pushed

    def attach(self, sink: BodySink) -> list[Piece]:
        return self._take_buffered(sink, self._out.loop)

    def detach(self) -> None:
        self._sink = None
        self._paused = False
        self._acknowledge()

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._acknowledge()

    # -- read

    async def read(self) -> bytes:
        data = await self._buffer.read()
        return data if isinstance(data, bytes) else bytes(data)


class H2Stream(Responder):
    """One request/response exchange on an HTTP/2 connection; the Handler's
    Responder and its ``done``.

    Response body bytes wait in ``outgoing`` until the windows let them out; ``finish``
    with bytes still queued leaves the stream ``ENDING`` until they are sent.
    """

    __slots__ = ("conn", "out", "stream_id", "request", "body", "aborted", "relays_interim",
                 "running", "state", "over", "held", "due", "body_deadline", "outgoing",
                 "_head", "_trailers", "_no_body", "_drain", "_waiters")

    def __init__(self, conn: "H2ServerConnection", stream_id: int) -> None:
        self.conn = conn
        self.out: "H2Output" = conn.out  # what it sends goes through the connection's output
        self.stream_id = stream_id
        self.request: Request | None = None
        self.body: StreamBody | None = None
        self.aborted = False
        self.relays_interim = True
        self.running: Running | None = None
        self.state = IDLE
        self.over = False  # the Handler is done with it
        self.held = False  # its small body is awaited whole before the Handler starts
        self.due = False  # it holds bytes (or its head) for the end of the loop turn
        self.body_deadline = float("inf")  # when a stalled request body times out
        self.outgoing = Outgoing()
        # A started answer's head, held until its first body bytes or its end: an
        # answer that turns out to have neither body nor trailers then goes out as
        # one HEADERS frame with END_STREAM (gRPC's trailers-only form needs it).
        self._head: list[tuple[bytes, bytes]] | None = None
        self._trailers: list[tuple[bytes, bytes]] | None = None
        self._no_body = False
        self._drain: DrainWait | None = None
        self._waiters: list[Callable[[], None]] = []

    def request_ended(self) -> bool:
        """The client's END_STREAM: the body (if any) is complete. True if the stream
        was held for it (it starts now)."""
        self.body_deadline = float("inf")
        if self.body is not None:
            self.body.end(self.body.trailers)
        held, self.held = self.held, False
        return held

    def make_body(self, length: int | None, ended: bool) -> Body:
        if ended:
            return EMPTY_BODY
        body = self.body = StreamBody(self.out, self.stream_id, length)
        return body

    # -- Done

    def exchange_over(self, error: BaseException | None) -> None:
        self.running = None
        self.over = True
        if error is not None:
            request = self.request
            log.error("handler failed on %s %s", request.method if request else "?",
                      request.path if request else "?", exc_info=error)
        if self.state == IDLE and not self.aborted:
            if error is None:
                log.error("handler returned without answering stream %d", self.stream_id)
            self.respond(500, [(b"content-type", b"text/plain")], b"internal error\n")
        elif self.state == STARTED:
            if error is None:
                self.finish()
            else:
                self.abort()
        self.conn.stream_settled(self)

    # -- Responder

    def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        if self.aborted:
            return
        self._begin(status)
        request = self.request
        head_only = (request is not None and request.method == "HEAD") or status in _NO_BODY
        fields = response_fields(status, headers, None if head_only else len(body),
                                 self.out.dates)
        if head_only or not body:
            self.state = ENDED
            self.out.send_head(self, fields, True)
            return
        self.state = ENDING
        self.out.send_head(self, fields, False)
        self.outgoing.add(body)
        self.out.send_queued(self)

    def start(self, status: int, headers: Headers) -> None:
        if self.aborted:
            return
        self._begin(status)
        request = self.request
        self._no_body = (request is not None and request.method == "HEAD") or (
            status in _NO_BODY)
        self.state = STARTED
        self._head = response_fields(status, headers, None, self.out.dates)

    def _send_head(self, end: bool) -> None:
        head, self._head = self._head, None
        if head is not None:
            self.out.send_head(self, head, end)

    def turn_ended(self) -> None:
        """The end of the loop turn in which the answer was flushed: what it held goes
        out now (the rest of the body may be long in coming): its head, if it has no
        body yet, else its queued bytes."""
        if self.aborted:
            return
        if self._head is not None:
            self._send_head(False)
        elif self.outgoing.size:
            self.out.send_queued(self)

    def push(self, data: Piece) -> None:
        if self.aborted or self._no_body or not data:
            return
        if self.state != STARTED:
            raise RuntimeError("push() outside a started response")
        if self._head is not None:
            self._send_head(False)
        self.outgoing.add(data)

    def interim(self, status: int, headers: Headers) -> None:
        # RFC 9113 §8.1: 1xx answers precede the final one as HEADERS without
        # END_STREAM; 100 is the client's business here, 101 does not exist.
        if self.state != IDLE or self.aborted or not 102 <= status <= 199:
            return
        self.out.send_head(self, response_fields(status, headers, None, None), False)

    def flush(self) -> None:
        if self.aborted:
            return
        if self.outgoing.size:
            self.out.send_queued(self, hold=True)
        elif self._head is not None:
            self.out.hold(self)

    @property
    def congested(self) -> bool:
        return self.outgoing.size > HIGH_WATER or self.conn.flow.write_paused

    def when_writable(self, callback: Callable[[], None]) -> None:
        """``callback`` runs once the stream's queue and the socket drained, or when
        they did not within ``send_timeout`` (then the stream is reset first: a
        client that grants no window must not pin a response, and its backend)."""
        self.flush()
        if not self.congested or self.aborted:
            callback()
            return
        self._waiters.append(callback)
        if self._drain is None:
            self._drain = DrainWait(self._stalled)
        self._drain.wait(self._wake, self.conn.loop, self.conn.settings.send_timeout)

    def writable(self) -> None:
        """The queue or the socket drained (or the stream is gone): wake producers."""
        if self._waiters and (self.aborted or not self.congested):
            if self._drain is not None:
                self._drain.drained()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for callback in waiters:
            callback()

    def _stalled(self) -> None:
        log.info("stream %d: client took no response bytes within %.0f s: reset",
                 self.stream_id, self.conn.settings.send_timeout)
        self.abort()

    async def write(self, data: bytes) -> None:
        if self.aborted:
            return
        self.push(data)
        self.flush()
        if self.congested:
            waiter: asyncio.Future[None] = self.conn.loop.create_future()
            self.when_writable(lambda: _wake(waiter))
            await waiter

    def finish(self, trailers: Headers | None = None) -> None:
        if self.aborted:
            return
        if self.state != STARTED:
            raise RuntimeError("finish() outside a started response")
        self._trailers = sendable_trailers(trailers, self.request)
        if self._head is not None and not self._trailers:
            self.state = ENDED  # no body, no trailers: one HEADERS frame ends it
            self._send_head(True)
            return
        self._send_head(False)
        self.state = ENDING
        self.out.send_queued(self)

    def abort(self) -> None:
        """Reset the stream (RST_STREAM INTERNAL_ERROR): a truncated answer must not
        look complete. Later Responder calls are ignored."""
        if self.aborted:
            return
        self.aborted = True
        self.outgoing.clear()
        if self.state != ENDED:
            self.state = ENDED
            self.out.reset(self, 0x2)  # INTERNAL_ERROR
        self.writable()

    async def upgrade(self, headers: Headers) -> ByteStream:
        raise RuntimeError("HTTP/2 has no protocol switch (RFC 9113 §8.6)")

    # -- the connection's side

    @property
    def ends_bare(self) -> bool:
        """Finished, with no trailers to follow: the last DATA frame can end it."""
        return self.state == ENDING and not self._trailers

    def trailers_due(self) -> list[tuple[bytes, bytes]] | None:
        """The trailers to end with, once everything queued went out (taken once)."""
        trailers, self._trailers = self._trailers, None
        return trailers

    def gone(self, error: str) -> None:
        """The client reset the stream, or the connection ended: the request body
        fails, the Handler stops, nothing more is sent."""
        self.aborted = True
        self.state = ENDED
        self.outgoing.clear()
        if self.body is not None:
            self.body.fail(BodyError(error))
        running = self.running
        if running is not None and not self.over:
            running.cancel()
        self.writable()

    def _begin(self, status: int) -> None:
        if self.state != IDLE:
            raise RuntimeError("response already started")
        if status < 200:
            raise ValueError("1xx answers go through interim()")


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Outgoing:
    """A stream's response bytes not yet sent: the pieces as pushed, ``size`` in all."""

    __slots__ = ("pieces", "size")

    def __init__(self) -> None:
        self.pieces: deque[Piece] = deque()
        self.size = 0

    def add(self, piece: Piece) -> None:
        self.pieces.append(piece)
        self.size += len(piece)

    def take(self, room: int) -> Piece | None:
        """Up to ``room`` bytes for one DATA frame, or None."""
        piece = take_bytes(self.pieces, room)
        if piece is not None:
            self.size -= len(piece)
        return piece

    def keep(self) -> None:
        """The bytes (at most a frame's worth) stay past the read they came in: a view
        of the read store is copied, so the next read can reuse the store
        (:mod:`proxy.upstream.readbuffer`) instead of allocating one."""
        pieces = self.pieces
        if len(pieces) > 1 or isinstance(pieces[0], memoryview):
            joined = b"".join(pieces)
            pieces.clear()
            pieces.append(joined)

    def clear(self) -> None:
        self.pieces.clear()
        self.size = 0


def take_bytes(queue: deque[Piece], room: int) -> Piece | None:
    """Up to ``room`` bytes from the front of ``queue``: a piece, part of one, or
    several joined. A DATA frame costs the h2 library far more than copying a few
    KiB, so the pieces a backend's reads delivered go out in as few frames as the
    frame size allows (a 64 KiB body in four, whatever its reads were)."""
    if not queue or room <= 0:
        return None
    first = queue.popleft()
    if len(first) >= room or not queue:
        return _front(queue, first, room)
    parts = [first]
    size = len(first)
    while queue and size < room:
        piece = _front(queue, queue.popleft(), room - size)
        parts.append(piece)
        size += len(piece)
    return b"".join(parts)


def _front(queue: deque[Piece], piece: Piece, room: int) -> Piece:
    """``piece``'s first ``room`` bytes; the rest goes back to the front of ``queue``."""
    if len(piece) <= room:
        return piece
    view = piece if isinstance(piece, memoryview) else memoryview(piece)
    queue.appendleft(view[room:])
    return view[:room]


def sendable_trailers(trailers: Headers | None,
                      request: Request | None) -> list[tuple[bytes, bytes]] | None:
    """Trailers only for a client that said it takes them (RFC 9110 §6.5), as on
    HTTP/1.1 (gRPC clients always do); names lower-cased, no connection fields."""
    if not trailers or request is None or not accepts_trailers(request.header(b"te")):
        return None
    return [(name.lower(), value) for name, value in trailers
            if name.lower() not in _NOT_SENT]


def response_fields(status: int, headers: Headers, length: int | None,
                    dates: DateLine | None) -> list[tuple[bytes, bytes]]:
    """An HTTP/2 response header block: ``:status`` first, names lower-cased,
    connection-specific fields dropped (RFC 9113 §8.2.2, §8.3.2). ``length``, for a
    complete body, replaces any Content-Length; a Date from ``dates`` is added when
    the headers lack one (RFC 9110 §6.6.1)."""
    fields: list[tuple[bytes, bytes]] = [(b":status", b"%d" % status)]
    dated = False
    for name, value in headers:
        lname = name.lower()
        if lname in _NOT_SENT or (length is not None and lname == b"content-length"):
            continue
        if lname == b"date":
            dated = True
        fields.append((lname, value))
    if length is not None:
        fields.append((b"content-length", b"%d" % length))
    if dates is not None and not dated:
        fields.append((b"date", dates.line()[6:-2]))  # (the value of "Date: ...\r\n")
    return fields
