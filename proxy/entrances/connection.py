"""A client connection's transport side, below HTTP: admission (connection limit,
allow list, PROXY header), the protocol sniffed, the raw stream after a switch, the
timers the entrance sweeps, and the two ways it ends on its own (an error answer, a
lingering close). Its state is its sans-IO core's
(:class:`proxy.wire.server.ServerConnection`), which the transport's events move too.
:class:`proxy.entrances.http1.HTTP1Protocol` builds the requests on top.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable, Final

from proxy.entrances import h2sniff, proxyproto
from proxy.entrances.admission import (over_limit, peer_allowed, plain_ip,
                                       read_proxy_header)
from proxy.entrances.tls import TLSSession, session_of
from proxy.flow.control import BODY, HELD, UPGRADE, FlowControl, GuardedOutput
from proxy.flow.stream import TransportStream
from proxy.wire.head import error_response
from proxy.wire.server import Event, ServerConnection, State

if TYPE_CHECKING:
    from proxy.entrances.listener import Entrance

log = logging.getLogger("tunnelgate.http1")

NO_TIMER: Final = 0
HEAD_TIMER: Final = 1
IDLE_TIMER: Final = 2
LINGER_TIMER: Final = 3
BODY_TIMER: Final = 4
LINGER_TIMEOUT: Final = 2.0  # longest wait for a client's EOF after a close-after-answer
LINGER_LIMIT: Final = 256 * 1024  # most bytes read and dropped meanwhile
# Connections past an entrance's limit that get a 503 (each lingers); past these, reset.
REFUSALS_ANSWERED: Final = 64
_NEVER: Final = float("inf")


def _nothing() -> None:
    """A body's hold or release once its connection is gone."""


