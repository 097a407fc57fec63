"""One HTTP/2 connection to a backend (:class:`Link`) and the streams open on it
(:class:`StreamTable`); the streams are :class:`proxy.upstream.h2stream.H2Response`\\ s
and the pool is :class:`proxy.upstream.h2c.H2Pool` (its docstring says how they work
together: shared connections, flow control, GOAWAY, liveness)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING, Callable, Final, cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from proxy.flow.control import FlowControl
from proxy.request import Headers
from proxy.upstream.base import UpstreamError
from proxy.upstream.h2stream import H2Response, Unanswered
from proxy.upstream.liveness import Liveness
from proxy.wire.h2frames import GoAway, GoAwayFilter, reset_stream

if TYPE_CHECKING:
    from proxy.upstream.h2c import H2Pool

log = logging.getLogger("tunnelgate.h2c")

STREAM_WINDOW: Final = 256 * 1024  # our SETTINGS_INITIAL_WINDOW_SIZE: response bytes per stream
CONNECTION_WINDOW: Final = 16 * 1024 * 1024  # response bytes buffered per connection, all streams
_CANCEL = h2.errors.ErrorCodes.CANCEL
_REFUSED = h2.errors.ErrorCodes.REFUSED_STREAM
_CONFIG = h2.config.H2Configuration(client_side=True, header_encoding=None)
_LOCAL_SETTINGS: Final = {
    h2.settings.SettingCodes.ENABLE_PUSH: 0,
    h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
    h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 64 * 1024,
}


class StreamTable:
    """The streams open on one connection, by id, and the backend's frames for them.

    A stream is here from its HEADERS until it is closed for the connection: ended both
    ways or given up (:meth:`forget`), reset by the backend, answered with a head that
    is no response, left out by a GOAWAY (:meth:`refuse_above`) or lost with the
    connection (:meth:`fail_all`). Frames for a stream no longer here are dropped, but
    their DATA is still acknowledged: it counts against the connection's window. When a
    stream leaves on its own, the link is told it may go idle (:meth:`Link.maybe_idle`).
    """

    __slots__ = ("link", "by_id")

    def __init__(self, link: Link) -> None:
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


class Link(asyncio.Protocol):
    """One HTTP/2 connection to a backend; its streams are :class:`H2Response`\\ s."""

    def __init__(self, pool: "H2Pool") -> None:
        self.pool = pool
        self.scheme = b"https" if pool.over_tls else b"http"
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.flow: FlowControl = None  # type: ignore[assignment]  # set on connect
        self.h2 = h2.connection.H2Connection(_CONFIG)
        self.streams = StreamTable(self)
        self.ready: asyncio.Future[None] = self.loop.create_future()  # SETTINGS seen
        self.accepting = True  # new streams may start here (no GOAWAY, not closing)
        self.closed = False
        self._filter = GoAwayFilter()
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

    def _go_away(self, goaway: GoAway) -> None:
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
        """Send the HEADERS of a new stream; raises Unanswered if the connection
        cannot take one after all, UpstreamError if h2 refuses the header block."""
        h2conn = self.h2
        try:
            stream_id = h2conn.get_next_available_stream_id()
            # (pairs, as every Headers; see proxy.request.Header)
            pairs = cast("list[tuple[bytes, bytes]]", fields)
            h2conn.send_headers(stream_id, pairs, end_stream=end_stream)
        except (h2.exceptions.NoAvailableStreamIDError, h2.exceptions.TooManyStreamsError):
            self._retire()
            raise Unanswered(False, UpstreamError(
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
_STREAM_EVENTS: Final[dict[type, Callable[[StreamTable, h2.events.Event], None]]] = {
    h2.events.ResponseReceived: StreamTable._on_response,  # type: ignore[dict-item]
    h2.events.DataReceived: StreamTable._on_data,  # type: ignore[dict-item]
    h2.events.TrailersReceived: StreamTable._on_trailers,  # type: ignore[dict-item]
    h2.events.StreamEnded: StreamTable._on_end,  # type: ignore[dict-item]
    h2.events.StreamReset: StreamTable._on_reset,  # type: ignore[dict-item]
    h2.events.WindowUpdated: StreamTable._on_window,  # type: ignore[dict-item]
}
