"""What an HTTP/2 client connection sends: response heads, body bytes within the
client's flow-control windows (RFC 9113 §5.2), ends and trailers, resets, window
handed back for request bodies, our GOAWAY.

Frames are queued in the h2 library's send buffer and written to the socket once per
loop turn (every answer that went out in it in one write), at once at the end of a
read, or as soon as :data:`WRITE_AT` body bytes wait. A body flushed while its answer goes on leaves as whole frames while more
than one frame's worth is queued; the rest (and a head still without body) is held
until the end of the loop turn (:meth:`H2Output.hold`): by then the answer may have
ended too, so its last DATA frame carries END_STREAM instead of an empty DATA frame
following it (h2 builds and accounts every frame in Python: an empty one costs as
much as a full one), while a streamed answer's bytes still leave in the turn they
arrived in.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable, Final

import h2.connection
import h2.exceptions
from hyperframe.frame import GoAwayFrame

from proxy.entrances.h2stream import ENDED, ENDING, STARTED
from proxy.flow.control import FlowControl
from proxy.wire.framing import DateLine
from proxy.wire.h2frames import reset_stream

if TYPE_CHECKING:
    from proxy.entrances.h2stream import H2Stream

log = logging.getLogger("tunnelgate.h2")

# Body bytes h2 may hold for the socket before they are written in the middle of a
# turn: h2 appends every frame to one buffer and copies it out whole, so a turn's worth
# of large answers (megabytes under load) would be copied over and over as the buffer
# grows, and handed to a socket that takes only part of it (measured: a quarter of
# the CPU a 64 KiB answer costs).
WRITE_AT: Final = 64 * 1024


def _forget_nothing(stream: "H2Stream") -> None:
    """What a released output tells of a stream's end: nobody is left to hear."""