class ClientConnection(GuardedOutput):
    """One client connection of an entrance, up to the first HTTP byte and down from
    the decision to close.

    ``core`` holds the connection's state and parses its requests. ``deadline`` is
    when the armed timer (one of ``*_TIMER``, in ``timer_kind``) expires; the
    entrance's sweep calls ``timed_out``.
    """

    def __init__(self, entrance: Entrance) -> None:
        self.entrance = entrance
        self.settings = entrance.settings
        self.loop = entrance.loop
        self.transport: asyncio.Transport | None = None
        self.flow: FlowControl = None  # type: ignore[assignment]  # set on connect
        self.core = ServerConnection(
            self.settings, self._misdirected if self.settings.scheme == "https" else None)
        self.closing = False
        self.refusal = False  # refused at the connection limit (see _refuse_over_limit)
        self.draining = entrance.draining  # answer with Connection: close, then close
        self.client_ip: str | None = None
        # Over TLS with SNI: the certificate the handshake chose (421 for a request
        # naming a host another certificate serves); else None.
        self.tls: TLSSession | None = None
        self.deadline = _NEVER  # loop time the current timer expires
        self.timer_kind = NO_TIMER
        self._proxy_buf: bytearray | None = None  # PROXY: the header so far
        self._linger_left = 0  # LINGERING: bytes still dropped before closing
        self._stream: TransportStream | None = None  # UPGRADED: the raw stream
        self._first = b""  # NEW: a beginning of the HTTP/2 preface, until it is whole
        # What a request body's buffer calls to hold reading back and let it go, bound
        # once here rather than twice per body (a reference cycle: see unbind).
        self.hold_body: Callable[[], None] = self._hold_body
        self.release_body: Callable[[], None] = self._release_body

    def _hold_body(self) -> None:
        self.flow.pause_reading(BODY)

    def _release_body(self) -> None:
        self.flow.resume_reading(BODY)

    def unbind(self) -> None:
        """Drop the callbacks bound to this connection (it is gone), so that it is
        freed by reference counting alone."""
        self.hold_body = self.release_body = _nothing

    def _misdirected(self, host: str) -> bool:
        return self.tls is not None and self.tls.misdirected(host)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.attach(transport)  # type: ignore[arg-type]  # a stream transport
        self.flow = FlowControl(transport)  # type: ignore[arg-type]
        entrance = self.entrance
        if over_limit(entrance):
            self._refuse_over_limit()
            return
        entrance.add(self)  # type: ignore[arg-type]  # the entrance's protocols
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.client_ip = plain_ip(peer[0])
        if not peer_allowed(self.settings, self.client_ip):
            self.abort()
            return
        if self.settings.scheme == "https":  # (the handshake is over by now)
            self.tls = session_of(transport.get_extra_info("ssl_object"))
        if self.settings.proxy_protocol:
            self._proxy_buf = bytearray()
            self.core.handle(Event.PROXY_EXPECTED)
        elif h2sniff.alpn_h2(transport):
            self._hand_over(b"")  # TLS chose HTTP/2 (ALPN, RFC 9113 §3.2)
            return
        self.arm(HEAD_TIMER)

    def _refuse_over_limit(self) -> None:
        """The entrance holds its most connections: a ``503`` with ``Connection:
        close``, written before anything is read, then a lingering close, so the client
        (or its load balancer) learns why. While ``REFUSALS_ANSWERED`` refused ones
        still linger, a flood is reset without an answer: each answer holds its socket
        for up to ``LINGER_TIMEOUT``."""
        entrance = self.entrance
        settings = self.settings
        if settings.refused is not None:
            settings.refused(settings.name)
        if entrance.refusing >= REFUSALS_ANSWERED:
            self.abort()
            return
        self.refusal = True
        entrance.refusing += 1
        entrance.add(self)  # type: ignore[arg-type]  # (swept: the linger timer)
        self.send_error(503)

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def received_aside(self, state: State, data: bytes) -> bytes:
        """Bytes that arrived while no HTTP is parsed: before it began, after it ended
        (upgraded, rejected, lingering); returns what is left to parse (only when HTTP
        began now)."""
        if state is State.UPGRADED:
            assert self._stream is not None
            self._stream.feed(data)
        elif state is State.LINGERING:
            self._linger_left -= len(data)
            if self._linger_left < 0:
                self.close()  # lingered long enough: the rest is not worth reading
        elif state is State.PROXY:
            return self._read_proxy_header(data)
        elif state is State.NEW:
            return self._first_bytes(data)
        return b""  # rejected (or closed): dropped

    def _first_bytes(self, data: bytes) -> bytes:
        """The first bytes (after any PROXY header) tell the protocol: HTTP/2 when
        they are its preface (prior knowledge, RFC 9113 §3.3), else HTTP/1.1, parsed
        from here on with nothing more to look at."""
        if self._first:
            data, self._first = self._first + data, b""
        if proxyproto.looks_like_header(data):
            log.info("%s entrance: PROXY header on a connection that expects none: "
                     "closing without an answer", self.settings.name)
            self.close()
            return b""
        kind = h2sniff.sniff(data)
        if kind == h2sniff.PARTIAL:
            self._first = data
            return b""
        if kind == h2sniff.HTTP2:
            self._hand_over(data)
            return b""
        self.core.handle(Event.HTTP1)
        return data

    def _hand_over(self, data: bytes) -> None:
        """Serve HTTP/2 on this transport from now on; this protocol lets go of it
        as if the connection had ended (nothing of HTTP/1.1 was parsed)."""
        transport = self.transport
        assert transport is not None
        served = h2sniff.serve_h2(self.entrance, self.client_ip)
        self.connection_lost(None)
        transport.set_protocol(served)
        served.adopt(transport, data)

    def connection_lost(self, exc: Exception | None) -> None:
        """(The subclass's) the transport is gone, or was handed over."""
        raise NotImplementedError

    def _read_proxy_header(self, data: bytes) -> bytes:
        """Collect the PROXY header; once complete, parse on from after it."""
        buf = self._proxy_buf
        assert buf is not None
        try:
            header = read_proxy_header(buf, data, self.settings)
        except proxyproto.ProxyHeaderError:
            self.close()
            return b""
        if header is None:
            return b""
        self._proxy_buf = None
        if header.source is not None:
            self.client_ip = plain_ip(header.source[0])
        self.core.handle(Event.PROXY_READ)
        rest = bytes(buf[header.consumed:])
        return self._first_bytes(rest) if rest else b""

    def opening(self) -> bool:
        """Whether part of a PROXY header (or of the HTTP/2 preface) arrived (the
        connection is not idle)."""
        return bool(self._proxy_buf) or bool(self._first)

    # -- upgrade

    def switch_protocols(self) -> TransportStream:
        """Hand the raw connection to an upgraded stream (after the 101 was written)."""
        assert self.transport is not None
        self.disarm()
        self._stream = TransportStream(self.transport, self.flow, self.core.switch())
        self.flow.resume_reading(UPGRADE)
        return self._stream

    # -- ending

    def linger(self) -> None:
        """Close after an answer while the client is still sending its body.

        Closing a socket with unread input makes the kernel reset the connection, and
        a reset can destroy the answer before the client read it (RFC 9112 §9.6). So
        the sending side is shut down, the client's bytes are read and dropped (parse
        nothing more), and the socket closes on the client's EOF, after
        ``LINGER_TIMEOUT`` or after ``LINGER_LIMIT`` bytes, whichever comes first.
        """
        assert self.transport is not None
        self.closing = True
        self.core.handle(Event.LINGER)
        self._linger_left = LINGER_LIMIT
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_all()
        self.arm(LINGER_TIMER)

    def hold_reading(self, seconds: float) -> None:
        """Read nothing more from this client for ``seconds`` (what it sends meanwhile
        waits in the kernel's buffer, costing the loop nothing)."""
        self.flow.pause_reading(HELD)
        self.loop.call_later(seconds, self.flow.resume_reading, HELD)

    def send_error(self, status: int) -> None:
        """Answer with the canned error ``status`` and close by lingering: the proxy
        answers this way only while the request it refuses (or one behind it) may still
        be arriving, and a close with unread input would reset the connection under the
        answer (see :meth:`linger`)."""
        self.write(error_response(status, self.entrance.dates.line()))
        self.linger()

    # -- timers

    def body_progress(self, waiting: bool = True) -> None:
        """A pushed request body moved (or stopped being the client's to move): the
        longest pause in it is ``body_timeout``, counted only while the backend side
        is ready for more."""
        if waiting:
            self.arm(BODY_TIMER)
        elif self.timer_kind == BODY_TIMER:
            self.disarm()

    def arm(self, kind: int) -> None:
        """Set the one timer. The head timer is armed once a read left a head
        incomplete, not at a head's first byte: a head read whole starts with no timer
        (until then the sweep leaves a connection that has a request alone), which
        saves an arm per request (callgrind, 2026-12-07)."""
        settings = self.settings
        delay = (settings.header_timeout if kind == HEAD_TIMER
                 else LINGER_TIMEOUT if kind == LINGER_TIMER
                 else settings.body_timeout if kind == BODY_TIMER
                 else settings.idle_timeout)
        self.timer_kind = kind
        entrance = self.entrance
        self.deadline = entrance.swept + entrance.interval + delay  # (see Entrance)

    def disarm(self) -> None:
        self.timer_kind = NO_TIMER
        self.deadline = _NEVER
