"""The contract between an entrance and the Handler.

An entrance (HTTP/1.1 listener, tunnel bridge, ...) turns what it received into a
:class:`Request` and hands the Handler a :class:`Responder`. The Handler never sees a
socket; the entrance never sees the routing table. Everything here is transport-free.

Headers are lists of ``(name, value)`` byte pairs, names in the case the peer sent them,
in arrival order, one pair per header line (repeated names stay separate pairs).
"""

from __future__ import annotations

from typing import Awaitable, Callable, Final, Protocol

# One (name, value) pair per field line. Typed as a variable-length tuple on purpose:
# the compiled build keeps such a tuple as the object it is, where a fixed-length one
# is unpacked into a C struct when read and allocated anew when stored into a list,
# once per field on every pass that copies a header list. Every pair has two items.
Header = tuple[bytes, ...]
Headers = list[Header]
# A piece of a response body on its way to the client: ``bytes``, or a memoryview of
# the buffer a backend read filled (a large Content-Length body is relayed without
# being copied out of it). A responder that keeps a piece past the call keeps the
# buffer alive, and no later read overwrites it; one that needs ``bytes`` converts.
Piece = bytes | memoryview


class Body(Protocol):
    """A request body, streamed.

    ``length`` is the declared Content-Length, or ``None`` when the length is not known
    in advance (chunked, or an in-process request fed from an iterator). A request
    without a body has ``length == 0`` and ``read()`` returns ``b""`` at once.

    A body may also have ``trailers``, the trailer fields of a chunked request, complete
    once ``read()`` returned ``b""``; it is optional (read it with ``getattr``), so
    bodies that never have trailers need not declare it.
    """

    length: int | None

    async def read(self) -> bytes:
        """Return the next chunk; ``b""`` once the body is complete.

        Raises :class:`BodyError` when the client vanished or sent a malformed body
        before the end.
        """
        ...


class BodyError(Exception):
    """The request body could not be read to its end (client gone, bad framing)."""


class ByteStream(Protocol):
    """The raw byte stream of an upgraded connection (WebSocket after the 101)."""

    async def read(self) -> bytes:
        """Next bytes from the peer; ``b""`` at end of stream."""
        ...

    async def write(self, data: bytes) -> None:
        """Send bytes, waiting while the peer's buffer is above its high-water mark."""
        ...

    def close(self) -> None:
        """Close the stream; idempotent."""
        ...


class Done:
    """Hears that an exchange is over (a base class, for the same reason as
    :class:`Responder`; an entrance's responder usually is it, hence its base)."""

    __slots__ = ()

    def exchange_over(self, error: BaseException | None) -> None:
        """The exchange ended (answered, failed or cancelled); ``error`` is the
        exception that broke it off, if one did."""
        raise NotImplementedError


