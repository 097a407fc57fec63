"""Backend responses parsed by llhttp (httptools) into events
(:mod:`proxy.upstream.events`), for :class:`proxy.upstream.core.ClientCore`, which
decides what they mean for the connection. llhttp's callbacks only collect them, and
refuse what is over the head limits.

**The fast paths, one seam** (:meth:`ResponseParser._choose`, taken when ``fast`` is
set; ``tests/test_upstream_core.py`` feeds every case both ways and compares):

- *The head split in C.* llhttp reports each field by a call into Python, most of
  what reading a small answer costs. When a read begins with a whole final head of the
  plain shape, :func:`proxy.wire.scan.split_response_head` (C where it is built) splits
  its fields and reason in one call, and a parser made without the field and reason
  callbacks parses the head (and refuses what it must) and frames the body. For every
  head llhttp accepts, that split is what llhttp reports: its strict parse ends each
  line at a CR LF and the head at the first empty line (``tests/test_wire_scan.py``).
- *The body past llhttp.* llhttp copies every body piece it reports into a new
  ``bytes``. When such a head comes in a read of at least ``PASS_THROUGH`` bytes, or
  alone in its read, a parser made without a body callback parses the message, and
  the body is relayed as views of the reads (which the connection may lend,
  :mod:`proxy.upstream.readbuffer` says): the body bytes of the head's read once the
  head is complete, each later read before it is fed to llhttp, which skips them, ends
  the message after the last one and refuses what follows, as it would have.

Each parser is switched in only where a response begins, so each is at a message
boundary when it is.
"""

from __future__ import annotations

from typing import Callable, Final

import httptools

from proxy.request import Headers, Piece
from proxy.upstream.events import BEGIN, Data, End, Event, Failed, Head, Interim, Upgrade
from proxy.wire.framing import HeadLimits, backend_framing, trimmed, valid_status
from proxy.wire.scan import SPLIT_RESPONSE_HEAD, as_view

# A read from this size on that begins with a plain head has its body relayed past
# llhttp: below it, llhttp's copy of a small piece costs less than a second feed.
PASS_THROUGH: Final = 16 * 1024
# What is left of a close-delimited body being relayed: all that comes until the end.
UNTIL_CLOSE: Final = 1 << 62
# "HTTP/1.1 103 ", the CR LF ending the status line and the blank line: what a head
# holds beyond its reason and fields.
_STATUS_LINE_AND_END: Final = 17


class Refused(Exception):
    """Raised by a parser callback: what was read is over a limit or not an answer."""


