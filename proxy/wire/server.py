"""The server side of an HTTP/1.1 connection, sans-IO: bytes in, events out.

:meth:`ServerConnection.receive` takes what a client sent and returns what it meant,
in order:

- a :class:`~proxy.wire.request.RequestHead`: a request head, validated, with its
  framing, version, persistence and whether its Upgrade is to be relayed;
- ``bytes``: a piece of that request's body;
- :class:`Trailers`: the trailer fields of a chunked body;
- :data:`END`: the request ended (every request has one, bodyless ones too);
- :data:`HALT`: an upgrade request without a body was read; nothing more is parsed
  (bytes received meanwhile are kept) until the adapter tells how it was answered:
  :meth:`~ServerConnection.resume` or :meth:`~ServerConnection.switch`;
- a :class:`~proxy.wire.request.Rejection`: the status to answer before closing;
  nothing more is parsed.

The connection's :class:`State` changes only in :meth:`ServerConnection.handle`, which
looks the pair (state, :class:`Event`) up in :data:`TRANSITIONS`; a pair the table does
not list is a bug and raises. The transport's events (a PROXY header, the protocol
sniffed, a lingering close, the connection lost) go through the same table.

llhttp (httptools) parses underneath, strict but for the version digits and
Transfer-Encoding, which :func:`~proxy.wire.request.validate_head` judges. Its
callbacks (:class:`~proxy.wire.collect.Collector`) only collect and refuse; the state
moves once llhttp returned, from what they collected. What no callback shows (a head
that stays incomplete, chunk framing) is measured by
:class:`~proxy.wire.meter.FramingMeter`, so large reads are fed in slices.
"""

from __future__ import annotations

import logging
from enum import IntEnum, auto
from typing import Callable, Final, Protocol

import httptools

from proxy.wire.collect import END, HALT, Collector, ServerEvent, Trailers
from proxy.wire.meter import FramingMeter
from proxy.wire.request import Rejection, RequestHead, lacks_version, names_a_method, \
    request_line_end

__all__ = ["END", "HALT", "Event", "Limits", "ServerConnection", "ServerEvent", "State",
           "Trailers", "TRANSITIONS"]

log = logging.getLogger("tunnelgate.http1")

FEED_SLICE: Final = 16 * 1024  # large reads are fed in slices so head/chunk limits stay exact
# A read's last slice takes a tail up to this much longer with it (a slice is then at
# most 20 KiB): a 16 KiB body and its head, one read, is one call into llhttp, not two.
FEED_TAIL: Final = FEED_SLICE // 4
_METHOD_SCAN: Final = 40  # request bytes looked at to tell an unknown method from garbage


class State(IntEnum):
    """Where a client connection is; what is done with the bytes it sends. (Ints: a
    table lookup hashes them in C.)"""

    NEW = auto()  # connected, nothing received yet (a PROXY header here is refused)
    PROXY = auto()  # waiting for the PROXY header that must open the connection
    IDLE = auto()  # between requests: waiting for the first byte of the next head
    HEAD = auto()  # a request head is arriving
    BODY = auto()  # a request body is arriving
    HALTED = auto()  # at an upgrade request: later bytes are kept aside
    UPGRADED = auto()  # switched protocols: the connection is a raw byte stream
    REJECTED = auto()  # a malformed message was refused: nothing more is parsed
    LINGERING = auto()  # closing after an answer: input is read and dropped
    CLOSED = auto()  # the transport is gone


class Event(IntEnum):
    """What moves a connection from one :class:`State` to another."""

    PROXY_EXPECTED = auto()  # the entrance wants a PROXY header first
    PROXY_READ = auto()  # it arrived: the protocol is still to tell
    HTTP1 = auto()  # the first bytes are not the HTTP/2 preface
    HEAD_BEGINS = auto()  # the first byte of a request
    HEAD_ENDS = auto()  # the head of a request without a body ended
    BODY_BEGINS = auto()  # the head of a request with a body ended
    BODY_ENDS = auto()
    UPGRADE_ASKED = auto()  # an upgrade request without a body was read
    ANSWERED = auto()  # it was answered without switching
    SWITCHED = auto()  # it was answered with 101
    REFUSED = auto()  # a malformed message
    LINGER = auto()  # the entrance closes after an answer while the client sends
    LOST = auto()  # the transport is gone


