"""The client side of an HTTP/1.1 connection, without I/O: bytes in, events out.

:class:`ClientCore` reads the answers to the requests sent on one backend connection,
one exchange at a time. :meth:`ClientCore.send` says a request went out;
:meth:`ClientCore.receive` takes the bytes read and returns what they held, as events:
:class:`Interim` (a 1xx other than 100 and 101), :class:`Head` (the final head, its
framing decided by :func:`proxy.wire.framing.backend_framing`), :class:`Data`,
:class:`End` (with the trailers), :class:`Upgrade` (a 101 and the bytes after it) and
:class:`Failed`. :meth:`ClientCore.closed` says what the backend closing means.

llhttp (httptools) parses underneath; its callbacks only collect and refuse what is
over the head limits.

One fast path, behind :attr:`ClientCore.pass_through` (``tests/test_upstream_core.py``
compares it with the plain path on every case): llhttp copies each body piece it
reports into a new ``bytes``. When a read begins with a head and is large (at least
``PASS_THROUGH`` bytes) or ends with the head, its message is parsed by a second
parser made without a body callback, and the core relays the body itself, as views
of the reads (which the connection may lend, :mod:`proxy.upstream.readbuffer` says).
The head ends at the first CR LF CR LF of the read: llhttp's strict parse ends every
line at a CR LF and the head at the first empty line. Once the head is complete
(inside llhttp's callback) the body bytes of that read are relayed and llhttp skips
them; each later read is relayed first and then fed to llhttp, which ends the message
after its last byte and refuses what follows, as it would have. A head that does not
suit (an interim one, a 101, a Transfer-Encoding) makes the core feed the read again
to the plain parser. Every state change goes through :meth:`ClientCore._apply`, one
lookup in :data:`TRANSITIONS`, keyed by (state, event): a pair the table does not list
is a backend out of step (bytes after its answer, a body after a HEAD answer, a second
head) and ends the connection with :class:`Failed`.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

import httptools

from proxy.request import Headers, Piece
from proxy.wire.framing import HeadLimits, backend_framing, trimmed, valid_status
from proxy.wire.scan import FIND_BLANK_LINE, as_view

# "HTTP/1.1 103 ", the CR LF ending the status line and the blank line: what a head
# holds beyond its reason and fields.
_STATUS_LINE_AND_END: Final = 17
# A read from this size on that begins with a head has its body relayed past llhttp:
# below it, llhttp's copy of a small piece costs less than the second parser's call.
PASS_THROUGH: Final = 16 * 1024
# What is left of a close-delimited body being relayed: all that comes until the end.
UNTIL_CLOSE: Final = 1 << 62


class State(IntEnum):
    IDLE = 0  # no exchange: in the pool, or just connected
    AWAITING_HEAD = 1  # a request went out (or is going out), no final head yet
    RECEIVING = 2  # the final head arrived, the body is being read
    SWITCHED = 3  # a 101 arrived: the connection is a raw byte stream now
    CLOSED = 4


class On(IntEnum):
    """What moves the state: an event read, or one of the connection's own."""

    SEND = 0  # a request went out
    BEGIN = 1  # a response message begins (internal: never returned)
    INTERIM = 2
    HEAD = 3
    DATA = 4
    END = 5
    UPGRADE = 6
    FAILED = 7
    CLOSE = 8  # the connection closes (given up, or closed by the backend)


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


class Event:
    """Something the backend's bytes said; ``kind`` keys :data:`TRANSITIONS`."""

    __slots__ = ()
    kind = On.FAILED


class Interim(Event):
    """A 1xx head other than 100 (ours to send) and 101 (an :class:`Upgrade`)."""

    __slots__ = ("status", "headers")
    kind = On.INTERIM

    def __init__(self, status: int, headers: Headers) -> None:
        self.status = status
        self.headers = headers


