"""The HTTP/2 side of an entrance: one client connection, many streams (RFC 9113).

A connection becomes HTTP/2 when its first bytes are the preface (prior knowledge,
RFC 9113 §3.3) or TLS chose ``h2`` by ALPN (RFC 9113 §3.2):
:mod:`proxy.entrances.connection` hands the transport over to
:class:`H2ServerConnection`. Each stream is a
:class:`~proxy.entrances.h2stream.H2Stream`: a :class:`~proxy.request.Request` for the
same Handler, routing and exchange as HTTP/1.1, and the Responder that answers it.

- **Flow control both ways.** Request bodies are acknowledged only as the exchange
  takes them (:class:`~proxy.entrances.h2stream.StreamBody`); response bytes go out
  only within the client's windows, and a stream with more than its high-water mark
  queued is congested, which holds its backend back.
- **Limits.** The entrance's settings (header size and count, header/idle/body/send
  timeouts) apply as on HTTP/1.1; SETTINGS_MAX_CONCURRENT_STREAMS and the streams per
  connection are nginx's defaults; the floods are :mod:`proxy.entrances.h2guard`'s.
- **Graceful GOAWAY.** On drain (and after ``h2_max_requests`` streams) a GOAWAY with
  the last stream id taken goes out and the streams in flight finish (RFC 9113
  §6.8). The h2 library would end the connection on its own GOAWAY, so that frame
  is written here (:meth:`~proxy.entrances.h2output.H2Output.go_away`).
- **Cancellation.** A client's RST_STREAM cancels the exchange (and so the backend
  request); an answer broken off by its backend is reset (RST_STREAM INTERNAL_ERROR).

WebSocket over HTTP/2 (RFC 8441's extended CONNECT) is not offered:
SETTINGS_ENABLE_CONNECT_PROTOCOL stays 0, so clients open WebSockets over HTTP/1.1.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Awaitable, Final, cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from proxy.entrances.h2fields import read_head, read_trailers
from proxy.entrances.h2guard import PREFACE_LENGTH, FrameGuard
from proxy.entrances.h2output import H2Output
from proxy.entrances.h2stream import ENDED, H2Stream
from proxy.entrances.tls import TLSSession, session_of
from proxy.flow.control import FlowControl
from proxy.request import Request
from proxy.wire.h2frames import GoAway, GoAwayFilter
from proxy.wire.request import Rejection, served_method, split_target, valid_host

if TYPE_CHECKING:
    from proxy.entrances.listener import Entrance, EntranceSettings

log = logging.getLogger("tunnelgate.h2")

STREAM_WINDOW: Final = 256 * 1024  # request body bytes a stream may send ahead
CONNECTION_WINDOW: Final = 1024 * 1024  # ... and all streams of a connection together
_ENHANCE_YOUR_CALM: Final = 0xB
_NO_ERROR: Final = 0x0
_PROTOCOL_ERROR: Final = 0x1
_CANCEL: Final = 0x8
_REFUSED_STREAM: Final = 0x7
_NEVER: Final = float("inf")
Fields = list[tuple[bytes, bytes]]  # a header block as h2 hands it over
# Inbound header blocks are checked in one pass by h2fields.read_head (RFC 9113 §8.2,
# §8.3), at C speed where h2 would visit every byte in Python. Outbound ones are built
# by h2stream.response_fields, which lower-cases names and drops connection-specific
# fields, from values llhttp or the config's validation already checked: h2 checking
# and normalising them again would cost a pass over every field of every answer.
# Not avoidable by configuration: h2 (4.x, H2Connection._receive_frame) builds
# repr(frame) of every frame it receives as an argument to its trace logger, before any
# logger (its default DummyLogger included) can decline it; for a DATA frame that hex-
# encodes the whole payload (measured: ~15 µs of CPU per 16 KiB frame, ~1.3 µs per
# HEADERS frame).
_CONFIG = h2.config.H2Configuration(client_side=False, header_encoding=None,
                                    validate_inbound_headers=False,
                                    normalize_inbound_headers=False,
                                    validate_outbound_headers=False,
                                    normalize_outbound_headers=False)


class H2ServerConnection(asyncio.Protocol):
    """One HTTP/2 client connection of an entrance (a
    :class:`proxy.entrances.listener.Member`: swept for its ``deadline``, drained)."""

    def __init__(self, entrance: "Entrance", client_ip: str | None) -> None:
        self.entrance = entrance
        self.settings = entrance.settings
        self.loop = entrance.loop
        self.client_ip = client_ip
        self.transport: asyncio.Transport | None = None
        self.tls: TLSSession | None = None  # SNI's certificate (refuse_misdirected)
        self.flow: FlowControl = None  # type: ignore[assignment]  # set on adopt
        self.h2 = h2.connection.H2Connection(_CONFIG)
        self.out = H2Output(self.h2, self.loop, entrance.dates, self._forget)
        self.guard = FrameGuard(self.settings.max_header_bytes)
        self.incoming = Incoming()
        self.streams: dict[int, H2Stream] = {}
        self.deadline = _NEVER
        self.closed = False
        self.last_stream = 0  # once a GOAWAY went out: the last stream served
        self.taken = 0  # streams taken to be served
        self._going_away = False  # close once no stream is left
        self._sent_goaway = False

    def adopt(self, transport: asyncio.Transport, data: bytes) -> None:
        """Take over ``transport``; ``data`` is what was read from it so far."""
        self.transport = transport
        self.tls = session_of(transport.get_extra_info("ssl_object"))
        self.flow = FlowControl(transport)
        self.out.attach(transport, self.flow)
        self.entrance.add(self)
        settings = self.settings
        h2conn = self.h2
        h2conn.local_settings = local_settings(settings)
        # The HPACK bomb's bound (CVE-2016-6581), from the first header block on: the
        # decoder otherwise takes the setting only once the client acknowledged it.
        h2conn.decoder.max_header_list_size = settings.max_header_bytes
        h2conn.initiate_connection()
        h2conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self.deadline = self.entrance.clock() + settings.header_timeout
        if data:
            self.data_received(data)
        else:
            self.out.write()
        if self.entrance.draining:
            self.drain()

    # -- transport callbacks

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        verdict = self.guard.feed(data, self.flow.write_paused)
        if verdict is not None:
            self._fail(verdict)
            return
        fresh: list[H2Stream] = []
        for part in self.incoming.split(data):
            if isinstance(part, bytes):
                try:
                    events = self.h2.receive_data(part)
                except h2.exceptions.ProtocolError as exc:
                    log.info("%s entrance: HTTP/2 protocol error from %s: %s",
                             self.settings.name, self.client_ip, exc)
                    self.out.write()  # h2 queued its GOAWAY
                    self._close()
                    return
                for event in events:
                    self._on_event(event, fresh)
            elif part.error_code:
                self._close()  # the client's GOAWAY with an error: it gave up
            else:
                self._going_away = True  # it opens no more streams; these finish
            if self.closed:
                return
        for stream in fresh:
            if not stream.aborted:  # (a stream reset in the same read never starts)
                start_stream(self.entrance, stream)
        self.out.write()
        self._settle()

    def eof_received(self) -> bool:
        return False  # the client is gone: what it asked for is abandoned

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.out.release()
        self.entrance.discard(self)
        self.flow.connection_lost()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.gone("client went away")

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        for stream in list(self.streams.values()):
            stream.writable()

    # -- frames in

    def _on_event(self, event: h2.events.Event, fresh: list[H2Stream]) -> None:
        if isinstance(event, h2.events.DataReceived):
            self._on_data(event)
        elif isinstance(event, h2.events.RequestReceived):
            self._on_request(event, fresh)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(cast(int, event.stream_id))
            if stream is not None and stream.request_ended():
                fresh.append(stream)
        elif isinstance(event, h2.events.WindowUpdated):
            stream_id = cast(int, event.stream_id)
            if stream_id == 0:
                self.out.window_opened(None)
            else:
                opened = self.streams.get(stream_id)
                if opened is not None:
                    self.out.window_opened(opened)
        elif isinstance(event, h2.events.StreamReset):
            self._on_reset(cast(int, event.stream_id))
        elif isinstance(event, h2.events.TrailersReceived):
            take_trailers(self.streams.get(cast(int, event.stream_id)),
                          cast(Fields, event.headers), self.out)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            if h2.settings.SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
                self.out.window_opened(None)

    def _on_request(self, event: h2.events.RequestReceived, fresh: list[H2Stream]) -> None:
        stream_id = cast(int, event.stream_id)
        stream = H2Stream(self, stream_id)
        fields = cast(Fields, event.headers)
        if self._sent_goaway and stream_id > self.last_stream:
            # Above our GOAWAY's last stream: never processed, may be retried
            # (RFC 9113 §6.8).
            self.out.refuse(stream_id, _REFUSED_STREAM)
            return
        self.streams[stream_id] = stream
        self.deadline = _NEVER if len(self.streams) == 1 else self.deadline
        ended = event.stream_ended is not None
        try:
            stream.request = to_request(fields, stream, ended, self.settings.max_headers,
                                        self.settings.name, self.client_ip,
                                        self.settings.scheme)
            refuse_misdirected(self.tls, stream.request.host)
        except Rejection as refusal:
            reject(stream, refusal, self.settings, self.client_ip)
            return
        if not ended:
            self._arm_body(stream)
        stream.held = not ended and small_body(stream.request)
        if not stream.held:
            fresh.append(stream)
        self.taken += 1
        if self.taken >= self.settings.h2_max_requests:
            self._go_away(stream_id)  # nginx's keepalive_requests: enough on this one

    def _on_data(self, event: h2.events.DataReceived) -> None:
        stream_id = cast(int, event.stream_id)
        stream = self.streams.get(stream_id)
        length = cast(int, event.flow_controlled_length)
        body = stream.body if stream is not None else None
        if stream is None or body is None:
            self.out.acknowledge(stream_id, length)  # nobody will read it
            return
        body.feed(cast(bytes, event.data), length)
        if event.stream_ended is None:
            self._arm_body(stream)

    def _on_reset(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        self.out.blocked.discard(stream)
        premature = stream.state != ENDED  # (rapid reset counts these)
        stream.gone("client reset the stream")
        verdict = self.guard.reset() if premature else None
        if verdict is not None:
            self._fail(verdict)
        else:
            self._settle()

    # -- streams

    def _arm_body(self, stream: H2Stream) -> None:
        stream.body_deadline = deadline = self.entrance.clock() + self.settings.body_timeout
        self.deadline = min(self.deadline, deadline)

    def stream_settled(self, stream: H2Stream) -> None:
        """The Handler is done with ``stream``: forget it once its answer went out."""
        if stream.state == ENDED:
            self._forget(stream)

    def _forget(self, stream: H2Stream) -> None:
        if self.streams.get(stream.stream_id) is not stream:
            return
        del self.streams[stream.stream_id]
        self.out.blocked.discard(stream)
        body = stream.body
        if body is not None and not body.complete and not stream.aborted:
            # Answered before the request ended: the rest is unwanted (RFC 9113 §8.1).
            self.out.refuse(stream.stream_id, _NO_ERROR)
        self._settle()

    def _settle(self) -> None:
        """No stream left: close if going away, else the idle timer runs."""
        if self.streams or self.closed:
            return
        if self._going_away:
            self.out.write()
            self._close()
        else:
            self.deadline = self.entrance.clock() + self.settings.idle_timeout

    # -- ending

    def drain(self) -> None:
        """Graceful shutdown: GOAWAY now; the streams in flight finish, then close."""
        self._go_away(self.h2.highest_inbound_stream_id)
        self._settle()

    def _go_away(self, last_stream: int) -> None:
        """Our GOAWAY NO_ERROR with ``last_stream``: later streams are refused."""
        if self._sent_goaway or self.closed:
            return
        self._sent_goaway = self._going_away = True
        self.last_stream = last_stream
        self.out.go_away(last_stream)

    def timed_out(self) -> None:
        """The entrance's sweep found the deadline passed: an idle connection closes;
        a stream whose request body stalled past ``body_timeout`` is reset."""
        now = self.entrance.clock()
        if not self.streams:
            self._go_away(self.h2.highest_inbound_stream_id)
            self._close()
            return
        self.deadline = expire_bodies(self.streams, self.out, now)
        self.out.write()
        self._settle()

    def _fail(self, reason: str) -> None:
        """A flood: GOAWAY ENHANCE_YOUR_CALM and the connection ends now."""
        log.warning("%s entrance: closing HTTP/2 connection from %s: %s",
                    self.settings.name, self.client_ip, reason)
        try:
            self.h2.close_connection(_ENHANCE_YOUR_CALM, reason.encode())
        except h2.exceptions.ProtocolError:
            pass
        self.out.write()
        if self.flow.write_paused and self.transport is not None:
            self.transport.abort()  # it does not read: nothing more is queued for it
        self._close()

    def _close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()
        self.closed = self.out.closed = True


class Incoming:
    """The client's bytes as h2 is to see them: GOAWAY frames taken out (the h2
    library would stop sending on its own at one, and the client's streams in flight
    are still to be answered, RFC 9113 §6.8), after the preface, which is no frame."""

    __slots__ = ("_preface", "_goaways")

    def __init__(self) -> None:
        self._preface = PREFACE_LENGTH  # preface bytes still to pass through
        self._goaways = GoAwayFilter()

    def split(self, data: bytes) -> list[bytes | GoAway]:
        """Byte runs for h2 and the client's GOAWAYs, in order."""
        if not self._preface:
            return self._goaways.feed(data)
        size = min(self._preface, len(data))
        self._preface -= size
        if size == len(data):
            return [data]
        return [data[:size], *self._goaways.feed(data[size:])]