class Responder(Done):
    """How the Handler answers. One responder per request; the entrance frames bytes.

    Call order: either ``respond`` once, or ``start`` then any number of ``push`` (or
    ``write``) then ``finish``, or ``upgrade`` once. ``start``'s headers carry
    end-to-end headers only; the entrance adds framing (Content-Length/chunked) and
    connection headers. A ``Content-Length`` present in ``start``'s headers is
    honoured as the body length.

    A streamed body is relayed without waiting: ``push`` queues bytes, ``flush`` sends
    what is queued (the head goes out with the first bytes, or at the end of the loop
    turn), and while ``congested`` is true the caller stops producing until
    ``when_writable``'s callback runs. ``write`` is the same for a coroutine: it
    queues, flushes and waits while the client is slow.

    A base class to subclass (the entrances' responders do), not a protocol: the
    Handler's half a dozen calls per request are then direct ones in the compiled
    build, where a protocol's are looked up by name on every call. Measured: with
    this, :class:`Serve`, ``ResponseListener`` and ``Deferred`` as protocols, a
    proxied request took 4,000-4,700 more instructions and 4-6 % more CPU in five of
    six paired figures (benchmarks/RESULTS.md, "Fast paths", 2026-12-07).
    """

    __slots__ = ()

    aborted: bool
    """True once the client went away; writes after that are dropped silently."""

    relays_interim: bool
    """Whether :meth:`interim` can send anything (a backend's 1xx are relayed then)."""

    def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        """Send a complete response with this body (Content-Length set by the entrance)."""
        raise NotImplementedError

    def start(self, status: int, headers: Headers) -> None:
        """Begin a streamed response."""
        raise NotImplementedError

    def push(self, data: Piece) -> None:
        """Queue body bytes (never past a declared Content-Length)."""
        raise NotImplementedError

    def interim(self, status: int, headers: Headers) -> None:
        """Relay an interim answer (102, 103, ...) before the final one, where the
        client can take it."""
        raise NotImplementedError

    def flush(self) -> None:
        """Send everything queued now."""
        raise NotImplementedError

    @property
    def congested(self) -> bool:
        """The client is not taking bytes as fast as they come: stop pushing."""
        raise NotImplementedError

    def when_writable(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the client drained (or is gone: check ``aborted``)."""
        raise NotImplementedError

    async def write(self, data: bytes) -> None:
        """Send body bytes, waiting while the client's buffer is above its high-water mark."""
        raise NotImplementedError

    def finish(self, trailers: Headers | None = None) -> None:
        """End the response. Trailers are sent only where the framing allows them."""
        raise NotImplementedError

    def abort(self) -> None:
        """Give up on a started response: close the client connection without a clean
        end, so a truncated body can never be mistaken for a complete one."""
        raise NotImplementedError

    async def upgrade(self, headers: Headers) -> ByteStream:
        """Answer ``101 Switching Protocols`` with these headers, then yield the raw stream.

        Any bytes the client sent after the request head come out of the stream's first
        reads. Request timeouts stop applying once this returns.
        """
        raise NotImplementedError


class Running(Protocol):
    """A request the Handler is serving (what :meth:`Serve.start` returns)."""

    def cancel(self) -> object:
        """The client is gone: stop working on the request (no answer is owed)."""
        ...


class Serve:
    """The Handler as an entrance drives it without a task (a base class, for the
    same reason as :class:`Responder`)."""

    __slots__ = ()

    def start(self, request: Request, responder: Responder, done: Done) -> Running:
        """Serve ``request``; ``done`` hears once, when the exchange is over
        (:meth:`Done.exchange_over`), possibly before this returns."""
        raise NotImplementedError


class Request:
    """One HTTP request as the Handler sees it, whatever entrance it came through.

    ``path`` and ``query`` are the raw (still percent-encoded) target split at the first
    ``?``; ``query`` excludes the ``?``. ``host`` is the Host the client asked for
    (authority of an absolute-form target, else the Host header), port included as sent.
    ``client_ip`` is the address the entrance vouches for (socket peer, PROXY protocol
    source, or ``CF-Connecting-IP`` on the tunnel entrance only); ``None`` if unknown.
    ``scheme`` is the scheme the original client used, as far as the entrance knows.
    ``upgrade`` is the lower-cased Upgrade token when the request asks to switch
    protocols (Connection: upgrade + Upgrade: X), else ``None``.
    ``empty_query`` says the target had a ``?`` with nothing after it: ``query`` is
    ``""`` then as for a target without one, but the two are different URIs (RFC 3986
    §6.2.3 keeps them apart, and so may a backend), so the target goes on as it came.
    """

    __slots__ = (
        "method", "path", "query", "host", "headers", "body", "entrance",
        "client_ip", "scheme", "http_version", "upgrade", "empty_query",
    )

    def __init__(
        self,
        method: str,
        path: str,
        query: str,
        host: str,
        headers: Headers,
        body: Body,
        entrance: str,
        client_ip: str | None = None,
        scheme: str = "http",
        http_version: str = "1.1",
        upgrade: str | None = None,
        empty_query: bool = False,
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.host = host
        self.headers = headers
        self.body = body
        self.entrance = entrance
        self.client_ip = client_ip
        self.scheme = scheme
        self.http_version = http_version
        self.upgrade = upgrade
        self.empty_query = empty_query

    def header(self, lower_name: bytes) -> bytes | None:
        """First value of a header, looked up by its lower-case name."""
        for name, value in self.headers:
            if len(name) == len(lower_name) and name.lower() == lower_name:
                return value
        return None

    def __repr__(self) -> str:
        return f"<Request {self.entrance} {self.method} {self.host}{self.path}>"


class _EmptyBody:
    """The body of a request that has none."""

    length: int | None = 0

    async def read(self) -> bytes:
        return b""


EMPTY_BODY: Final[Body] = _EmptyBody()


class BytesBody:
    """A body held in memory (tests, the in-process bridge, a replayed mirror body)."""

    def __init__(self, data: bytes, *, declare_length: bool = True) -> None:
        self._data = data
        self.length = len(data) if declare_length else None

    async def read(self) -> bytes:
        data, self._data = self._data, b""
        return data


Handle = Callable[[Request, Responder], Awaitable[None]]
"""The Handler as a coroutine (the in-process bridge and tests await it). An entrance
given one that is also a :class:`Serve` (the Handler) drives that instead."""