class Head(Event):
    """The final response head. ``reusable``: the connection may serve another
    request after this answer, as far as the head tells."""

    __slots__ = ("status", "reason", "headers", "length", "reusable")
    kind = On.HEAD

    def __init__(self, status: int, reason: str, headers: Headers, length: int | None,
                 reusable: bool) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.length = length
        self.reusable = reusable


class Data(Event):
    """Body bytes: ``bytes``, or a view of the read (the pass-through)."""

    __slots__ = ("data",)
    kind = On.DATA

    def __init__(self, data: Piece) -> None:
        self.data = data


class End(Event):
    """The answer is complete; ``keep_alive``: the connection persists after it."""

    __slots__ = ("trailers", "keep_alive")
    kind = On.END

    def __init__(self, trailers: Headers, keep_alive: bool) -> None:
        self.trailers = trailers
        self.keep_alive = keep_alive


class Upgrade(Event):
    """A 101 to a request that asked for it; ``rest``: the bytes after its head."""

    __slots__ = ("reason", "headers", "rest")
    kind = On.UPGRADE

    def __init__(self, reason: str, headers: Headers, rest: bytes) -> None:
        self.reason = reason
        self.headers = headers
        self.rest = rest


class Failed(Event):
    """The exchange cannot complete and the connection ends. ``unanswered``: the
    backend closed before a single byte of answer (a kept-alive connection it may
    have closed just as the request went out)."""

    __slots__ = ("message", "unanswered")
    kind = On.FAILED

    def __init__(self, message: str, unanswered: bool = False) -> None:
        self.message = message
        self.unanswered = unanswered


class Refused(Exception):
    """Raised by a parser callback: what was read is over a limit or not an answer."""


class _Refeed(Exception):
    """Raised by a parser callback: the head does not suit the pass-through."""


class _Begin(Event):
    __slots__ = ()
    kind = On.BEGIN


BEGIN: Final = _Begin()