def expire_bodies(streams: dict[int, H2Stream], out: H2Output, now: float) -> float:
    """Reset the streams whose request body stalled past its deadline (RST_STREAM
    CANCEL; the exchange hears the body failed); the next deadline of the others."""
    deadline = _NEVER
    for stream in list(streams.values()):
        if stream.body_deadline <= now:
            log.info("stream %d: request body stalled: reset", stream.stream_id)
            del streams[stream.stream_id]
            out.blocked.discard(stream)
            stream.gone("request body timed out")
            out.refuse(stream.stream_id, _CANCEL)
        else:
            deadline = min(deadline, stream.body_deadline)
    return deadline


def small_body(request: Request) -> bool:
    """Whether a request's body is awaited whole before the Handler starts: one that
    declares a length within the stream window (the client sends it without waiting
    for us), as nginx's proxy_request_buffering does. An HTTP/1.1 backend then gets it
    in one write and cannot answer before it ended (an early answer costs its
    keep-alive connection). Others (gRPC streams, large uploads) stream at once."""
    length = request.body.length
    return length is not None and 0 < length <= STREAM_WINDOW


def take_trailers(stream: H2Stream | None, fields: Fields, out: H2Output) -> None:
    """A request's trailer block; a malformed one resets the stream (PROTOCOL_ERROR):
    its fields could not be passed on safely."""
    if stream is None or stream.body is None:
        return
    try:
        stream.body.trailers = read_trailers(fields)
    except Rejection:
        stream.gone("malformed request trailers")
        out.refuse(stream.stream_id, _PROTOCOL_ERROR)


