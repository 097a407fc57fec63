"""The request side of a client connection: llhttp fed, its callbacks collected, the
limits llhttp leaves open measured, and each parsed head turned into a :class:`Cycle`.

The parser callbacks only collect (and refuse); the connection acts once the parser
returned. Where the parser is in the message stream is the connection's state
(:mod:`proxy.entrances.states`: IDLE → HEAD → BODY → IDLE, REFRAME, HALTED), set
through :meth:`HTTP1Protocol.enter`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Final

import httptools

from proxy.entrances.body import RequestBody
from proxy.entrances.cycle import Cycle
from proxy.entrances.meter import FramingMeter
from proxy.entrances.states import BODY, HALTED, HEAD, IDLE, REFRAME
from proxy.flow.turn import Deferred
from proxy.request import EMPTY_BODY, Headers, Piece, Request
from proxy.wire.framing import trimmed
from proxy.wire.request import (
    KnownHost, Rejection, RequestHead, asks_close, check_line_start, lacks_version,
    names_a_method, relayable_upgrade, request_line_end, validate_head)
from proxy.wire.scan import FIND_BLANK_LINE, as_view

if TYPE_CHECKING:
    from proxy.entrances.http1 import HTTP1Protocol

log = logging.getLogger("tunnelgate.http1")

FEED_SLICE: Final = 16 * 1024  # large reads are fed in slices so head/chunk limits stay exact
# A read's last slice takes a tail up to this much longer with it (a slice is then at
# most 20 KiB): a 16 KiB body and its head, one read, is one call into llhttp, not two.
FEED_TAIL: Final = FEED_SLICE // 4
# Content-Length bodies from this size on pass llhttp by (see RequestReader.feed). The
# fresh parser a passed body needs costs about as much as llhttp's copy of a 32 KiB
# body (measured: the same req/s at 32 KiB, 5 % more at 64 KiB); below, the copy is
# cheaper.
PASS_THROUGH: Final = 64 * 1024
_METHOD_SCAN: Final = 40  # request bytes looked at to tell an unknown method from garbage
_HTTP_1_1: Final = "1.1"
_HTTP_1_1_LINE_END: Final = b"HTTP/1.1\r\n"


class RequestCallbacks(Deferred):
    """What llhttp calls while a client connection's bytes are fed: the parts of a head
    collected and measured, a trailer or body piece passed to the request it belongs
    to, and a complete head turned into a :class:`Cycle`. They only collect and refuse
    (a refusal is raised, recorded for the reader, see ``_refuse``); acting on what
    they found is the reader's, once llhttp returned.

    The feeding half is :class:`RequestReader`, the one subclass (a ``Deferred`` here
    because the reader is one, and a compiled class has one base). ``parsing`` is the
    request whose body is being parsed; ``ready`` a request whose head completed in the
    bytes being fed, handed to the connection once llhttp returned (the Handler may
    answer at once, which must not happen inside llhttp): one with a body then, one
    without at the end of the loop turn (see ``_start_ready``).
    """

    _parser: httptools.HttpRequestParser
    # The parser's feed_data, bound with it (see _use): called by name, it would be
    # looked up on the parser's type at every read.
    _feed: Callable[[bytes | memoryview], None]
    _get_method: Callable[[], bytes]  # (the same, for the method of every request)

    def __init__(self, conn: HTTP1Protocol) -> None:
        self.conn = conn
        self.settings = conn.settings
        self.parsing: Cycle | None = None
        self.ready: Cycle | None = None
        self._start_due = False  # the reader's run_deferred will start ``ready``
        # The parser holds this reader's bound methods (see RequestReader.release).
        self._callbacks: ParserCallbacks | None = ParserCallbacks(self)
        self._use(httptools.HttpRequestParser(self._callbacks))
        self._url = b""
        self._headers: Headers = []
        self._head_size = 0  # field bytes of the head (or trailer section)
        self._chunked = False  # the body being parsed is chunked
        self._meter = FramingMeter(self.settings.max_header_bytes
                                   + self.settings.max_request_line)
        self._seq = 0  # messages begun; tells whether a slice stayed inside one message
        self._refusal: Rejection | None = None  # raised by a parser callback (see _parse)
        self._unframed: bytes | None = None  # a chunked body llhttp did not frame (on_body)
        self._known_host = KnownHost()  # the host this connection's last request named
        # The bytes being fed when they start with a message (the connection was idle),
        # then those the message being parsed started with (see request_version).
        self._fed: bytes = b""
        self._first_read: bytes = b""
        self._left = 0  # body bytes still to pass llhttp by (see RequestReader.feed)

    def _use(self, parser: httptools.HttpRequestParser) -> None:
        # Any HTTP/D.D version passes llhttp (strict, it refuses all but 0.9, 1.0, 1.1
        # and 2.0): validate_head serves 1.0 and 1.1 and answers 505 to other majors,
        # and a later 1.x is read as 1.1 (see request_version). Every Transfer-Encoding
        # passes too: validate_head decides (proxy.wire.framing.coding_list), and a
        # chunked body llhttp reads otherwise is re-framed (see on_body).
        parser.set_dangerous_leniencies(lenient_version=True,
                                        lenient_transfer_encoding=True)
        self._parser = parser
        self._feed = parser.feed_data
        self._get_method = parser.get_method

    def _refuse(self, status: int, detail: str) -> Rejection:
        """The rejection a parser callback raises, recorded for :meth:`_parse`."""
        self._refusal = Rejection(status, detail)
        return self._refusal

    # -- llhttp callbacks

    def on_message_begin(self) -> None:
        self._seq += 1
        conn = self.conn
        if conn.state != IDLE:
            return  # the made-up head of a re-framed body, or parsing stopped
        conn.enter(HEAD)
        self._first_read, self._fed = self._fed, b""
        self._chunked = False
        self._url = b""
        self._headers = []
        self._head_size = 0
        self._meter.begin_message()

    def on_url(self, url: bytes) -> None:
        if self.conn.state != HEAD:
            return
        url = self._url + url if self._url else url
        if len(url) > self.settings.max_request_line:
            raise self._refuse(414, "request line too long")
        self._url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        state = self.conn.state
        if state != HEAD and state != BODY:
            return  # the made-up head of a re-framed body
        value = trimmed(value)
        self._head_size += len(name) + len(value) + 4
        if self._head_size > self.settings.max_header_bytes:
            raise self._refuse(431, "header section too large")
        if state == BODY:
            self._meter.fed_body += len(name) + len(value) + 4  # a trailer, not framing
            parsing = self.parsing
            if parsing is not None and parsing.body is not None:
                trailers = parsing.body.trailers
                trailers.append((name, value))  # forwarded with the last chunk
                if len(trailers) > self.settings.max_headers:
                    raise self._refuse(431, "too many trailer fields")
            return
        headers = self._headers
        headers.append((name, value))
        if len(headers) > self.settings.max_headers:
            raise self._refuse(431, "too many header fields")

    def on_headers_complete(self) -> None:
        conn = self.conn
        state = conn.state
        if state != HEAD:
            if state == REFRAME:
                conn.enter(BODY)  # the made-up head ended: the real body follows
            return
        try:
            cycle = self._build_cycle()
        except Rejection as reject:
            raise self._refuse(reject.status, str(reject))
        if cycle.body is not None:
            self.parsing = cycle
        if conn.accept(cycle):
            self.ready = cycle  # started once the parser returned

    def on_chunk_header(self) -> None:
        self._meter.chunk_header()

    def on_body(self, data: bytes) -> None:
        if self._chunked and self._meter.unchunked():
            # Body bytes before any chunk header: llhttp did not read this
            # Transfer-Encoding as ending in chunked, where validate_head did (``chunked,``
            # or a trailing tab: RFC 9110 §5.6.1, §5.6.3), and hands over all it has
            # after the head. It stops here; the rest is re-framed (see _reframe).
            self._unframed = data
            raise self._refuse(400, "chunked body not framed by the parser")
        self._meter.fed_body += len(data)
        parsing = self.parsing
        if parsing is not None and parsing.body is not None:
            parsing.body.feed(data)

    def on_message_complete(self) -> None:
        conn = self.conn
        state = conn.state
        if state == REFRAME:
            return  # llhttp's end of an upgrade request's head; see _reframe
        self._chunked = False
        if state == BODY:
            conn.enter(IDLE)
        parsing = self.parsing
        if parsing is not None:
            self.parsing = None
            if parsing.body is not None:
                parsing.body.end()

    # -- what the callbacks found

    def _build_cycle(self) -> Cycle:
        """Validate the head just parsed and turn it into a request cycle; the state
        moves on to the body (if any)."""
        parser = self._parser
        conn = self.conn
        method = self._get_method()
        first, self._first_read = self._first_read, b""
        version = request_version(parser, first, len(method) + len(self._url))
        headers = self._headers
        head = validate_head(version, method, self._url, headers, self._known_host)
        tls = conn.tls
        if tls is not None and tls.misdirected(head.host):
            raise Rejection(421, "host served under another certificate than the "
                                 "connection's SNI chose")
        # (llhttp's answers cost a call each; without the fields they read, known.)
        wants_upgrade = head.upgrade is not None and parser.should_upgrade()
        # (An upgrade not relayed still stops llhttp: parsing resumes after the answer.)
        relayed = (wants_upgrade and head.upgrade is not None
                   and relayable_upgrade(head.upgrade))
        keep_alive = keeps_alive(parser, version, head, headers) and not conn.draining
        body: RequestBody | None = None
        if head.chunked or head.length:
            self._chunked = head.chunked
            body = RequestBody(conn, None if head.chunked else head.length,
                               head.expect_continue)
            # An upgrade request with a body: the Upgrade is ignored (RFC 9110 §7.8
            # allows it) and the body read as the request's (see _reframe).
            conn.enter(REFRAME if wants_upgrade else BODY)
            relayed = False
        else:
            conn.enter(IDLE)
        settings = self.settings
        request = Request(
            head.method, head.path, head.query, head.host, headers,
            body if body is not None else EMPTY_BODY, settings.name,
            conn.client_ip, settings.scheme, version,
            head.upgrade if relayed else None, head.empty_query)
        return Cycle(conn, request, body, keep_alive)


class RequestReader(RequestCallbacks):
    """Parses the bytes of one client connection into requests: feeds llhttp (large
    reads in slices, so the limits stay exact), turns what it raised or what a callback
    refused into the connection's answer, measures what no callback shows
    (:mod:`proxy.entrances.meter`), and starts a request whose head was read at the end
    of the loop turn."""

    def restart(self) -> None:
        """A fresh parser: llhttp does not parse on after it stopped at an upgrade, nor
        after a body that passed it by."""
        self._use(httptools.HttpRequestParser(self._callbacks))

    def release(self) -> None:
        """Drop the parser's reference cycle (its callbacks are this reader's bound
        methods), so a closed connection is freed by reference counting alone."""
        self._callbacks = None
        self._use(httptools.HttpRequestParser(None))
        self.ready = None
        self._left = 0

    def feed(self, data: Piece) -> None:
        """Parse ``data``; a request whose head completed in it is handed to the
        connection (see ``_start_ready``). Large reads go in slices of
        ``FEED_SLICE`` (the last one up to ``FEED_TAIL`` longer).

        A large Content-Length body passes llhttp by, which would copy every body piece
        into a new ``bytes``. Whenever llhttp returned inside such a body with at least
        ``PASS_THROUGH`` bytes of it to come, those go to the request as they arrive,
        counted off here: the reads themselves, or views of them (``bytes``, never
        reused). At the body's end a fresh parser takes what follows. A large read that
        starts a message is fed to llhttp up to its first blank line alone, so that a
        body sharing the read with its head passes too. llhttp stays the judge of the
        head: what is left of the body is what it did not report."""
        if self._left:
            data = self._pass(data)
            if not data:
                return
        size = len(data)
        if size >= PASS_THROUGH and self.conn.state == IDLE and isinstance(data, bytes):
            end = FIND_BLANK_LINE(data, min(size, FEED_SLICE)) + 4
            if end >= 4:
                self._feed_head(data, end)
                return
        if size > FEED_SLICE + FEED_TAIL:
            self._feed_slices(data, 0)
            return
        self._parse(data)
        self._start_ready()
        if self.parsing is not None:  # (a body is being parsed: see _pass_rest)
            self._pass_rest()

    def _start_ready(self) -> None:
        ready = self.ready
        if ready is None or self._start_due:
            return
        if ready.body is not None:
            # A request with a body starts now that llhttp returned: held to the end
            # of the turn, its bytes (the read, llhttp's copy) would stay allocated
            # across the turn's other reads, each request's in other memory, where
            # written at once the next read reuses the memory just freed, warm in the
            # cache (measured on a 16 KiB POST: 8 % more requests per second).
            self.ready = None
            self.conn.start(ready)
            return
        # Started at the end of this loop turn, with the other requests read in it
        # (:mod:`proxy.flow.turn` says why). Until then it is still ``ready``: a
        # refusal meanwhile answers it here.
        self._start_due = True
        conn = self.conn
        conn.entrance.turn_end.add(self, conn.loop)

    def run_deferred(self) -> None:
        """Start the request whose head was read this turn (if still ``ready``)."""
        self._start_due = False
        ready, self.ready = self.ready, None
        if ready is not None:
            self.conn.start(ready)

    def _feed_head(self, data: bytes, end: int) -> None:
        """``data`` starts a message whose head, as far as the first blank line tells,
        is ``end`` bytes long: llhttp gets those alone (no more than a slice), then the
        rest goes past llhttp (a body that passes) or to it, as any read would."""
        self._fed = data  # where the request line is (see request_version)
        self._parse(as_view(data)[:end] if end < len(data) else data)
        self._start_ready()
        self._pass_rest()
        if end < len(data):
            if self._left:
                self.feed(as_view(data)[end:])
            else:
                self._feed_slices(data, end)

    def _pass_rest(self) -> None:
        """After llhttp returned: if it is inside a Content-Length body with at least
        ``PASS_THROUGH`` bytes of it to come, the rest passes llhttp by."""
        parsing = self.parsing
        if parsing is None or self.conn.state != BODY:
            return
        body = parsing.body
        if body is not None and body.length is not None:
            left = body.length - body.count
            if left >= PASS_THROUGH:
                self._left = left

    def _pass(self, data: Piece) -> Piece:
        """Body bytes relayed past llhttp; at the body's end the message completes and
        a fresh parser is made. Returns what follows the body in ``data`` (empty if
        nothing does, or if relaying failed: the connection then answers 500)."""
        left = self._left
        size = len(data)
        parsing = self.parsing
        body = parsing.body if parsing is not None else None
        try:
            if size < left:
                self._left = left - size
                if body is not None:
                    body.feed(data)
                return b""
            self._left = 0
            if body is not None:
                body.feed(data if size == left else as_view(data)[:left])
            self.on_message_complete()
        except Exception:  # (as a callback's failure inside llhttp would be)
            log.error("relaying a request body failed", exc_info=True)
            self.conn.reject(500, "internal error")
            return b""
        self.restart()
        return as_view(data)[left:] if size > left else b""

    def _feed_slices(self, data: Piece, start: int) -> None:
        """Feed ``data`` from ``start`` on, slice by slice (so head and chunk limits
        stay exact); stop at the slice where the connection stopped parsing (halted,
        rejected...)."""
        view = memoryview(data)
        conn = self.conn
        if start == 0 and conn.state == IDLE and isinstance(data, bytes):
            self._fed = data  # where the first slice's request line is (see request_version)
        size = len(data)
        while start < size:
            state = conn.state
            if state == HALTED:
                conn.stash(bytes(view[start:]))
                return
            if state > HALTED:
                return  # rejected or lingering: nothing more is parsed
            end = start + FEED_SLICE
            if size - end <= FEED_TAIL:
                end = size
            self.feed(view[start:end])
            start = end

    def _parse(self, data: bytes | memoryview) -> None:
        conn = self.conn
        seq = self._seq
        state_before = conn.state
        meter = self._meter
        meter.begin_slice()
        if state_before == IDLE and isinstance(data, bytes):
            self._fed = data
        try:
            self._feed(data)
        except httptools.HttpParserUpgrade as exc:  # stopped after an upgrade head
            rest = bytes(data[exc.args[0]:])
            if conn.state == REFRAME:
                self._reframe(rest)
            else:
                conn.halt(rest)
            return
        except httptools.HttpParserCallbackError as exc:
            self._callback_failed(exc)
            return
        except httptools.HttpParserInvalidMethodError as exc:
            # A token llhttp does not know is still a method (RFC 9110 §9.1): one this
            # proxy cannot serve (501, §15.6.2), not a malformed request.
            start = bytes(data[:_METHOD_SCAN]) if state_before == IDLE else b""
            conn.reject(501 if names_a_method(start) else 400, str(exc))
            return
        except httptools.HttpParserError as exc:
            conn.reject(400, str(exc))
            return
        finally:
            self._fed = b""  # (a message that began in these bytes took them)
        if self._chunked and meter.chunk_size_refused(data):
            conn.reject(400, "chunk size too large")
        elif seq != self._seq or state_before != conn.state:
            # (the rest is measured over slices inside one part of one message)
            if conn.state == HEAD and lacks_version(self._first_read):
                conn.reject(400, "no HTTP version on the request line")
        elif state_before == HEAD:
            if meter.head_refused(len(data)):
                conn.reject(431 if self._headers else 414, "request head too large")
            elif self._first_read and self._line_open(data):
                conn.reject(400, "no HTTP version on the request line")
        elif state_before == BODY and self._chunked and meter.framing_refused(len(data)):
            conn.reject(400, "chunk framing too large")

    def _line_open(self, data: bytes | memoryview) -> bool:
        """A head that began a read stays incomplete: while its request line is not
        all there, ``data`` (its next slice) is kept with its first bytes, until the
        line ends (bounded: the meter refuses a long head). Whether it ended without
        an HTTP version."""
        first = self._first_read
        if request_line_end(first) >= 0:
            return False
        first = self._first_read = first + bytes(data)
        return lacks_version(first)

    def _callback_failed(self, exc: httptools.HttpParserCallbackError) -> None:
        """A parser callback raised: refuse the message as it said, or as broken."""
        # The callback's own exception is taken from where it recorded it, not from
        # ``exc.__context__``: raised while another exception counts as handled
        # (compiled coroutines may leave one set), the context would be that one.
        reject, self._refusal = self._refusal, None
        unframed, self._unframed = self._unframed, None
        if unframed is not None:
            self._reframe(unframed)
        elif reject is not None:
            self.conn.reject(reject.status, str(reject))
        else:
            log.error("parser callback failed", exc_info=exc.__context__)
            self.conn.reject(500, "internal error")

    def _reframe(self, rest: bytes) -> None:
        """Parse the body of an upgrade request whose Upgrade we ignore, or a chunked
        body llhttp did not frame as chunked.

        llhttp takes every byte after an upgrade request's head for the new protocol
        (or, for the other, for a body that ends with the connection), body included,
        and offers no way to parse on as HTTP. So a fresh parser is fed
        a made-up head with the same framing, then the bytes that followed the real
        head: the callbacks skip the made-up head (state REFRAME) and from its end on
        (state BODY) the body reaches the request as any other would."""
        parsing = self.parsing
        assert parsing is not None and parsing.body is not None
        if self.conn.state == BODY:
            self.conn.enter(REFRAME)
        length = parsing.body.length
        head = (b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" if length is None
                else b"PUT / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % length)
        self.restart()
        self._parse(head + rest)


class ParserCallbacks:
    """A reader's parser callbacks, bound once per connection. A parser looks each one
    up by name when it is made; on the reader itself every lookup would make a bound
    method (and the parser's end free it), and a parser is made per request body that
    passed llhttp by. The callback the reader has no use for is None here, a cheaper
    answer than a failed lookup."""

    def __init__(self, reader: RequestCallbacks) -> None:
        self.on_message_begin: Callable[[], None] = reader.on_message_begin
        self.on_url: Callable[[bytes], None] = reader.on_url
        self.on_header: Callable[[bytes, bytes], None] = reader.on_header
        self.on_headers_complete: Callable[[], None] = reader.on_headers_complete
        self.on_chunk_header: Callable[[], None] = reader.on_chunk_header
        self.on_body: Callable[[bytes], None] = reader.on_body
        self.on_message_complete: Callable[[], None] = reader.on_message_complete
        self.on_chunk_complete: None = None


def request_version(parser: httptools.HttpRequestParser, first: bytes, line: int) -> str:
    """The HTTP version of the head ``parser`` just parsed; ``first`` the bytes the
    message began with when it began a read (else empty), ``line`` the length of its
    method and target. llhttp formats a new string per call (about 3 % of a small
    request's instructions), so the common case is read from the request line: the
    version follows the method, the target and two spaces. Any other spacing (or a
    blank line first) fails the comparison and llhttp says; empty lines first must be
    whole ones (:func:`~proxy.wire.request.check_line_start`, raising
    :class:`Rejection`)."""
    if first[line + 2:line + 12] == _HTTP_1_1_LINE_END:
        return _HTTP_1_1
    if first[:1] == b"\r" or first[:1] == b"\n":
        check_line_start(first)  # (empty lines first: llhttp skips a bare CR too)
    version = str(parser.get_http_version())
    # A minor version above ours is served as the highest we speak (RFC 9112 §2.3).
    return _HTTP_1_1 if version[:2] == "1." and version > _HTTP_1_1 else version


def keeps_alive(parser: httptools.HttpRequestParser, version: str, head: RequestHead,
                headers: Headers) -> bool:
    """Whether the connection persists after this request (RFC 9112 §9.3): an HTTP/1.1
    one without a Connection field does; otherwise llhttp decides, except that a
    "close" beside an HTTP/1.0 "keep-alive" wins (RFC 9112 §9.6; llhttp lets the
    keep-alive outweigh it)."""
    if version == _HTTP_1_1 and not head.connection:
        return True
    return parser.should_keep_alive() and not (version == "1.0" and asks_close(headers))
