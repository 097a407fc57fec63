"""The contract between whoever forwards a request and the upstream connection.

A request for a backend is an :class:`UpstreamRequest`; whoever sends it implements
:class:`ResponseListener` and hears the answer through callbacks, in this order:

- ``on_interim`` for each 1xx other than 100 and 101 (102, 103...), before the head;
- ``on_head`` once, when the final response head arrived, with its
  :class:`ResponseSource` (the connection, or an HTTP/2 stream), so the listener can
  pause and resume reading or take the raw stream of a ``101``;
- ``on_body`` for each piece of the body, then ``on_end`` with the trailer fields;
- or ``on_error`` once instead, at any point before ``on_end`` (no call follows it);
- ``on_read_end`` after each socket read that delivered any of the above: the place to
  flush what was relayed, so a head and a small body leave in one write.

Every kind of backend speaks this contract: an HTTP/1.1 connection calls from its
parser's callbacks (nothing waits), an HTTP/2 pool from the task that relays the
stream. A request body that can push its bytes (:class:`proxy.flow.push.PushBody`, the client
connection's) is streamed through :class:`~proxy.flow.push.BodySink` callbacks too; any
other body is read by a sender task.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from proxy.flow.turn import Deferred
from proxy.request import Body, ByteStream, Headers, Piece
from proxy.upstream.base import Interim

if TYPE_CHECKING:
    from proxy.upstream.http1 import UpstreamConnection


class ResponseSource(Protocol):
    """Where a response's body comes from, as its listener sees it."""

    loop: asyncio.AbstractEventLoop

    def pause(self) -> None:
        """The listener cannot take more body now: stop reading from the backend."""

    def resume(self) -> None:
        ...

    def detach(self) -> ByteStream:
        """The raw stream after a ``101``; raises for any other response."""
        ...


class ResponseListener(Deferred):
    """Hears one backend response (see the module docstring for the order).

    A base class to subclass rather than a protocol: the connection then calls its
    listener directly (a compiled virtual call), four times per response. It is a
    :class:`~proxy.flow.turn.Deferred` too, so that it can finish at the end of the
    loop turn (the compiled build allows a class one base class with code). What
    that saves is measured with :class:`proxy.request.Responder`'s."""

    __slots__ = ()

    def on_interim(self, status: int, headers: Headers) -> None:
        raise NotImplementedError

    def on_head(self, conn: ResponseSource, status: int, reason: str,
                headers: Headers, length: int | None) -> None:
        raise NotImplementedError

    def on_body(self, data: Piece) -> None:
        raise NotImplementedError

    def on_end(self, trailers: Headers) -> None:
        raise NotImplementedError

    def on_error(self, error: Exception) -> None:
        """``error`` is an :class:`~proxy.upstream.base.UpstreamError`."""
        raise NotImplementedError

    def on_read_end(self) -> None:
        raise NotImplementedError


class UpstreamRequest:
    """One request on its way to a backend, and where its answer goes.

    ``head_timeout`` bounds the wait for the response head once the request was sent
    whole; ``dial_timeout``, when a new connection is needed, replaces the pool's (a
    WebSocket handshake has its own); ``interim`` receives 1xx answers other than 100
    and 101 when an :class:`~proxy.upstream.response.UpstreamResponse` listens (a
    listener of its own hears them in ``on_interim``). ``reused`` is set
    when an idle keep-alive connection took it (a stale one is retried once), ``dial``
    while a new connection is being made for it (over HTTP/2: the task that relays the
    whole exchange), ``conn`` once an HTTP/1.1 connection took it;
    ``waiting_since`` is when the pool's sweep first found it waiting for its head
    without a ``head_timeout`` of its own (-1: not yet; see
    :meth:`proxy.upstream.pool.Pool._watch_heads`).
    """

    __slots__ = ("method", "target", "headers", "body", "listener", "head_timeout",
                 "dial_timeout", "interim", "reused", "dial", "conn", "cancelled",
                 "waiting_since")

    def __init__(self, method: str, target: str, headers: Headers, body: Body,
                 listener: ResponseListener, head_timeout: float | None = None,
                 dial_timeout: float | None = None, interim: Interim | None = None) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.listener = listener
        self.head_timeout = head_timeout
        self.dial_timeout = dial_timeout
        self.interim = interim
        self.reused = False
        self.dial: asyncio.Task[None] | None = None
        self.conn: UpstreamConnection | None = None
        self.cancelled = False
        self.waiting_since = -1.0

    def cancel(self) -> None:
        """The requester is gone: stop dialing, or drop the exchange's connection (an
        unfinished exchange cannot be left on a keep-alive connection). No listener
        call follows."""
        self.cancelled = True
        dial, self.dial = self.dial, None
        if dial is not None:
            dial.cancel()
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.abandon(self)
