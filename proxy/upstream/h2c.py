"""HTTP/2 to backends: cleartext with prior knowledge (h2c), or over TLS with ALPN ``h2``.

``"protocol": "h2c"`` backends (Knative h2c revisions, gRPC services)
speak HTTP/2 with prior knowledge; a BackendTLSPolicy (``tls``) or an ``https`` URL
makes it HTTP/2 over TLS, offered by ALPN. :class:`H2Pool` is the
:class:`proxy.upstream.pool.Pool` for them: the same ``start`` (listener) and ``send``
(awaiting) contracts, the same :class:`UpstreamError` reasons (dial / tls / timeout /
canceled / other). This module is the pool; a connection is
:class:`proxy.upstream.h2link.Link`, a stream :class:`proxy.upstream.h2stream.H2Response`.

- **One connection, many streams.** Every concurrent exchange of a pool is a stream on
  one connection; another connection is opened only when the backend's
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
  retried once on a fresh stream when :func:`proxy.upstream.base.retry_unanswered` allows
  it, the rule the HTTP/1.1 pool follows too.
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
from typing import Final

from proxy.request import Body, ByteStream, Headers
from proxy.upstream.base import (
    DIAL_TIMEOUT, IDLE_TIMEOUT, MAX_IDLE, BackendResponse, Interim, PoolKey,
    UpstreamError, retry_unanswered, within_route)
from proxy.upstream.dial import dial_tcp, open_over
from proxy.upstream.h2link import Link
from proxy.upstream.h2stream import H2Response, Unanswered
from proxy.upstream.pool import Pool
from proxy.upstream.request import UpstreamRequest

log = logging.getLogger("tunnelgate.h2c")

PING_AFTER: Final = 30.0  # PING after 30 s without a frame from the backend
PING_TIMEOUT: Final = 15.0  # ... and give up on the connection 15 s later
KEEPALIVE: Final = 30  # seconds: TCP keepalive idle time and probe interval


def _keepalive(sock: socket.socket) -> None:
    """TCP keepalive as Go's dialer sets it for h2c backends."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name in ("TCP_KEEPIDLE", "TCP_KEEPINTVL"):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, KEEPALIVE)



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
        self._links: list[Link] = []  # connections that take new streams, oldest first
        self._dialing: asyncio.Future[Link] | None = None
        self.closing = False  # close() was called: connections end when idle

    @property
    def over_tls(self) -> bool:
        return self._tls is not None

    def state(self) -> dict[str, int]:
        """HTTP/2 connections now: ``idle`` (no stream) and ``busy``, plus ``streams``."""
        busy = sum(1 for link in self._links if link.streams.by_id)
        return {"idle": len(self._links) - busy, "busy": busy,
                "streams": sum(len(link.streams.by_id) for link in self._links)}

    def start(self, request: UpstreamRequest) -> None:
        """Send ``request`` as a stream; its answer goes to ``request.listener``, the
        contract every upstream speaks (:mod:`proxy.upstream.request`). A task relays
        it (streams share a connection: each waits on its own), held as
        ``request.dial`` so that ``request.cancel()`` ends it."""
        request.dial = asyncio.get_running_loop().create_task(self._relay(request))

    async def _relay(self, request: UpstreamRequest) -> None:
        listener = request.listener
        try:
            response = await self._stream(request.method, request.target,
                                          request.headers, request.body,
                                          request.head_timeout)
        except UpstreamError as exc:
            listener.on_error(exc)
            return
        failed = response.failed
        if failed is not None:
            # The head parsed but what came with it did not: nothing was relayed yet.
            response.close()
            listener.on_error(failed)
            return
        source = StreamSource(response)
        ended = False
        try:
            listener.on_head(source, response.status, response.reason, response.headers,
                             response.length)
            whole = response.whole_body()
            if whole is not None:
                # All of the answer is here: it goes out as one (a gRPC trailers-only
                # answer must stay one HEADERS frame that ends the stream).
                if whole and not request.cancelled:
                    listener.on_body(whole)
            else:
                listener.on_read_end()
                while not request.cancelled and (chunk := await source.read()):
                    listener.on_body(chunk)
                    listener.on_read_end()
            ended = not request.cancelled
        except UpstreamError as exc:
            listener.on_error(exc)
            return
        finally:
            if not ended:
                response.close()  # (given up: the stream must not keep its window)
        if ended:
            listener.on_end(response.trailers)

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
        return await self._stream(method, target, headers, body, head_timeout)

    async def _stream(self, method: str, target: str, headers: Headers, body: Body,
                      head_timeout: float | None) -> H2Response:
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
            except Unanswered as exc:
                if retried or not retry_unanswered(method, body.length, exc.processed):
                    exc.error.unanswered = True  # (a connection error to retries)
                    raise exc.error from None
                log.debug("%s:%d: stream unanswered (%s), retrying once",
                          self.key.host, self.key.port, exc.error)
                retried = True

    async def _link(self) -> Link:
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

    def _dialed(self, dialing: asyncio.Future[Link]) -> None:
        self._dialing = None
        if not dialing.cancelled():
            dialing.exception()  # retrieved: every waiter gets it through the shield

    async def _open(self) -> Link:
        """Dial, TLS (ALPN h2), and wait for the backend's SETTINGS."""
        loop = asyncio.get_running_loop()
        key = self.key
        where = f"{key.host}:{key.port}"
        sock = await dial_tcp(loop, key, self.dial_timeout)
        _keepalive(sock)
        _, link = await open_over(loop, key, self._tls, lambda: Link(self), sock,
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

    def drop(self, link: Link) -> None:
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


class StreamSource:
    """An HTTP/2 stream as its listener's :class:`~proxy.upstream.request.ResponseSource`:
    reading waits while the listener paused it."""

    def __init__(self, response: H2Response) -> None:
        self.response = response
        self.loop = response.link.loop
        self._flowing: asyncio.Future[None] | None = None  # resolved by resume()

    def pause(self) -> None:
        if self._flowing is None:
            self._flowing = self.loop.create_future()

    def resume(self) -> None:
        flowing, self._flowing = self._flowing, None
        if flowing is not None and not flowing.done():
            flowing.set_result(None)

    def detach(self) -> ByteStream:
        return self.response.detach()  # (refused: HTTP/2 has no 101)

    async def read(self) -> bytes:
        if self._flowing is not None:
            await self._flowing
        return await self.response.read()