class H2Output:
    """The sending half of one HTTP/2 connection. ``blocked`` holds the streams with
    bytes queued and no window to send them in; ``forget`` is the connection's, told
    when a stream the Handler is done with has sent its last frame."""

    __slots__ = ("h2", "loop", "transport", "flow", "blocked", "closed", "dates",
                 "_forget", "_due", "_held", "_unwritten")

    def __init__(self, h2conn: h2.connection.H2Connection, loop: asyncio.AbstractEventLoop,
                 dates: DateLine, forget: Callable[["H2Stream"], None]) -> None:
        self.h2 = h2conn
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.flow: FlowControl = None  # type: ignore[assignment]  # set on attach
        self.blocked: set[H2Stream] = set()
        self.closed = False  # the connection ended: nothing more is sent
        self.dates = dates  # the Date of answers that lack one
        self._forget = forget
        self._due = False  # _turn_end is scheduled for the end of this loop turn
        self._held: list[H2Stream] = []  # streams with bytes held for the turn's end
        self._unwritten = 0  # body bytes h2 holds for the socket

    def attach(self, transport: asyncio.Transport, flow: FlowControl) -> None:
        self.transport = transport
        self.flow = flow

    def release(self) -> None:
        """The connection is gone: let go of its callback (a cycle through it would
        wait for the cyclic GC) and of the streams still blocked."""
        self.closed = True
        self._forget = _forget_nothing
        self.blocked.clear()
        self._held.clear()

    def send_head(self, stream: "H2Stream", fields: list[tuple[bytes, bytes]],
                  end: bool) -> None:
        if self.closed:
            return
        try:
            self.h2.send_headers(stream.stream_id, fields, end_stream=end)
        except h2.exceptions.ProtocolError as exc:
            log.error("stream %d: response head not sendable: %s", stream.stream_id, exc)
            stream.abort()
            return
        self.write_soon()
        if end and stream.over:
            self._forget(stream)

    def send_queued(self, stream: "H2Stream", hold: bool = False) -> None:
        """Send what ``stream`` queued, as far as the windows allow; then its end.
        With ``hold`` (a flush of an answer that goes on), up to one frame's worth is
        kept back for the end of the loop turn."""
        if self.closed or stream.aborted:
            return
        h2conn = self.h2
        stream_id = stream.stream_id
        frame = h2conn.max_outbound_frame_size
        outgoing = stream.outgoing
        keep = frame if hold and stream.state == STARTED else 0
        sent = 0
        try:
            while outgoing.size > keep:
                room = min(h2conn.local_flow_control_window(stream_id), frame)
                piece = outgoing.take(room)
                if piece is None:
                    self.blocked.add(stream)
                    break
                sent += len(piece)
                if outgoing.size or not stream.ends_bare:
                    h2conn.send_data(stream_id, piece)
                else:  # the last bytes of an answer without trailers carry its end
                    h2conn.send_data(stream_id, piece, end_stream=True)
                    stream.state = ENDED
            else:
                if outgoing.size:
                    outgoing.keep()
                    self.hold(stream)
                else:
                    self.blocked.discard(stream)
                    if stream.state == ENDING:  # all of it is out: trailers, or the end
                        self._end_stream(stream)
        except h2.exceptions.StreamClosedError:
            stream.gone("stream closed")
            return
        self._unwritten += sent
        if self._unwritten >= WRITE_AT:
            self.write()
        else:
            self.write_soon()
        stream.writable()
        if stream.state == ENDED and stream.over:
            self._forget(stream)

    def _end_stream(self, stream: "H2Stream") -> None:
        stream.state = ENDED
        trailers = stream.trailers_due()
        if trailers:
            self.h2.send_headers(stream.stream_id, trailers, end_stream=True)
        else:
            self.h2.end_stream(stream.stream_id)

    def window_opened(self, stream: "H2Stream | None") -> None:
        """The client granted window: to ``stream``, or (None) to the connection."""
        if stream is None:
            for blocked in list(self.blocked):
                self.send_queued(blocked)
        elif stream in self.blocked:
            self.send_queued(stream)

    def acknowledge(self, stream_id: int, count: int) -> None:
        """``count`` request bytes were taken: hand them back as window."""
        if self.closed:
            return
        try:
            self.h2.acknowledge_received_data(count, stream_id)
        except h2.exceptions.ProtocolError:
            return
        self.write_soon()

    def reset(self, stream: "H2Stream", code: int) -> None:
        """Our RST_STREAM for ``stream`` (its answer broke off)."""
        self.blocked.discard(stream)
        self.refuse(stream.stream_id, code)
        if stream.over:
            self._forget(stream)

    def refuse(self, stream_id: int, code: int) -> None:
        """RST_STREAM ``code`` for ``stream_id``, unless it is closed already."""
        if not self.closed and reset_stream(self.h2, stream_id, code):
            self.write_soon()

    def go_away(self, last_stream: int) -> None:
        """GOAWAY NO_ERROR with ``last_stream`` (RFC 9113 §6.8), written here: the h2
        library would also stop taking frames for the streams still in flight."""
        self.write()  # what h2 queued goes first
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(GoAwayFrame(0, last_stream_id=last_stream).serialize())

    def hold(self, stream: "H2Stream") -> None:
        """``stream`` sends what it holds (:meth:`H2Stream.turn_ended`) at the end of
        this loop turn."""
        if not stream.due:
            stream.due = True
            self._held.append(stream)
            self.write_soon()

    def write_soon(self) -> None:
        if not self._due:
            self._due = True
            self.loop.call_soon(self._turn_end)

    def _turn_end(self) -> None:
        """The held streams send what they hold, then what waits goes out in one write."""
        held = self._held
        if held:
            self._held = []
            for stream in held:
                stream.due = False
                stream.turn_ended()
        self._due = False
        self.write()

    def write(self) -> None:
        self._unwritten = 0
        data = self.h2.data_to_send()
        transport = self.transport
        if data and transport is not None and not transport.is_closing():
            transport.write(data)