S, E = State, Event
# (state, event) -> the next state. LINGER follows an answer given while a request is
# unread, whatever the parser was doing then; every state may end with the transport.
TRANSITIONS: Final[dict[tuple[State, Event], State]] = {
    (S.NEW, E.PROXY_EXPECTED): S.PROXY,
    (S.PROXY, E.PROXY_READ): S.NEW,
    (S.NEW, E.HTTP1): S.IDLE,
    (S.IDLE, E.HEAD_BEGINS): S.HEAD,
    (S.HEAD, E.HEAD_ENDS): S.IDLE,
    (S.HEAD, E.BODY_BEGINS): S.BODY,
    (S.BODY, E.BODY_ENDS): S.IDLE,
    (S.IDLE, E.UPGRADE_ASKED): S.HALTED,
    (S.HALTED, E.ANSWERED): S.IDLE,
    (S.HALTED, E.SWITCHED): S.UPGRADED,
    **{(state, E.REFUSED): S.REJECTED for state in (S.IDLE, S.HEAD, S.BODY)},
    **{(state, E.LINGER): S.LINGERING
       for state in (S.NEW, S.IDLE, S.HEAD, S.BODY, S.HALTED, S.REJECTED)},
    **{(state, E.LOST): S.CLOSED for state in State},
}
del S, E


def _next_row(state: int) -> tuple[State | None, ...]:
    """Where each event leads from ``state``, by the event's value (None: nowhere)."""
    row = {int(event): new for (old, event), new in TRANSITIONS.items() if old == state}
    return tuple(row.get(event) for event in range(max(Event) + 1))


# The same table for handle: a row per state, a column per event, both indexed by their
# int values (see _transition).
_NEXT: Final[tuple[tuple[State | None, ...], ...]] = tuple(
    _next_row(state) for state in range(max(State) + 1))


def _transition(state: int, event: int) -> State | None:
    """``TRANSITIONS.get((state, event))``, read from :data:`_NEXT`. The enums are
    passed as ints so that, compiled, both reads index a C array: two dict lookups
    keyed by the enums cost ~320 instructions per transition, and tuple reads with
    enum indexes ~200 (callgrind, 2026-12-07; two transitions per bodyless request,
    three with a body)."""
    return _NEXT[state][event]
# The states and events of reading requests, by their short names.
IDLE: Final = State.IDLE
HEAD: Final = State.HEAD
BODY: Final = State.BODY
HALTED: Final = State.HALTED
REJECTED: Final = State.REJECTED
HEAD_BEGINS: Final = Event.HEAD_BEGINS
HEAD_ENDS: Final = Event.HEAD_ENDS
BODY_BEGINS: Final = Event.BODY_BEGINS
BODY_ENDS: Final = Event.BODY_ENDS
_PARSING: Final = frozenset((IDLE, HEAD, BODY))


class Limits(Protocol):
    """The sizes a client's request head may reach."""

    max_request_line: int
    max_header_bytes: int
    max_headers: int