def start_stream(entrance: "Entrance", stream: H2Stream) -> None:
    """Give ``stream``'s request to the Handler: driven by callbacks when it can be,
    else as a coroutine in a task of its own."""
    request = stream.request
    assert request is not None
    prepare = entrance.settings.prepare
    serve = entrance.serve
    try:
        if prepare is not None:
            prepare(request)
        if serve is not None:
            running = serve.start(request, stream, stream)
            if not stream.over:
                stream.running = running
        else:
            stream.running = entrance.loop.create_task(
                _run(entrance.handle(request, stream), stream))
    except Exception as exc:
        stream.exchange_over(exc)


async def _run(handling: Awaitable[None], stream: H2Stream) -> None:
    """A coroutine Handler (tests, the admin API) to its end."""
    try:
        await handling
    except asyncio.CancelledError:
        if not stream.aborted:
            raise
    except Exception as exc:
        stream.exchange_over(exc)
        return
    stream.exchange_over(None)


def reject(stream: H2Stream, refusal: Rejection, settings: "EntranceSettings",
           client_ip: str | None) -> None:
    """Answer a request the entrance does not serve (as HTTP/1.1 would, but on its
    stream alone: the connection goes on)."""
    log.debug("%s entrance: rejecting HTTP/2 request (%d): %s", settings.name,
              refusal.status, refusal)
    if settings.rejected is not None:
        settings.rejected(settings.name, refusal.status, str(refusal), client_ip)
    stream.over = True
    stream.respond(refusal.status, [(b"content-type", b"text/plain")],
                   f"{refusal}\n".encode())


