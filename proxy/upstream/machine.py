"""One exchange at a time on an HTTP/1.1 backend connection, as a state machine.

The response side of a connection has named states (``IDLE`` → ``AWAITING_HEAD`` →
``RECEIVING`` → ``IDLE``, or ``SWITCHED`` after a 101, ``CLOSED``) and every change goes
through :meth:`ExchangeMachine._to`, which refuses a transition not in the table.
:class:`ExchangeMachine` holds that state with the exchange it belongs to: the request
and its listener, the body sender, the head timer, the framing of the answer. It takes
what the :class:`~proxy.upstream.reader.ResponseReader` reports (an interim answer, a
101 to come) and ends an exchange that is detached or failed. The transport side, and
the steps that hand the connection itself on (to its pool once an answer is complete,
to the listener with a final head, body pieces or a 101), are
:class:`proxy.upstream.http1.UpstreamConnection`'s, its one subclass.
"""

from __future__ import annotations

import asyncio
from typing import Final

from proxy.flow.control import BODY, FlowControl, GuardedOutput
from proxy.request import Headers
from proxy.upstream.base import UpstreamError
from proxy.upstream.request import ResponseListener, UpstreamRequest
from proxy.upstream.sender import RequestSender

# The states of the response side of the connection. The request side is apart: the
# sender may still be writing the body while the answer arrives (an early answer).
IDLE: Final = 0  # no exchange: in the pool, or just connected
AWAITING_HEAD: Final = 1  # a request went out (or is going out), no final head yet
RECEIVING: Final = 2  # the final head arrived, the body is being relayed
SWITCHED: Final = 3  # a 101 arrived: the connection is a raw byte stream now
CLOSED: Final = 4
_STATE_NAMES: Final[tuple[str, ...]] = (
    "idle", "awaiting-head", "receiving", "switched", "closed")


def _to_any(*states: int) -> int:
    mask = 0
    for state in states:
        mask |= 1 << state
    return mask


# Every transition the connection may take, as a bit mask per state (bit ``n`` set: may
# go to ``n``); anything else is a bug (raised at once). A variable-length tuple: see
# proxy.entrances.states.TRANSITIONS.
_TRANSITIONS: Final[tuple[int, ...]] = (
    _to_any(AWAITING_HEAD, CLOSED),  # IDLE
    _to_any(RECEIVING, SWITCHED, IDLE, CLOSED),  # AWAITING_HEAD (IDLE: HEAD answered)
    _to_any(IDLE, CLOSED),  # RECEIVING
    _to_any(CLOSED),  # SWITCHED
    _to_any(CLOSED),  # CLOSED (idempotent)
)


class ExchangeMachine(GuardedOutput):
    """The state of the exchange on one backend connection and the ways it ends.

    ``flow`` and ``loop`` are the subclass's to set (on connect): reading pauses through
    ``flow``, and the head timer runs on ``loop``.
    """

    flow: FlowControl
    loop: asyncio.AbstractEventLoop

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.state = IDLE
        self._request: UpstreamRequest | None = None
        self._listener: ResponseListener | None = None
        self._sender: RequestSender | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._trailers: Headers = []
        self._switch_head: tuple[str, Headers] | None = None  # a 101's, until llhttp stops
        self._length: int | None = None  # the response's Content-Length
        self._chunked = False  # the response body is chunked
        self._got_bytes = False
        self._sent = False  # the whole request (head and body) was written
        self._reusable = True

    def _to(self, state: int) -> None:
        """The one place the state changes; a transition not in the table is a bug."""
        if (_TRANSITIONS[self.state] >> state) & 1 != 1:
            raise RuntimeError(f"upstream connection: {_STATE_NAMES[self.state]} -> "
                               f"{_STATE_NAMES[state]}")
        self.state = state

    def pause(self) -> None:
        """The listener cannot take more body now: stop reading from the backend."""
        self.flow.pause_reading(BODY)

    def resume(self) -> None:
        self.flow.resume_reading(BODY)

    def request_sent(self) -> None:
        """The whole request went out: the head timeout starts now (route timeouts
        do not count the upload)."""
        self._sent = True
        request = self._request
        if self.state == AWAITING_HEAD and request is not None:
            timeout = request.head_timeout
            if timeout is not None:
                self._timer = self.loop.call_later(timeout, self._head_timed_out)

    def head_overdue(self, now: float, limit: float) -> None:
        """The pool's sweep (:meth:`proxy.upstream.pool.Pool._watch_heads`) at loop time
        ``now``: a request sent whole that waits for its head with no timeout of its
        own fails once it waited ``limit`` seconds, counted from the sweep that first
        found it waiting (so never early). A head already received ends the wait: a
        stream that started is never cut by it."""
        request = self._request
        if (request is None or self.state != AWAITING_HEAD or not self._sent
                or request.head_timeout is not None):
            return
        if request.waiting_since < 0:
            request.waiting_since = now
        elif now - request.waiting_since >= limit:
            self._head_timed_out()

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.state == AWAITING_HEAD:
            self._fail(UpstreamError("timeout", "backend response headers timed out"))

    def body_failed(self, error: UpstreamError) -> None:
        """The client's body broke off (gone, or malformed). Before the answer there is
        nothing to relay; an answer already relayed stands, but the connection, half
        way through a request, cannot be reused."""
        self._reusable = False
        if self.state == AWAITING_HEAD:
            self._fail(error)

    def _end_exchange(self) -> UpstreamRequest | None:
        """Detach the exchange: no listener call follows. Returns its request."""
        request, self._request = self._request, None
        self._listener = None
        if request is not None:
            request.conn = None
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.stop()
        return request

    def _fail(self, error: UpstreamError) -> None:
        """The exchange cannot complete: close, and tell the listener (once)."""
        listener = self._listener
        self._end_exchange()
        if self.state != CLOSED:
            self._to(CLOSED)
        self.abort()
        if listener is not None:
            listener.on_error(error)

    # -- what the reader read (an exception raised here becomes a 502)

    def expects_head(self) -> bool:
        """A request is out and its final head has not come yet."""
        return self.state == AWAITING_HEAD

    def interim(self, status: int, headers: Headers) -> None:
        listener = self._listener
        if listener is not None:
            listener.on_interim(status, headers)

    def switching(self, reason: str, headers: Headers) -> None:
        request = self._request
        assert request is not None
        if not _asks_upgrade(request.headers):
            raise UpstreamError("other", "backend switched protocols unasked")
        self._switch_head = (reason, headers)  # the listener hears of it in _switched


def _asks_upgrade(headers: Headers) -> bool:
    return any(len(name) == 7 and name.lower() == b"upgrade" for name, _ in headers)
