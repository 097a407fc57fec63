"""Reading one backend response at a time off an HTTP/1.1 connection (llhttp).

:class:`ResponseReader` owns the parsers; their callbacks only collect (status, reason,
fields, trailers) and enforce the head limits, then tell the connection what was read:
an interim 1xx, the final head with its framing, body pieces, the end. Whether a
message is expected at all, and what becomes of it, is the connection's
(:mod:`proxy.upstream.http1`): a message it does not expect raises here, which the
connection turns into a 502 and a closed connection.

Three parsers per connection, one per way of reading a response, switched only where a
response begins (each is at a message boundary whenever it is switched in):

- ``FULL`` reports everything by callback: any head (split across reads, interim, a
  chunked answer's with its trailers, one over the limits).
- ``SPLIT``: llhttp reports each field by a call into Python, the larger part of what
  reading a small answer costs. When a read begins with a whole final head of the
  plain shape (:func:`proxy.wire.scan.split_response_head` says which, and why its
  split is the one llhttp would report), the reader splits the fields itself in one
  call; this parser, made without the field and reason callbacks, still parses that
  head (and refuses what it must) and frames the body, reported by callback.
- ``PASSING``: llhttp copies every body piece it reports into a new ``bytes``, a second
  copy of each body byte after the event loop's. When such a head comes in a read of
  at least ``PASS_THROUGH`` bytes, or alone in its read, the reader relays the body
  itself, as memoryviews of the reads (of the store they were read into: what the
  connection may lend, :mod:`proxy.upstream.readbuffer` says), to this parser, made
  without a body callback. The head's read is parsed in one call: once the head is
  complete (inside llhttp's callback, right after the connection was told of it) the
  body bytes in that read are relayed, and llhttp skips them. Each later read is
  relayed first and then fed to llhttp. llhttp skips the body at no cost, ends the
  message after its last byte, and refuses any bytes that follow, as it would have.

What the two extra ways earn, measured against a reader that always reads the ``FULL``
way (paired A/B, benchmarks/RESULTS.md, "Fast paths", 2026-12-07): 1.08x / 1.12x the
requests per second of a 13 B / 64 KiB GET; ``PASSING`` alone, 1.05x of the 64 KiB GET.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Final

import httptools

from proxy.request import Headers, Piece
from proxy.upstream.base import UpstreamError
from proxy.wire.scan import SPLIT_RESPONSE_HEAD, as_view
from proxy.wire.framing import (
    HeadLimits, content_length, named, parser_frames_chunked, transfer_codings, trimmed,
    valid_status)

if TYPE_CHECKING:
    from proxy.upstream.http1 import UpstreamConnection

# The ways of reading a response (see the module docstring): each a parser.
FULL: Final = 0
SPLIT: Final = 1
PASSING: Final = 2
# A read from this size on that begins with a plain head has its body relayed by the
# reader: below it, llhttp's copy of a small piece costs less than a second feed.
PASS_THROUGH: Final = 16 * 1024
# What is left of a close-delimited body being relayed: all that comes until the end.
UNTIL_CLOSE: Final = 1 << 62
_HTTP_1_1: Final = "1.1"
# "HTTP/1.1 103 ", the CR LF ending the status line and the blank line: what a head
# holds beyond its reason and fields.
_STATUS_LINE_AND_END: Final = 17
# The parser class as a compiled constant: ``httptools.HttpResponseParser`` would be a
# lookup in the module's globals and one on the module, per parser made.
_PARSER: Final = httptools.HttpResponseParser


class ResponseReader:
    """The parse state of the response being read on one connection."""

    __slots__ = ("conn", "max_bytes", "_max_fields", "parser", "_feed", "head_only",
                 "head_bytes", "_headers", "_reason", "_head_size", "_interim_size",
                 "_interim", "_fresh", "_left", "_persists", "_kind", "_callbacks",
                 "_parsers", "_feeds", "_read", "_body_at")

    def __init__(self, conn: "UpstreamConnection", limits: HeadLimits) -> None:
        self.conn = conn
        # Copied out of the tuple: read per header field, and a tuple's fields are
        # attribute lookups by name where a slot of this class is a plain load.
        self.max_bytes = limits.max_bytes
        self._max_fields = limits.max_fields
        # Bound once connected: the parsers hold this reader's bound methods, a
        # reference cycle, and a dial that fails never reaches connection_lost.
        self.parser = _PARSER(None)
        # The parser's feed_data, bound with it (see _use): called by name, it would
        # be looked up on the parser's type at every read.
        self._feed: Callable[[Piece], None] = self.parser.feed_data
        self.head_only = False  # answering a HEAD: never a body
        self.head_bytes = 0  # bytes received while no final head was complete
        self._headers: Headers = []
        self._reason = b""
        self._head_size = 0  # field bytes of the head (or trailer section) being parsed
        self._interim_size = 0  # bytes of the 1xx heads before it (see on_headers_complete)
        self._interim = False
        self._fresh = False  # the parser must be replaced before the next message
        self._left = 0  # body bytes still to relay past llhttp (PASSING)
        # The read being parsed the PASSING way, and where its body begins.
        self._read: Piece | None = None
        self._body_at = 0
        self._persists = False  # the final head kept the connection (see keep_alive)
        self._kind = FULL  # the way the response being read is read
        # Per way: what its parser calls (once bound), the parser, its feed_data.
        self._callbacks: list[Callbacks | None] = [None, None, None]
        self._parsers = [self.parser, self.parser, self.parser]
        self._feeds: list[Callable[[Piece], None]] = [self._feed, self._feed, self._feed]

    def bind(self) -> None:
        for kind in (FULL, SPLIT, PASSING):
            self._callbacks[kind] = Callbacks(self, kind)
            self._kind = kind
            self._renew()
        self._select(FULL)

    def unbind(self) -> None:
        """Break the parsers' reference cycles (the connection is gone)."""
        self._use(_PARSER(None))
        for kind in (FULL, SPLIT, PASSING):
            self._callbacks[kind] = None
            self._parsers[kind] = self.parser
            self._feeds[kind] = self._feed

    def _use(self, parser: httptools.HttpResponseParser) -> None:
        self.parser = parser
        self._feed = parser.feed_data

    def _renew(self) -> None:
        """A fresh parser for the way in use, for the next message."""
        kind = self._kind
        self._use(_PARSER(self._callbacks[kind]))
        self._parsers[kind] = self.parser
        self._feeds[kind] = self._feed

    def _select(self, kind: int) -> None:
        """Read the response that begins now the ``kind`` way."""
        if kind != self._kind:
            self._kind = kind
            self.parser = self._parsers[kind]
            self._feed = self._feeds[kind]

    def expect(self, head_only: bool) -> None:
        """A new request went out: read its answer."""
        self.head_only = head_only
        self.head_bytes = 0
        self._interim_size = 0

    def feed(self, data: Piece, whole: bytes | bytearray) -> None:
        """Parse ``data`` (``whole`` holds it from its first byte: searched in place);
        llhttp's exceptions (``HttpParserUpgrade`` after a 101, ``HttpParserError``)
        are the caller's, and so is any exception of the connection while a body
        is relayed past llhttp, as an ``HttpParserCallbackError``."""
        if self._left:
            self._pass(data)
            return
        if self.head_bytes == 0 and self.conn.expects_head():
            size = len(data)
            split = SPLIT_RESPONSE_HEAD(whole, size, self._max_fields, self.max_bytes)
            if split is not None:
                end, self._reason, self._headers = split
                if (size >= PASS_THROUGH or end == size) and not self.head_only:
                    self._select(PASSING)
                    self._parse_passing(data, end)
                    return
                self._select(SPLIT)
            else:
                self._select(FULL)
        self._parse(data)

    def _parse(self, data: Piece) -> None:
        try:
            self._feed(data)
        finally:
            if self._fresh:
                self._fresh = False
                self._renew()

    def _parse_passing(self, data: Piece, end: int) -> None:
        """``data`` holds a plain head from its first byte, ``end`` bytes long: llhttp
        parses all of it in one call; at the head's end the body bytes in ``data`` are
        relayed (:meth:`_relay_read`), and llhttp skips them (see the module
        docstring)."""
        self._read = data
        self._body_at = end
        try:
            self._parse(data)
        finally:
            self._read = None  # (a view of the store would keep it from being reused)

    def _relay_read(self) -> None:
        """At the end of a head parsed the ``PASSING`` way: relay the body bytes that
        came in its read, no more than the body has."""
        read = self._read
        assert read is not None  # (the PASSING way is only taken by _parse_passing)
        at = self._body_at
        size = min(len(read) - at, self._left)
        if size > 0:
            self._left -= size
            self.conn.body(as_view(read)[at:at + size])

    def _pass(self, data: Piece) -> None:
        """Body bytes relayed past llhttp, then fed to it: it counts them too, ends the
        message after the last one and refuses what follows."""
        left = self._left
        size = len(data)
        try:
            if size < left:
                self._left = left - size
                if size:
                    self.conn.body(data)
            else:
                self._left = 0
                self.conn.body(data if size == left else as_view(data)[:left])
        except Exception as exc:
            raise httptools.HttpParserCallbackError("relaying the body failed") from exc
        self._feed(data)

    def keep_alive(self) -> bool:
        """Whether the connection persists after the answer: an HTTP/1.1 one framed
        by its length, with no Connection field other than ``keep-alive``, does (RFC
        9112 §9.3); llhttp decides the rest (its answer costs a call)."""
        return self._persists or bool(self.parser.should_keep_alive())

    # -- parser callbacks (an exception raised here becomes a 502, see the connection)

    def on_message_begin(self) -> None:
        self.on_split_begin()
        self._headers = []
        self._reason = b""
        self._head_size = 0

    def on_split_begin(self) -> None:
        """A message begins whose head was split here: its fields are in already."""
        if not self.conn.expects_head():
            # A second message after the complete answer: never anyone's response.
            raise UpstreamError("other", "backend sent bytes after its response")

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        # After the head, ``_headers`` is the response's trailer list (see
        # on_headers_complete): one append per field, whichever section it is in.
        headers = self._headers
        sent, value = value, trimmed(value)
        if len(name) == 17 and named(name, b"Transfer-Encoding", b"transfer-encoding") \
                and transfer_codings(value)[1] and not parser_frames_chunked(sent):
            # Chunked by the list rules, not to llhttp: it would pass the framing on.
            raise UpstreamError("other", "Transfer-Encoding llhttp does not frame")
        headers.append((name, value))
        self._head_size += len(name) + len(value)
        if (len(headers) > self._max_fields
                or self._head_size + self._interim_size > self.max_bytes):
            raise UpstreamError("other", "response head too large")

    def on_headers_complete(self) -> None:
        conn = self.conn
        if not conn.expects_head():
            return
        parser = self.parser
        status = parser.get_status_code()
        # A head split here is HTTP/1.1 (split_response_head takes no other). llhttp's
        # way asks llhttp for every head (a new string per call), never once per
        # connection: a backend may answer HTTP/1.0 after HTTP/1.1, and that answer
        # must end the connection (RFC 9112 §9.3), or the next request's answer is lost.
        version = _HTTP_1_1 if self._kind != FULL else parser.get_http_version()
        if not valid_status(status, version):
            raise UpstreamError("other", f"invalid status line (status {status})")
        if status < 200 and status != 101:
            self._interim_head(status)
            return
        reason = self._reason.decode("latin-1")
        if status == 101:
            conn.switching(reason, self._headers)  # llhttp stops next (HttpParserUpgrade)
            return
        headers = self._headers
        trailers: Headers = []
        self._headers = trailers  # fields after the body are trailers
        self._head_size = self._interim_size = 0  # (the trailers have a limit of their own)
        coded = chunked = connection = False
        length = None
        for name, value in headers:
            n = len(name)
            if n == 14 and named(name, b"Content-Length", b"content-length"):
                length = content_length(value)
            elif n == 17 and named(name, b"Transfer-Encoding", b"transfer-encoding"):
                coded = True
                chunked = transfer_codings(value)[1]
            elif (n == 10 or n == 16) and (
                    named(name, b"Connection", b"connection")  # llhttp reads
                    or named(name, b"Proxy-Connection", b"proxy-connection")):  # both
                # (the common spelling compared first: lower() is a call by name)
                connection = connection or (value != b"keep-alive"
                                            and value.lower() != b"keep-alive")
        # (Not for a chunked answer: a Connection field among its trailers counts too.)
        self._persists = version == _HTTP_1_1 and not connection and length is not None \
            and not coded
        if self.head_only:
            self._fresh = True  # llhttp would expect a body; a HEAD has none
        elif self._kind == PASSING and status != 204 and status != 304:
            # (What llhttp frames: a plain head has no Transfer-Encoding.)
            self._left = UNTIL_CLOSE if length is None else length
        conn.final_head(status, reason, headers, length, chunked, coded, trailers)
        if self._left:
            self._relay_read()

    def _interim_head(self, status: int) -> None:
        """A 1xx head other than 101 ended: 100 Continue is ours to send, 102 and 103
        are relayed. The head limit covers the 1xx heads before the final one too,
        each with its status line and blank line (a backend must not stream 1xx heads
        forever): counted as each ends, before it is relayed."""
        self._interim = True
        self._interim_size += self._head_size + len(self._reason) + _STATUS_LINE_AND_END
        if self._interim_size > self.max_bytes:
            raise UpstreamError("other", "response head too large")
        if status != 100:
            self.conn.interim(status, self._headers)

    def on_body(self, data: bytes) -> None:
        self.conn.body(data)

    def on_message_complete(self) -> None:
        if self._left:
            # llhttp ended a relayed body elsewhere than its length said: never trusted.
            raise UpstreamError("other", "response body length not agreed")
        if self._interim:
            self._interim = False
            return
        self.conn.message_complete()


class Callbacks:
    """A reader's parser callbacks for one way of reading (``kind``), bound once per
    connection. A parser looks each one up by name when it is made; on the reader
    itself every lookup would make a bound method (and the parser's end free it), and
    a parser is made per answer to a HEAD. The callbacks a way has no use for are None
    here, a cheaper answer than a failed lookup: the two for chunks; the reason's and
    the fields' for a head the reader split; the body's for a body it relays."""

    def __init__(self, reader: ResponseReader, kind: int) -> None:
        split = kind != FULL
        self.on_message_begin: Callable[[], None] = \
            reader.on_split_begin if split else reader.on_message_begin
        self.on_status: Callable[[bytes], None] | None = None if split else reader.on_status
        self.on_header: Callable[[bytes, bytes], None] | None = \
            None if split else reader.on_header
        self.on_headers_complete: Callable[[], None] = reader.on_headers_complete
        self.on_body: Callable[[bytes], None] | None = \
            None if kind == PASSING else reader.on_body
        self.on_message_complete: Callable[[], None] = reader.on_message_complete
        self.on_chunk_header: None = None
        self.on_chunk_complete: None = None
