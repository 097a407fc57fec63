"""Reading one backend response at a time off an HTTP/1.1 connection (llhttp).

:class:`ResponseReader` owns the parser; its callbacks only collect (status, reason,
fields, trailers) and enforce the head limits, then tell the connection what was read:
an interim 1xx, the final head with its framing, body pieces, the end.

llhttp reports each field by a call into Python, the larger part of what reading a
small answer costs. When a read begins with a whole final head of the plain shape
(:func:`proxy.wire.scan.split_response_head` says which), the reader splits the fields
itself, in one call, and a second parser, made without the field and reason callbacks,
checks that head and frames its body. Any other head (split across reads, an interim
one, a chunked answer's, one over the limits) takes the parser that reports its fields.
The two are switched only where a response begins, so each is always at a message
boundary when it is switched in. Whether a
message is expected at all, and what becomes of it, is the connection's
(:mod:`proxy.upstream.http1`): a message it does not expect raises here, which the
connection turns into a 502 and a closed connection.

A large Content-Length body passes llhttp by: llhttp copies every body piece it
reports into a new ``bytes``, a second copy of each body byte after the event loop's.
When a read holds a response head from its first byte, llhttp is fed the head alone
(up to the first blank line); if that completed a final head announcing at least
``PASS_THROUGH`` bytes of body, the reader counts the body off the reads itself and
relays it as memoryviews of them (of the store they were read into: what the connection
may lend, :mod:`proxy.upstream.readbuffer` says). The parser, left expecting a body it
never sees, is replaced at its end. llhttp stays the judge of the head: if it found the
head to end elsewhere (body bytes already reported), nothing passes by.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Final

import httptools

from proxy.request import Headers, Piece
from proxy.upstream.base import UpstreamError
from proxy.wire.scan import FIND_BLANK_LINE, SPLIT_RESPONSE_HEAD, as_view
from proxy.wire.framing import (
    HeadLimits, content_length, named, transfer_codings, trimmed, valid_status)

if TYPE_CHECKING:
    from proxy.upstream.http1 import UpstreamConnection

# Bodies from this size on pass llhttp by: below it a fresh parser per response costs
# more than the copy it saves.
PASS_THROUGH: Final = 16 * 1024
# The parser class as a compiled constant: ``httptools.HttpResponseParser`` would be a
# lookup in the module's globals and one on the module, per response that passes by.
_PARSER: Final = httptools.HttpResponseParser


class ResponseReader:
    """The parse state of the response being read on one connection."""

    __slots__ = ("conn", "max_bytes", "_max_fields", "parser", "_feed", "head_only",
                 "head_bytes", "_headers", "_reason", "_version", "_head_size",
                 "_interim", "_fresh", "_splitting", "_passable", "_left", "_persists",
                 "_callbacks", "_split", "_other", "_other_feed", "_split_callbacks")

    def __init__(self, conn: "UpstreamConnection", limits: HeadLimits) -> None:
        self.conn = conn
        # Copied out of the tuple: read per header field, and a tuple's fields are
        # attribute lookups by name where a slot of this class is a plain load.
        self.max_bytes = limits.max_bytes
        self._max_fields = limits.max_fields
        # Bound once connected: the parser holds this reader's bound methods, a
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
        self._interim = False
        self._fresh = False  # the parser must be replaced before the next message
        self._version: str | None = None  # of the connection's first status line
        self._splitting = False  # llhttp is being fed a head alone (see feed)
        self._passable = 0  # body bytes the head just fed announced, when they may pass
        self._left = 0  # body bytes still to pass llhttp by
        self._persists = False  # the final head kept the connection (see keep_alive)
        self._callbacks: Callbacks | None = None  # what each parser calls, once bound
        self._split_callbacks: Callbacks | None = None  # ... the one for split heads
        self._split = False  # the parser in use is the one for heads split here
        self._other = self.parser  # the parser not in use, and its feed_data
        self._other_feed: Callable[[Piece], None] = self._feed

    def bind(self) -> None:
        self._callbacks = Callbacks(self, False)
        self._split_callbacks = Callbacks(self, True)
        self._split = False
        self._use(_PARSER(self._callbacks))
        self._other = _PARSER(self._split_callbacks)
        self._other_feed = self._other.feed_data

    def unbind(self) -> None:
        """Break the parsers' reference cycles (the connection is gone)."""
        self._callbacks = self._split_callbacks = None
        self._use(_PARSER(None))
        self._other = self.parser
        self._other_feed = self._feed

    def _use(self, parser: httptools.HttpResponseParser) -> None:
        self.parser = parser
        self._feed = parser.feed_data

    def _renew(self) -> None:
        """A fresh parser of the kind in use, for the next message."""
        self._use(_PARSER(self._split_callbacks if self._split else self._callbacks))

    def _select(self, split: bool) -> None:
        """Use the parser for split heads or the other one (where a response begins)."""
        if split != self._split:
            self._split = split
            self.parser, self._other = self._other, self.parser
            self._feed, self._other_feed = self._other_feed, self._feed

    def expect(self, head_only: bool) -> None:
        """A new request went out: read its answer."""
        self.head_only = head_only
        self.head_bytes = 0

    def feed(self, data: Piece, whole: bytes | bytearray) -> None:
        """Parse ``data`` (``whole`` holds it from its first byte: searched in place);
        llhttp's exceptions (``HttpParserUpgrade`` after a 101, ``HttpParserError``)
        are the caller's, and so is any exception of the connection while a body
        passes by, as an ``HttpParserCallbackError``."""
        if self._left:
            self._pass(data)
            return
        size = len(data)
        if self.head_bytes == 0 and self.conn.expects_head():
            split = SPLIT_RESPONSE_HEAD(whole, size, self._max_fields, self.max_bytes)
            self._select(split is not None)
            if split is not None:
                end, self._reason, self._headers = split
                if size >= PASS_THROUGH or end == size:
                    self._feed_head(data, end)  # (when its body may pass llhttp by)
                else:
                    self._parse(data)
                return
            if size >= PASS_THROUGH or _ends_head(data, size):
                end = FIND_BLANK_LINE(whole, size) + 4
                if end >= 4:
                    self._feed_head(data, end)
                    return
        self._parse(data)

    def _parse(self, data: Piece) -> None:
        try:
            self._feed(data)
        finally:
            if self._fresh:
                self._fresh = False
                self._renew()

    def _feed_head(self, data: Piece, end: int) -> None:
        """``data`` holds a response head from its first byte, ``end`` bytes long as
        far as the first blank line tells: llhttp gets the head alone, then the rest
        goes to llhttp, or past it when the head allows (see the module docstring)."""
        view = as_view(data)
        self._splitting = True
        try:
            self._parse(view[:end] if end < len(data) else data)
            length = self._passable
        finally:
            self._splitting = False
            self._passable = 0
        if length:
            self._left = length
            self._pass(view[end:])
        elif end < len(data):
            self._parse(view[end:])

    def _pass(self, data: Piece) -> None:
        """Body bytes relayed past llhttp; at the body's end, the message completes
        and a fresh parser takes what follows."""
        left = self._left
        size = len(data)
        try:
            if size < left:
                self._left = left - size
                if size:
                    self.conn.body(data)
                return
            self._left = 0
            self.conn.body(data if size == left else as_view(data)[:left])
            # Completed before the parser is replaced: whether the connection may be
            # kept is the old parser's to say (it read the head).
            self.conn.message_complete()
        except Exception as exc:
            raise httptools.HttpParserCallbackError("relaying the body failed") from exc
        self._renew()
        if size > left:
            self._parse(as_view(data)[left:])  # bytes after the answer: refused

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
        # on_headers_complete): one append, no branch, per field.
        headers = self._headers
        value = trimmed(value)
        headers.append((name, value))
        self._head_size += len(name) + len(value)
        if len(headers) > self._max_fields or self._head_size > self.max_bytes:
            raise UpstreamError("other", "response head too large")

    def on_headers_complete(self) -> None:
        conn = self.conn
        if not conn.expects_head():
            return
        parser = self.parser
        status = parser.get_status_code()
        version = self._version
        if version is None:
            # A connection speaks the version of its first status line (llhttp builds
            # a new string per call, for every head otherwise); a change of version
            # on the same connection goes unnoticed.
            version = self._version = parser.get_http_version()
        if not valid_status(status, version):
            raise UpstreamError("other", f"invalid status line (status {status})")
        if status < 200 and status != 101:
            self._interim = True  # 100 Continue is ours to send; 102/103 are relayed
            if status != 100:
                conn.interim(status, self._headers)
            return
        reason = self._reason.decode("latin-1")
        if status == 101:
            conn.switching(reason, self._headers)  # llhttp stops next (HttpParserUpgrade)
            return
        headers = self._headers
        trailers: Headers = []
        self._headers = trailers  # fields after the body are trailers
        self._head_size = 0
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
        self._persists = version == "1.1" and not connection and length is not None \
            and not coded
        if self.head_only:
            self._fresh = True  # llhttp would expect a body; a HEAD has none
        elif self._splitting and length is not None and length >= PASS_THROUGH \
                and not coded:
            self._passable = length  # unless llhttp reports body bytes or an end
        conn.final_head(status, reason, headers, length, chunked, coded, trailers)

    def on_body(self, data: bytes) -> None:
        self._passable = 0  # llhttp found the head to end before the blank line
        self.conn.body(data)

    def on_message_complete(self) -> None:
        self._passable = 0  # no body after all (a 204 or 304 announcing a length)
        if self._interim:
            self._interim = False
            return
        self.conn.message_complete()