class ClientCore:
    """One backend connection's response side (see the module docstring)."""

    def __init__(self, limits: HeadLimits = HeadLimits(), pass_through: bool = True) -> None:
        self.state = State.IDLE
        self.pass_through = pass_through
        self.max_bytes = limits.max_bytes
        self.max_fields = limits.max_fields
        self.head_only = False  # answering a HEAD: never a body
        self.asks_upgrade = False
        self.got_bytes = False  # a byte of the answer arrived
        self.head_bytes = 0  # bytes received while no final head was complete
        self._plain = self._parser = httptools.HttpResponseParser(self)
        self._skipping = httptools.HttpResponseParser(_WithoutBody(self))
        self._read: Piece | None = None  # a read whose body llhttp skips, while parsed
        self._body_at = 0  # where that read's body begins
        self._left = 0  # body bytes still to relay past llhttp
        self._events: list[Event] = []
        self._fields: Headers = []
        self._reason = b""
        self._head_size = 0  # field bytes of the head (or trailer section) being parsed
        self._interim_size = 0  # bytes of the 1xx heads before the final one
        self._interim = False  # the message being parsed is a 1xx
        self._switch: tuple[str, Headers] | None = None  # a 101's head
        self._trailers: Headers = []
        self._persists = False
        self._length: int | None = None
        self._chunked = False
        self._renew = False  # the parser is replaced after this read

    def _apply(self, kind: On) -> bool:
        """The one place the state changes; False for a pair the table does not list."""
        state = TRANSITIONS.get((self.state, kind))
        if state is None:
            return False
        self.state = state
        return True

    def send(self, head_only: bool, asks_upgrade: bool) -> None:
        """A request went out on this idle connection (``head_only``: a HEAD)."""
        if not self._apply(On.SEND):
            raise RuntimeError(f"request sent in state {self.state.name}")
        self.head_only = head_only
        self.asks_upgrade = asks_upgrade
        self.got_bytes = False
        self.head_bytes = 0
        self._interim_size = 0

    def close(self) -> None:
        self._apply(On.CLOSE)

    def receive(self, data: Piece, whole: bytes | bytearray | None = None) -> list[Event]:
        """What ``data``, the next bytes read, held, in order; ends with a
        :class:`Failed` if they broke the exchange off. ``whole`` holds ``data`` from
        its first byte (the store it was read into), searched in place for the head's
        end; without it, the body is never relayed past llhttp."""
        self.got_bytes = True
        self._events = collected = []
        try:
            if self._left:
                self._pass(data)
            elif not self._feed_skipping(data, whole):
                self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            collected.append(self._upgrade(bytes(data[exc.args[0]:])))
        except httptools.HttpParserError as exc:
            refused = exc.__context__
            reason = refused if isinstance(refused, Refused) else exc
            collected.append(Failed(f"invalid response from backend: {reason}"))
        if self._renew:
            # llhttp would expect a body after a HEAD answer's head; there is none.
            self._renew = False
            self._plain = self._parser = httptools.HttpResponseParser(self)
        events = self._walk(collected)
        if self.state == State.AWAITING_HEAD:
            # All of this was head bytes (interim ones included); counted per read, so
            # a head is never buffered much past the cap.
            self.head_bytes += len(data)
            if self.head_bytes > self.max_bytes:
                events.append(self._fail("response head too large"))
        return events

    def _feed_skipping(self, data: Piece, whole: bytes | bytearray | None) -> bool:
        """Parse ``data`` with the parser that skips the body, if it suits (see the
        module docstring); False if it does not, and nothing was parsed."""
        self._parser = self._plain
        if (not self.pass_through or whole is None or self.head_only or self.head_bytes
                or self.state != State.AWAITING_HEAD):
            return False
        size = len(data)
        end = FIND_BLANK_LINE(whole, size) + 4
        if end < 4 or (size < PASS_THROUGH and end != size):
            return False
        self._parser = self._skipping
        self._read = data
        self._body_at = end
        try:
            self._skipping.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _Refeed):
                raise
            self._skipping = httptools.HttpResponseParser(_WithoutBody(self))
            self._parser = self._plain
            del self._events[:]
            self._interim_size = 0
            return False
        finally:
            self._read = None  # (a view of the store would keep it from being reused)
        return True

    def _pass(self, data: Piece) -> None:
        """Body bytes relayed past llhttp, then fed to it: it counts them too, ends the
        message after the last one and refuses what follows."""
        left = self._left
        size = len(data)
        if size < left:
            self._left = left - size
            if size:
                self._events.append(Data(data))
        else:
            self._left = 0
            self._events.append(Data(data if size == left else as_view(data)[:left]))
        self._parser.feed_data(data)

    def closed(self) -> list[Event]:
        """The backend closed the connection: what that means for the exchange."""
        state = self.state
        events: list[Event] = []
        if state == State.RECEIVING and self._length is None and not self._chunked:
            # A close-delimited body ends here (RFC 9112 §6.3 item 8).
            events = self._walk([End(self._trailers, False)])
        elif state == State.AWAITING_HEAD and not self.got_bytes:
            events.append(Failed("backend closed the connection without answering", True))
        elif state == State.AWAITING_HEAD:
            events.append(Failed("backend closed the connection before the response head"))
        elif state == State.RECEIVING:
            events.append(Failed("backend closed the connection mid-body"))
        self._apply(On.CLOSE)
        return events

    def _walk(self, collected: list[Event]) -> list[Event]:
        """Apply what the parser collected; stop at the first event the state does
        not allow (returned as a :class:`Failed`)."""
        events: list[Event] = []
        for event in collected:
            kind = event.kind
            if not self._apply(kind):
                events.append(self._fail(f"backend sent {kind.name.lower()} while "
                                         f"{self.state.name.lower()}"))
                break
            if kind != On.BEGIN:
                events.append(event)
            if kind == On.FAILED:
                break
        return events

    def _fail(self, message: str) -> Failed:
        self._apply(On.FAILED)
        return Failed(message)

    def _upgrade(self, rest: bytes) -> Event:
        switch, self._switch = self._switch, None
        if switch is None:
            return Failed("backend switched protocols without a 101")
        if not self.asks_upgrade:
            return Failed("backend switched protocols unasked")
        return Upgrade(switch[0], switch[1], rest)

    # -- llhttp's callbacks: they collect (and refuse what is over the limits)

    def on_message_begin(self) -> None:
        self._events.append(BEGIN)
        self._fields = []
        self._reason = b""
        self._head_size = 0

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        # After the head, the fields are the answer's trailers (see on_headers_complete).
        fields = self._fields
        value = trimmed(value)
        fields.append((name, value))
        self._head_size += len(name) + len(value)
        if (len(fields) > self.max_fields
                or self._head_size + self._interim_size > self.max_bytes):
            raise Refused("response head too large")

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        # Asked of every head: a backend may answer HTTP/1.0 after HTTP/1.1, and that
        # answer must end the connection (RFC 9112 §9.3).
        version = parser.get_http_version()
        if not valid_status(status, version):
            raise Refused(f"invalid status line (status {status})")
        if self._read is not None and status < 200:
            raise _Refeed()
        reason = self._reason.decode("latin-1")
        if status == 101:
            self._switch = (reason, self._fields)  # llhttp stops next (HttpParserUpgrade)
            self._interim = True
        elif status < 200:
            self._interim_head(status)
        else:
            self._final_head(status, reason, version)

    def _interim_head(self, status: int) -> None:
        """100 Continue is ours to send, 102 and 103 are relayed. The head limit covers
        the 1xx heads before the final one too (a backend must not stream them
        forever)."""
        self._interim = True
        self._interim_size += self._head_size + len(self._reason) + _STATUS_LINE_AND_END
        if self._interim_size > self.max_bytes:
            raise Refused("response head too large")
        if status != 100:
            self._events.append(Interim(status, self._fields))

    def _final_head(self, status: int, reason: str, version: str) -> None:
        headers = self._fields
        framing = backend_framing(headers, version, status, self.head_only)
        read = self._read
        if read is not None and framing.coded:
            raise _Refeed()
        self._fields = self._trailers = []  # fields after the body are trailers
        self._head_size = self._interim_size = 0  # (the trailers have a limit of their own)
        self._length = framing.length
        self._chunked = framing.chunked
        self._persists = framing.persists
        events = self._events
        events.append(Head(status, reason, headers, framing.length, framing.poolable))
        if self.head_only:
            self._renew = True
            events.append(End(self._trailers, framing.persists
                              or bool(self._parser.should_keep_alive())))
        elif read is not None and status != 204 and status != 304:
            self._relay_read(read, UNTIL_CLOSE if framing.length is None else framing.length)

    def _relay_read(self, read: Piece, length: int) -> None:
        """At the end of a head parsed by the skipping parser: relay the body bytes
        that came in its read, no more than the body has."""
        at = self._body_at
        size = min(len(read) - at, length)
        self._left = length - max(size, 0)
        if size > 0:
            self._events.append(Data(as_view(read)[at:at + size]))

    def on_body(self, data: bytes) -> None:
        self._events.append(Data(data))

    def on_message_complete(self) -> None:
        if self._left:
            # llhttp ended a relayed body elsewhere than its length said: never trusted.
            raise Refused("response body length not agreed")
        if self._interim:
            self._interim = False
            return
        if self.head_only:
            return  # (its End went with the head)
        # Asked here, after any trailer section: llhttp honours a ``Connection: close``
        # even there.
        self._events.append(End(self._trailers, self._persists
                                or bool(self._parser.should_keep_alive())))


class _WithoutBody:
    """A core's llhttp callbacks but the body's: the parser of the pass-through (a
    parser looks its callbacks up by name when it is made)."""

    def __init__(self, core: ClientCore) -> None:
        self.on_message_begin = core.on_message_begin
        self.on_status = core.on_status
        self.on_header = core.on_header
        self.on_headers_complete = core.on_headers_complete
        self.on_message_complete = core.on_message_complete
