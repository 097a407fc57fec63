"""What every upstream pool shares: the pool key, the failure type, the timeouts.

A backend is reached through one pool per :class:`PoolKey` (scheme, host, port,
protocol, TLS identity). Failures surface as :class:`UpstreamError`, whose ``reason``
is a backend-error metric reason (``dial``, ``tls``, ``timeout``, ``other``,
``canceled``); the Handler maps dial/tls/other to 502 and timeout to 504.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable, Final, Protocol, TypeVar

from proxy.request import ByteStream, Headers
from routing.model import BackendTLS
from routing.values import split_backend_url

T = TypeVar("T")

if TYPE_CHECKING:
    from routing.model import Backend


DIAL_TIMEOUT: Final = 5.0  # TCP connect, and again for a TLS handshake. Go's dialer allows 30 s;
# 5 s fails fast enough for a 502 to beat client timeouts while tolerating a slow SYN.
# Idle keep-alive connections kept per pool, at most. A pool keeps every connection an
# exchange released, up to this bound: reuse takes the newest, so those beyond what the
# recent concurrency needs stay unused and expire after IDLE_TIMEOUT. A smaller cap
# (it was 64) closes connections a load above it dials again a moment later: at 100
# concurrent requests, 18,000 dials in 5 s and as many sockets in TIME_WAIT.
MAX_IDLE: Final = 1024
IDLE_TIMEOUT: Final = 60.0  # an idle connection older than this is closed
# The wait for a response head when the route sets no timeout (nginx's
# proxy_read_timeout is 60 s too); ``--response-header-timeout`` changes it.
RESPONSE_HEADER_TIMEOUT: Final = 60.0

# RFC 9110 §9.2.2: safe to repeat after a connection failure.
IDEMPOTENT: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})

Interim = Callable[[int, Headers], None]
"""Receives a backend's 1xx interim response other than 100 and 101 (status, fields)."""


class UpstreamError(Exception):
    """The backend could not be used; ``reason`` is a backend-error metric reason.
    ``status``, when set, is the answer the client gets instead of the reason's.
    ``unanswered``: the connection (or stream) was closed or reset before a single
    response byte (a connection error for retries, as a refused dial is)."""

    def __init__(self, reason: str, message: str, status: int = 0,
                 unanswered: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status
        self.unanswered = unanswered


async def within_route(dialing: Awaitable[T], route: float | None, limit: float,
                       where: str) -> T:
    """What ``dialing`` (a new backend connection, bounded by ``limit`` itself) gives,
    bounded by the route's timeout as well when that is the shorter (GEP-1742: the
    request timeout covers as much of the exchange as it can). Its expiry is a timeout
    (504), not a dial error after ``limit``."""
    if not route or route >= limit:
        return await dialing
    try:
        async with asyncio.timeout(route):
            return await dialing
    except TimeoutError:
        raise UpstreamError("timeout", f"cannot connect to {where} within the route's "
                                       "timeout") from None


class BackendResponse(Protocol):
    """What a pool's ``send`` returns and the Handler reads: a backend's response whose
    head arrived, its body still coming (HTTP/1.1 or an HTTP/2 stream alike)."""

    status: int
    reason: str
    """The reason phrase; empty over HTTP/2, which has none."""
    headers: Headers
    length: int | None
    """Declared Content-Length, or None (chunked, read to EOF, or HTTP/2 without it)."""
    trailers: Headers
    """Trailer fields, complete once :meth:`read` returned ``b""``."""

    @property
    def failed(self) -> UpstreamError | None:
        """The error that already broke the body off, if any: checked before relaying,
        it lets the caller answer 502 instead of a truncated response."""
        ...

    async def read(self) -> bytes:
        """Next body bytes; ``b""`` at the end. Raises UpstreamError when the backend
        breaks the body off."""
        ...

    def whole_body(self) -> bytes | None:
        """The entire body if all of it already arrived and nothing went wrong, else
        None (then :meth:`read` streams it)."""
        ...

    def detach(self) -> ByteStream:
        """The raw stream after a ``101``; raises for any other response (and always
        over HTTP/2, which has no protocol switch)."""
        ...

    def close(self) -> None:
        """Give up on the response; an unfinished exchange ends its connection or
        stream."""
        ...


@dataclass(frozen=True, slots=True)
class PoolKey:
    """What makes two backends share connections."""

    scheme: str
    host: str
    port: int
    protocol: str
    tls: BackendTLS | None


def pool_key(backend: "Backend") -> PoolKey:
    """The pool key of a backend (raises ValueError for an unusable URL)."""
    address = split_backend_url(backend.url)
    return PoolKey(address.scheme, address.host, address.port, backend.protocol,
                   backend.tls)

def expire_head(head: asyncio.Future[None]) -> None:
    if not head.done():
        head.set_exception(UpstreamError("timeout", "backend response headers timed out"))


def retry_unanswered(method: str, body_length: int | None, processed: bool) -> bool:
    """Whether a request whose connection or stream ended before a byte of its answer
    is sent once more: one without a body, that the backend guarantees it never
    processed (RFC 9113 §8.7) or whose method is idempotent (RFC 9110 §9.2.2). Both
    pools follow it, once per request."""
    return body_length == 0 and (not processed or method in IDEMPOTENT)