class Callbacks:
    """A reader's parser callbacks, bound once per connection. A parser looks each one
    up by name when it is made; on the reader itself every lookup would make a bound
    method (and the parser's end free it), and a parser is made per response whose
    body passed llhttp by. The callbacks the reader has no use for are None here, a
    cheaper answer than a failed lookup: the two for chunks, and for a parser of heads
    split by the reader (``split``) the reason's and the fields'."""

    def __init__(self, reader: ResponseReader, split: bool) -> None:
        self.on_message_begin: Callable[[], None] = \
            reader.on_split_begin if split else reader.on_message_begin
        self.on_status: Callable[[bytes], None] | None = None if split else reader.on_status
        self.on_header: Callable[[bytes, bytes], None] | None = \
            None if split else reader.on_header
        self.on_headers_complete: Callable[[], None] = reader.on_headers_complete
        self.on_body: Callable[[bytes], None] = reader.on_body
        self.on_message_complete: Callable[[], None] = reader.on_message_complete
        self.on_chunk_header: None = None
        self.on_chunk_complete: None = None


def _ends_head(data: Piece, size: int) -> bool:
    """``data`` ends in a blank line: a read that holds a head alone (a backend that
    writes the head, then sends the body from a file)."""
    return size >= 4 and data[size - 1] == 10 and data[size - 2] == 13 \
        and data[size - 3] == 10 and data[size - 4] == 13