class ResponseParser:
    """The parse state of the answers on one connection (see the module docstring)."""

    def __init__(self, limits: HeadLimits, fast: bool) -> None:
        self.max_bytes = limits.max_bytes
        self.max_fields = limits.max_fields
        self.fast = fast
        self.head_only = False  # answering a HEAD: never a body
        self.asks_upgrade = False
        self.trailers: Headers = []  # the answer's, complete at its end
        self.close_delimited = False  # the body ends when the backend closes
        self._plain = httptools.HttpResponseParser(self)
        self._split = httptools.HttpResponseParser(_Callbacks(self, False, True))
        self._skipping = httptools.HttpResponseParser(_Callbacks(self, False, False))
        self._parser = self._plain
        self._events: list[Event] = []
        self._fields: Headers = []
        self._reason = b""
        self._head_size = 0  # field bytes of the head (or trailer section) being parsed
        self._interim_size = 0  # bytes of the 1xx heads before the final one
        self._interim = False  # the message being parsed is a 1xx
        self._switch: tuple[str, Headers] | None = None  # a 101's head
        self._persists = False
        self._renew = False  # the parser in use is replaced after this read
        self._read: Piece | None = None  # a read whose body llhttp skips, while parsed
        self._body_at = 0  # where that read's body begins
        self._left = 0  # body bytes still to relay past llhttp

    def expect(self, head_only: bool, asks_upgrade: bool) -> None:
        """A new request went out: read its answer."""
        self.head_only = head_only
        self.asks_upgrade = asks_upgrade
        self._interim_size = 0

    def feed(self, data: Piece, whole: bytes | bytearray | None,
             at_head: bool) -> list[Event]:
        """The events ``data`` held (a :class:`Failed` last if it broke the answer
        off); ``at_head``: an answer begins with it."""
        self._events = events = []
        try:
            if self._left:
                self._pass(data)
            else:
                self._parser = self._choose(data, whole, at_head)
                self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            events.append(self._upgrade(bytes(data[exc.args[0]:])))
        except httptools.HttpParserError as exc:
            refused = exc.__context__
            reason = refused if isinstance(refused, Refused) else exc
            events.append(Failed(f"invalid response from backend: {reason}"))
        finally:
            self._read = None  # (a view of the store would keep it from being reused)
        if self._renew:
            # llhttp would expect a body after a HEAD answer's head; there is none.
            self._renew = False
            if self._parser is self._plain:
                self._plain = httptools.HttpResponseParser(self)
            else:
                self._split = httptools.HttpResponseParser(_Callbacks(self, False, True))
        return events

    def _choose(self, data: Piece, whole: bytes | bytearray | None,
                at_head: bool) -> httptools.HttpResponseParser:
        """The seam: the parser for the answer that begins with ``data``."""
        if not (self.fast and at_head and whole is not None):
            return self._plain
        size = len(data)
        split = SPLIT_RESPONSE_HEAD(whole, size, self.max_fields, self.max_bytes)
        if split is None:
            return self._plain
        end, self._reason, self._fields = split
        if self.head_only or (size < PASS_THROUGH and end != size):
            return self._split
        self._read = data
        self._body_at = end
        return self._skipping

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

    def on_split_begin(self) -> None:
        """A message begins whose head was split before llhttp parsed it."""
        self._events.append(BEGIN)
        self._head_size = 0

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        # After the head, the fields are the answer's trailers (see _final_head).
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
        # Asked of every head llhttp split: a backend may answer HTTP/1.0 after
        # HTTP/1.1, and that answer must end the connection (RFC 9112 §9.3). A head
        # split before is HTTP/1.1 (split_response_head takes no other).
        version = parser.get_http_version() if parser is self._plain else "1.1"
        if not valid_status(status, version):
            raise Refused(f"invalid status line (status {status})")
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
        self._fields = self.trailers = []  # fields after the body are trailers
        self._head_size = self._interim_size = 0  # (the trailers have a limit of their own)
        self.close_delimited = framing.length is None and not framing.chunked
        self._persists = framing.persists
        events = self._events
        events.append(Head(status, reason, headers, framing.length, framing.poolable))
        if self.head_only:
            self._renew = True
            events.append(End(self.trailers, self._keep_alive()))
            return
        read = self._read
        if read is not None and status != 204 and status != 304:
            length = UNTIL_CLOSE if framing.length is None else framing.length
            at = self._body_at
            size = min(len(read) - at, length)
            self._left = length - size
            if size > 0:
                events.append(Data(as_view(read)[at:at + size]))

    def on_body(self, data: bytes) -> None:
        self._events.append(Data(data))

    def on_message_complete(self) -> None:
        if self._left:
            # llhttp ended a relayed body elsewhere than its length said: never trusted.
            raise Refused("response body length not agreed")
        if self._interim:
            self._interim = False
        elif not self.head_only:  # (a HEAD answer's End went with its head)
            self._events.append(End(self.trailers, self._keep_alive()))

    def _keep_alive(self) -> bool:
        """Whether the connection persists after the answer: asked at its end, after
        any trailer section (llhttp honours a ``Connection: close`` even there)."""
        return self._persists or bool(self._parser.should_keep_alive())


class _Callbacks:
    """A parser's callbacks for a head split before (no field or reason callback)
    and, without ``body``, a body relayed past llhttp. A parser looks its callbacks
    up by name when it is made."""

    def __init__(self, parser: ResponseParser, fields: bool, body: bool) -> None:
        self.on_message_begin: Callable[[], None] = \
            parser.on_message_begin if fields else parser.on_split_begin
        self.on_headers_complete = parser.on_headers_complete
        self.on_message_complete = parser.on_message_complete
        if body:
            self.on_body = parser.on_body