class ServerConnection:
    """The sans-IO server side of one HTTP/1.1 connection (see the module docstring).

    ``misdirected`` tells a host this connection may not serve (421: another
    certificate than the one its TLS handshake chose serves it), if any.
    """

    def __init__(self, limits: Limits,
                 misdirected: Callable[[str], bool] | None = None) -> None:
        self._state = State.NEW
        self._meter = FramingMeter(limits.max_header_bytes + limits.max_request_line)
        self._collect = Collector(limits, misdirected, self._meter)
        self._collect.fresh_parser()
        self._stash: list[bytes] = []  # HALTED: bytes after the upgrade request

    @property
    def state(self) -> State:
        return self._state

    @property
    def parsing_chunked(self) -> bool:
        """A chunked body is being read (its framing is measured)."""
        return self._collect.chunked

    def handle(self, event: Event) -> State:
        """The one place the state changes: by the table, or a bug."""
        new = _transition(self._state, event)
        if new is None:
            raise RuntimeError(f"client connection: {self._state.name} has no "
                               f"transition on {event.name}")
        self._state = new
        return new

    # -- bytes in, events out

    def receive(self, data: bytes) -> list[ServerEvent]:
        """The events ``data`` completes (see the module docstring); bytes received
        while halted are kept, in any other state but a parsing one dropped."""
        state = self._state
        if state is HALTED:
            self._stash.append(data)
            return []
        if (state is not IDLE and state not in _PARSING) or not data:
            return []
        if len(data) > FEED_SLICE + FEED_TAIL:
            self._feed_slices(data)
        else:
            self._parse(data)
        collect = self._collect
        events, collect.events = collect.events, []
        return events

    def resume(self) -> list[ServerEvent]:
        """The upgrade request was answered without switching: parse on from where
        llhttp stopped (the request had no body, so the next one starts there) with a
        fresh parser (llhttp does not parse on after an upgrade)."""
        self.handle(Event.ANSWERED)
        self._collect.fresh_parser()
        stash, self._stash = self._stash, []
        return self.receive(b"".join(stash))

    def switch(self) -> bytes:
        """The upgrade request was answered with 101: the bytes that followed it."""
        self.handle(Event.SWITCHED)
        stash, self._stash = self._stash, []
        return b"".join(stash)

    def release(self) -> None:
        """Drop the references back (the parser's to the collector, the adapter's
        ``misdirected``), so a closed connection is freed by reference counting
        alone."""
        self._collect.release()

    # -- feeding llhttp

    def _feed_slices(self, data: bytes) -> None:
        """Feed ``data`` slice by slice (so head and chunk limits stay exact); stop
        where parsing stopped (halted: the rest is kept; rejected: dropped)."""
        view = memoryview(data)
        start, size = 0, len(data)
        if self._state is IDLE:
            self._collect.fed = data  # where the request line is (see request_version)
        while start < size:
            state = self._state
            if state is HALTED:
                self._stash.append(bytes(view[start:]))
                return
            if state not in _PARSING:
                return
            end = start + FEED_SLICE
            if size - end <= FEED_TAIL:
                end = size
            self._parse(view[start:end])
            start = end

    def _parse(self, data: bytes | memoryview) -> None:
        """Feed one slice; then move the state by what the callbacks collected, and
        refuse what llhttp raised or what no callback shows."""
        collect = self._collect
        meter = self._meter
        seq, state_before = collect.seq, self._state
        done = len(collect.events)
        meter.begin_slice()
        if state_before is IDLE and isinstance(data, bytes):
            collect.fed = data
        try:
            collect.feed(data)
        except httptools.HttpParserUpgrade as exc:  # stopped after an upgrade head
            self._advance(done)
            self._upgraded(bytes(data[exc.args[0]:]))
            return
        except httptools.HttpParserError as exc:
            self._advance(done)
            self._refuse(self._failure(exc, data, state_before))
            return
        finally:
            collect.fed = b""  # (a message that began in these bytes took them)
        self._advance(done)
        self._measure(data, seq, state_before)

    def _advance(self, done: int) -> None:
        """Move the state by the events the callbacks collected from ``done`` on (and
        a head begun after them)."""
        events = self._collect.events
        for index in range(done, len(events)):
            event = events[index]
            if isinstance(event, RequestHead):
                if self._state is IDLE:
                    self.handle(HEAD_BEGINS)
                framed = event.chunked or event.length
                self.handle(BODY_BEGINS if framed else HEAD_ENDS)
            elif event is END and self._state is BODY:
                self.handle(BODY_ENDS)
        if self._collect.open and self._state is IDLE:
            self.handle(HEAD_BEGINS)

    def _measure(self, data: bytes | memoryview, seq: int, state_before: State) -> None:
        """Refuse what llhttp took without a word (see :mod:`proxy.wire.meter`)."""
        collect = self._collect
        meter = self._meter
        state = self._state
        if collect.chunked and meter.chunk_size_refused(data):
            self._refuse(Rejection(400, "chunk size too large"))
        elif seq != collect.seq or state_before is not state:
            # (the rest is measured over slices inside one part of one message)
            if state is HEAD and lacks_version(collect.first_read):
                self._refuse(Rejection(400, "no HTTP version on the request line"))
        elif state is HEAD:
            if meter.head_refused(len(data)):
                status = 431 if collect.headers else 414
                self._refuse(Rejection(status, "request head too large"))
            elif collect.first_read and self._line_open(data):
                self._refuse(Rejection(400, "no HTTP version on the request line"))
        elif state is BODY and collect.chunked and meter.framing_refused(len(data)):
            self._refuse(Rejection(400, "chunk framing too large"))

    def _line_open(self, data: bytes | memoryview) -> bool:
        """A head that began a read stays incomplete: while its request line is not
        all there, ``data`` (its next slice) is kept with its first bytes, until the
        line ends (bounded: the meter refuses a long head). Whether it ended without
        an HTTP version (HTTP/0.9, refused at once)."""
        collect = self._collect
        first = collect.first_read
        if request_line_end(first) >= 0:
            return False
        first = collect.first_read = first + bytes(data)
        return lacks_version(first)

    def _failure(self, exc: httptools.HttpParserError, data: bytes | memoryview,
                 state_before: State) -> Rejection | None:
        """What to answer for what llhttp raised; None when a body llhttp did not
        frame is re-framed instead."""
        collect = self._collect
        if isinstance(exc, httptools.HttpParserCallbackError):
            refusal, collect.refusal = collect.refusal, None
            unframed, collect.unframed = collect.unframed, None
            if unframed is not None:
                self._reframe(unframed)
                return None
            if refusal is None:
                log.error("parser callback failed", exc_info=exc.__context__)
                return Rejection(500, "internal error")
            return refusal
        if isinstance(exc, httptools.HttpParserInvalidMethodError):
            # A token llhttp does not know is still a method (RFC 9110 §9.1): one this
            # proxy cannot serve (501, §15.6.2), not a malformed request.
            start = bytes(data[:_METHOD_SCAN]) if state_before is IDLE else b""
            return Rejection(501 if names_a_method(start) else 400, str(exc))
        return Rejection(400, str(exc))

    def _refuse(self, refusal: Rejection | None) -> None:
        if refusal is not None and self._state in _PARSING:
            self.handle(Event.REFUSED)
            self._collect.events.append(refusal)

    def _upgraded(self, rest: bytes) -> None:
        """llhttp stopped after an upgrade request's head; ``rest`` followed it."""
        if self._state is BODY:
            self._reframe(rest)  # a body: the Upgrade is ignored (RFC 9110 §7.8)
            return
        self.handle(Event.UPGRADE_ASKED)
        if rest:
            self._stash.append(rest)
        self._collect.events.append(HALT)

    def _reframe(self, rest: bytes) -> None:
        """Parse the body of an upgrade request whose Upgrade we ignore, or a chunked
        body llhttp did not frame as chunked (``chunked,`` or a trailing tab: RFC 9110
        §5.6.1, §5.6.3).

        llhttp takes every byte after an upgrade request's head for the new protocol
        (or, for the other, for a body that ends with the connection) and offers no way
        to parse on as HTTP. So a fresh parser is fed a made-up head with the same
        framing, which the collector skips, then the bytes that followed the real
        head: from there on the body is read as any other."""
        length = self._collect.framing()
        head = (b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" if length is None
                else b"PUT / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % length)
        self._collect.fresh_parser(made_up_head=True)
        self._parse(head + rest)
