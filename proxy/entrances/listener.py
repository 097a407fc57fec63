"""A listening entrance (HTTP/1.1, and HTTP/2 on the same port): its settings, what its
connections share, the server."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import ssl
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from proxy.entrances.admission import ReadShedder
from proxy.entrances.http1 import HTTP1Protocol
from proxy.flow.clock import WALL_CLOCK
from proxy.flow.turn import TurnEnd
from proxy.observability.logs import RateLimit
from proxy.request import Handle, Request, Serve
from proxy.wire.framing import DateLine
from routing.model import TUNNEL

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(slots=True)
class EntranceSettings:
    """Per-entrance listener settings (limits are always on).

    ``prepare`` runs on every request before the Handler (the composition root sets it
    per entrance, e.g. trust rules); it may edit the request in place.
    ``allow`` restricts socket peer addresses (a PROXY-claimed source is not trusted
    for this); a refused connection is closed at once. Unix-socket peers have no address and are not
    filtered (the socket's file mode guards them).
    ``rejected(entrance, status, reason, client_ip)`` is told of every request this
    side answers itself (malformed: 4xx; head not in time: 408), for logs and metrics;
    ``refused(entrance)`` of every connection refused at ``max_connections``.
    ``shedder`` (only while load shedding is on) answers a request read over the
    proxy's limit before it is parsed (:func:`proxy.entrances.admission.shed_at_read`).
    """

    name: str = TUNNEL
    header_timeout: float = 10.0  # complete request head, from connection open / 1st byte
    idle_timeout: float = 120.0  # keep-alive wait between requests (see --idle-timeout)
    body_timeout: float = 300.0  # longest pause in a request body the Handler waits on
    send_timeout: float = 60.0  # longest wait for a client to take response bytes
    max_request_line: int = 8 * 1024
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    max_connections: int = 10_000
    proxy_protocol: bool = False
    prepare: Callable[[Request], None] | None = None
    allow: list[IPNetwork] | None = None
    scheme: str = "http"
    rejected: Callable[[str, int, str, str | None], None] | None = None
    refused: Callable[[str], None] | None = None
    shedder: ReadShedder | None = None  # load shedding at the read (admission.py)
    # Start a request without a body at the end of the loop turn, with the others read
    # in it (proxy.entrances.http1.TurnStart), rather than as soon as its head is read.
    batch_requests: bool = True
    # HTTP/2 (proxy.entrances.h2server): nginx's defaults.
    h2_max_streams: int = 128  # SETTINGS_MAX_CONCURRENT_STREAMS (http2_max_concurrent_streams)
    h2_max_requests: int = 1000  # streams per connection, then GOAWAY (keepalive_requests)


class Member(Protocol):
    """A connection of an entrance, whatever its protocol (HTTP/1.1 or HTTP/2): what
    the sweep and the drain ask of it."""

    deadline: float  # loop time its armed timer expires (inf: none)

    def timed_out(self) -> None: ...

    def drain(self) -> None: ...


class Entrance:
    """What every connection of one listener shares, including one coarse timer.

    Connections keep their header/idle/body deadline as a number; a sweep every
    ``interval`` seconds closes the expired ones. Re-arming a deadline per request is
    then a float store instead of a timer handle created and cancelled (hot path).
    A deadline counts from ``swept``, the loop time of the last sweep, plus one
    ``interval`` (reading the loop's clock per arm cost ~230 instructions, twice a
    request; callgrind, 2026-12-07): it fires up to two ``interval`` late, a fifth of
    the shortest timeout each, at most 1 s; early only by as much as the loop lags.
    """

    __slots__ = ("handle", "serve", "settings", "connections", "loop", "clock", "interval",
                 "draining", "refusals", "refusing", "turn_end", "_sweeper", "dates", "swept")

    def __init__(self, handle: Handle, settings: EntranceSettings,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.handle = handle
        # A Handler that can be driven by callbacks (proxy.request.Serve) is, with no
        # task per request; a plain coroutine function runs in a task. (Tested as an
        # ``object``: a value typed as the coroutine function could not be a Serve.)
        candidate: object = handle
        self.serve: Serve | None = candidate if isinstance(candidate, Serve) else None
        self.settings = settings
        self.connections: set[Member] = set()
        self.loop = loop
        self.clock: Callable[[], float] = loop.time
        self.swept = loop.time()  # when the last sweep ran (or the sweeps began)
        shortest = min(settings.header_timeout, settings.idle_timeout,
                       settings.body_timeout)
        self.interval = min(1.0, max(0.01, shortest / 5))
        self.draining = False
        self.refusals = RateLimit()  # connections refused at max_connections
        # Of ``connections``, those refused (answered 503, lingering): not counted
        # against the limit, so a refused client cannot hold a slot.
        self.refusing = 0
        self.turn_end = TurnEnd()  # requests read this turn start at its end
        self._sweeper: asyncio.TimerHandle | None = None
        self.dates = DateLine(WALL_CLOCK)  # the Date line of responses lacking one

    def add(self, conn: Member) -> None:
        self.connections.add(conn)
        if self._sweeper is None:
            self.swept = self.clock()
            self._sweeper = self.loop.call_later(self.interval, self._sweep)

    def discard(self, conn: Member) -> None:
        self.connections.discard(conn)

    def drain(self) -> None:
        """Graceful shutdown of the open connections: idle ones close
        now; every other one ends after the response it is serving, which says
        ``Connection: close`` unless its head already went out. Connections accepted
        later behave the same."""
        self.draining = True
        for conn in list(self.connections):
            conn.drain()

    def _sweep(self) -> None:
        self._sweeper = None
        now = self.swept = self.loop.time()
        for conn in [c for c in self.connections if c.deadline <= now]:
            conn.timed_out()
        if self.connections:
            self._sweeper = self.loop.call_later(self.interval, self._sweep)



class EntranceServer(asyncio.AbstractServer):
    """A listening entrance: the asyncio server plus :meth:`drain` for the connections
    it accepted. Closing it stops accepting; live connections carry on."""

    def __init__(self, server: asyncio.AbstractServer, entrance: Entrance) -> None:
        self._server = server
        self._entrance = entrance

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._server.sockets)  # type: ignore[attr-defined]

    def drain(self) -> None:
        """Close idle keep-alive connections now, the others after their current
        response (sent with ``Connection: close``)."""
        self._entrance.drain()

    def close(self) -> None:
        self._server.close()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._server.get_loop()

    def is_serving(self) -> bool:
        return self._server.is_serving()

    async def start_serving(self) -> None:
        await self._server.start_serving()

    async def serve_forever(self) -> None:
        await self._server.serve_forever()

    async def wait_closed(self) -> None:
        await self._server.wait_closed()


async def serve_entrance(
    handle: Handle,
    settings: EntranceSettings,
    *,
    host: str | None = None,
    port: int | None = None,
    path: str | None = None,
    sock: socket.socket | None = None,
    reuse_port: bool = False,
    tls: ssl.SSLContext | None = None,
) -> EntranceServer:
    """Listen for HTTP/1.1 (and HTTP/2 with prior knowledge, or by ALPN over TLS) on TCP ``host:port``, a unix socket ``path`` (mode 0660,
    a stale socket file is replaced) or an already bound ``sock``; serve with ``handle``.
    ``tls``: the connections are TLS first (``proxy.entrances.tls``); the handshake
    must end within the header timeout.

    Returns the started server; closing it stops accepting (live connections finish),
    ``drain()`` also ends its keep-alive connections gracefully.
    """
    loop = asyncio.get_running_loop()
    entrance = Entrance(handle, settings, loop)

    def factory() -> HTTP1Protocol:
        return HTTP1Protocol(entrance)

    server: asyncio.AbstractServer
    secure: dict[str, Any] = {} if tls is None else {
        "ssl": tls, "ssl_handshake_timeout": settings.header_timeout}
    if path is not None:
        if os.path.exists(path):
            os.unlink(path)
        server = await loop.create_unix_server(factory, path, backlog=1024)
        os.chmod(path, 0o660)
    elif sock is not None:
        server = await loop.create_server(factory, sock=sock, backlog=1024, **secure)
    else:
        server = await loop.create_server(
            factory, host, port or 0, backlog=1024, reuse_port=reuse_port or None,
            **secure)
    return EntranceServer(server, entrance)
