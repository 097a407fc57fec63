"""The client side of an HTTP/1.1 connection, without I/O: bytes in, events out.

:class:`ClientCore` reads the answers to the requests sent on one backend connection,
one exchange at a time. :meth:`ClientCore.send` says a request went out;
:meth:`ClientCore.receive` takes the bytes read and returns what they held, as events
(:mod:`proxy.upstream.events`): :class:`Interim` (a 1xx other than 100 and 101), :class:`Head` (the final head, its
framing decided by :func:`proxy.wire.framing.backend_framing`), :class:`Data`,
:class:`End` (with the trailers), :class:`Upgrade` (a 101 and the bytes after it) and
:class:`Failed`. :meth:`ClientCore.closed` says what the backend closing means.

The bytes are parsed by :class:`proxy.upstream.parse.ResponseParser` (llhttp, whose
callbacks only collect events). Every state change goes through
:meth:`ClientCore._apply`, one lookup in :data:`TRANSITIONS`, keyed by (state, event):
a pair the table does not list is a backend out of step (bytes after its answer, a
body after a HEAD answer, a second head) and ends the connection with :class:`Failed`.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from proxy.request import Piece
from proxy.upstream.events import (
    BEGIN, ON_CLOSE, ON_FAILED, ON_SEND, End, Event, Failed, On)
from proxy.upstream.parse import ResponseParser
from proxy.wire.framing import HeadLimits


class State(IntEnum):
    IDLE = 0  # no exchange: in the pool, or just connected
    AWAITING_HEAD = 1  # a request went out (or is going out), no final head yet
    RECEIVING = 2  # the final head arrived, the body is being read
    SWITCHED = 3  # a 101 arrived: the connection is a raw byte stream now
    CLOSED = 4


TRANSITIONS: Final[dict[tuple[State, On], State]] = {
    (State.IDLE, On.SEND): State.AWAITING_HEAD,
    (State.AWAITING_HEAD, On.BEGIN): State.AWAITING_HEAD,
    (State.AWAITING_HEAD, On.INTERIM): State.AWAITING_HEAD,
    (State.AWAITING_HEAD, On.HEAD): State.RECEIVING,
    (State.AWAITING_HEAD, On.UPGRADE): State.SWITCHED,
    (State.RECEIVING, On.DATA): State.RECEIVING,
    (State.RECEIVING, On.END): State.IDLE,
    **{(state, On.FAILED): State.CLOSED for state in State},
    **{(state, On.CLOSE): State.CLOSED for state in State},
}
"""Every transition; anything else is a protocol error (see the module docstring)."""

# The states as module constants (see proxy.upstream.events for why), and the table
# as rows by state and columns by event, for the lookup: the same table.
IDLE: Final = State.IDLE
AWAITING_HEAD: Final = State.AWAITING_HEAD
RECEIVING: Final = State.RECEIVING
SWITCHED: Final = State.SWITCHED
CLOSED: Final = State.CLOSED
_NEXT: Final[tuple[tuple[State | None, ...], ...]] = tuple(
    tuple(TRANSITIONS.get((state, on)) for on in On) for state in State)


class ClientCore:
    """One backend connection's response side (see the module docstring).
    ``fast``: the parser's fast paths (:mod:`proxy.upstream.parse`) may be taken."""

    def __init__(self, limits: HeadLimits = HeadLimits(), fast: bool = True) -> None:
        self.state: State = IDLE
        self.max_bytes = limits.max_bytes
        self.got_bytes = False  # a byte of the answer arrived
        self.head_bytes = 0  # bytes received while no final head was complete
        self.parser = ResponseParser(limits, fast)

    def _apply(self, kind: On) -> bool:
        """The one place the state changes; False for a pair the table does not list."""
        state = _NEXT[self.state][kind]
        if state is None:
            return False
        self.state = state
        return True

    def send(self, head_only: bool, asks_upgrade: bool) -> None:
        """A request went out on this idle connection (``head_only``: a HEAD;
        ``asks_upgrade``: it has an Upgrade field, so a 101 may answer it)."""
        if not self._apply(ON_SEND):
            raise RuntimeError(f"request sent in state {self.state.name}")
        self.got_bytes = False
        self.head_bytes = 0
        self.parser.expect(head_only, asks_upgrade)

    def close(self) -> None:
        self._apply(ON_CLOSE)

    def receive(self, data: Piece, whole: bytes | bytearray | None = None) -> list[Event]:
        """What ``data``, the next bytes read, held, in order; ends with a
        :class:`Failed` if they broke the exchange off. ``whole`` holds ``data`` from
        its first byte (the store it was read into), for the parser to search in
        place; without it, no fast path is taken."""
        self.got_bytes = True
        at_head = self.state is AWAITING_HEAD and not self.head_bytes
        events = self._walk(self.parser.feed(data, whole, at_head))
        if self.state is AWAITING_HEAD:
            # All of this was head bytes (interim ones included); counted per read, so
            # a head is never buffered much past the cap.
            self.head_bytes += len(data)
            if self.head_bytes > self.max_bytes:
                events.append(self._fail("response head too large"))
        return events

    def closed(self) -> list[Event]:
        """The backend closed the connection: what that means for the exchange."""
        state = self.state
        events: list[Event] = []
        if state is RECEIVING and self.parser.close_delimited:
            # A close-delimited body ends here (RFC 9112 §6.3 item 8).
            events = self._walk([End(self.parser.trailers, False)])
        elif state is AWAITING_HEAD and not self.got_bytes:
            events.append(Failed("backend closed the connection without answering", True))
        elif state is AWAITING_HEAD:
            events.append(Failed("backend closed the connection before the response head"))
        elif state is RECEIVING:
            events.append(Failed("backend closed the connection mid-body"))
        self._apply(ON_CLOSE)
        return events

    def _walk(self, collected: list[Event]) -> list[Event]:
        """Apply what the parser collected; stop at the first event the state does
        not allow (returned as a :class:`Failed`)."""
        events: list[Event] = []
        for event in collected:
            kind = event.kind
            if not self._apply(kind):
                name = "bytes after its response" if event is BEGIN else kind.name.lower()
                events.append(self._fail(f"backend sent {name} (connection "
                                         f"{self.state.name.lower()})"))
                break
            if event is not BEGIN:
                events.append(event)
            if kind is ON_FAILED:
                break
        return events

    def _fail(self, message: str) -> Failed:
        self._apply(ON_FAILED)
        return Failed(message)