def local_settings(settings: "EntranceSettings") -> h2.settings.Settings:
    """The SETTINGS this server announces: the entrance's stream and header limits."""
    codes = h2.settings.SettingCodes
    return h2.settings.Settings(client=False, initial_values={
        codes.MAX_CONCURRENT_STREAMS: settings.h2_max_streams,
        codes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
        codes.MAX_HEADER_LIST_SIZE: settings.max_header_bytes})


def refuse_misdirected(tls: TLSSession | None, host: str) -> None:
    """Raise Rejection 421 for a stream whose host another certificate serves than the
    one the connection's SNI chose (a coalesced connection: RFC 9110 §15.5.20, Gateway
    API's HTTPSListenerDetectMisdirectedRequests)."""
    if tls is not None and tls.misdirected(host):
        raise Rejection(421, "host served under another certificate than the "
                             "connection's SNI chose")


def to_request(fields: Fields, stream: H2Stream, ended: bool,
               max_headers: int, entrance: str, client_ip: str | None,
               scheme: str) -> Request:
    """The Request of a stream's header block; raises Rejection for one that is
    malformed (:mod:`proxy.entrances.h2fields`) or not served."""
    head = read_head(fields, max_headers)
    method = served_method("1.1", head.method)
    path, query, _ = split_target(head.path, method)
    authority = head.authority or head.host or b""
    if not authority or not valid_host(authority):
        raise Rejection(400, "missing or invalid :authority")
    body = stream.make_body(head.length, ended)
    return Request(method, path, query, authority.decode("latin-1"), head.headers, body,
                   entrance, client_ip, scheme, "2", None,
                   not query and b"?" in head.path)  # "/p?" goes upstream as it came
