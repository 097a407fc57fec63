"""What llhttp's callbacks collect from a client's bytes, for
:class:`proxy.wire.server.ServerConnection`, and the events it makes of them.

The callbacks only collect (the parts of a head, body pieces, trailer fields) and refuse
(a limit passed, a head :func:`~proxy.wire.request.validate_head` rejects: raised,
recorded in ``refusal``); they never change the connection's state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Final

import httptools

from proxy.request import Headers
from proxy.wire.framing import trimmed
from proxy.wire.meter import FramingMeter
from proxy.wire.request import (KnownHost, Rejection, RequestHead, asks_close,
                                check_line_start, relayable_upgrade, validate_head)

if TYPE_CHECKING:
    from proxy.wire.server import Limits

_HTTP_1_1: Final = "1.1"
_HTTP_1_1_LINE_END: Final = b"HTTP/1.1\r\n"


class Trailers:
    """The trailer fields of a chunked request body (RFC 9112 §7.1.2)."""

    __slots__ = ("fields",)

    def __init__(self, fields: Headers) -> None:
        self.fields = fields


class EndOfMessage:
    """The request ended."""


class Halt:
    """An upgrade request without a body was read; parsing stops."""


END: Final = EndOfMessage()
HALT: Final = Halt()
# What ServerConnection.receive returns: ``bytes`` are a piece of the request body.
ServerEvent = RequestHead | bytes | Trailers | EndOfMessage | Halt | Rejection


class Collector:
    """llhttp's callbacks for one connection (see the module docstring): each event
    is appended to ``events``; ``feed`` feeds the parser. ``open`` says a message began whose head is not
    complete; ``seq`` counts the messages begun; ``fed`` is the bytes being fed when
    they begin a message, ``first_read`` those the message being parsed began with
    (see :func:`request_version`)."""

    def __init__(self, limits: Limits, misdirected: Callable[[str], bool] | None,
                 meter: FramingMeter) -> None:
        self._max_line = limits.max_request_line
        self._max_bytes = limits.max_header_bytes
        self._max_fields = limits.max_headers
        self._misdirected = misdirected
        self._meter = meter
        self.events: list[ServerEvent] = []
        self._known_host = KnownHost()  # the host this connection's last request named
        self.parser = httptools.HttpRequestParser(None)
        self.feed: Callable[[bytes | memoryview], None] = self.parser.feed_data
        self._get_method: Callable[[], bytes] = self.parser.get_method
        self.seq = 0
        self.open = False
        self.fed = b""
        self.first_read = b""
        self.headers: Headers = []
        self.chunked = False  # the body being parsed is chunked
        self.refusal: Rejection | None = None  # raised by a callback
        self.unframed: bytes | None = None  # a chunked body llhttp did not frame
        self._url = b""
        self._head_size = 0  # field bytes of the head (or trailer section)
        self._length: int | None = 0  # the body's Content-Length (None: chunked)
        self._trailers: Headers | None = None  # while a body is parsed
        self._made_up_head = False  # the head being fed is made up (see fresh_parser)
        self._upgrade_end = False  # llhttp's end of an upgrade request with a body

    def fresh_parser(self, made_up_head: bool = False) -> httptools.HttpRequestParser:
        """A new parser calling these callbacks: llhttp parses nothing more after an
        upgrade. ``made_up_head``: the head fed first is one the server made to
        re-frame the body being parsed; it is skipped."""
        parser = httptools.HttpRequestParser(self)
        # Any HTTP/D.D version passes llhttp (strict, it refuses all but 0.9, 1.0, 1.1
        # and 2.0): validate_head serves 1.0 and 1.1 and answers 505 to other majors,
        # and a later 1.x is read as 1.1 (see request_version). Every Transfer-Encoding
        # passes too: validate_head decides (proxy.wire.framing.coding_list), and a
        # chunked body llhttp reads otherwise is re-framed (see on_body).
        parser.set_dangerous_leniencies(lenient_version=True,
                                        lenient_transfer_encoding=True)
        self.parser = parser
        self.feed = parser.feed_data
        self._get_method = parser.get_method
        self._made_up_head = made_up_head
        return parser

    def release(self) -> None:
        """Let go of the parser and of ``misdirected`` (see ServerConnection.release)."""
        self.parser = httptools.HttpRequestParser(None)
        self.feed = self.parser.feed_data
        self._get_method = self.parser.get_method
        self._misdirected = None

    def framing(self) -> int | None:
        """The Content-Length of the body being parsed, or None (chunked)."""
        return self._length

    def _refuse(self, status: int, detail: str) -> Rejection:
        self.refusal = Rejection(status, detail)
        return self.refusal

    # -- llhttp's callbacks

    def on_message_begin(self) -> None:
        self.seq += 1
        if self._made_up_head:
            return
        self.open = True
        self.first_read, self.fed = self.fed, b""
        self.chunked = False
        self._url = b""
        self.headers = []
        self._head_size = 0
        self._meter.begin_message()

    def on_url(self, url: bytes) -> None:
        if self._made_up_head:
            return
        url = self._url + url if self._url else url
        if len(url) > self._max_line:
            raise self._refuse(414, "request line too long")
        self._url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._made_up_head:
            return
        value = trimmed(value)
        size = len(name) + len(value) + 4
        self._head_size += size
        if self._head_size > self._max_bytes:
            raise self._refuse(431, "header section too large")
        trailers = self._trailers
        if trailers is None:
            self.headers.append((name, value))
            if len(self.headers) > self._max_fields:
                raise self._refuse(431, "too many header fields")
            return
        self._meter.fed_body += size  # a trailer, not framing
        trailers.append((name, value))
        if len(trailers) > self._max_fields:
            raise self._refuse(431, "too many trailer fields")

    def on_headers_complete(self) -> None:
        if self._made_up_head:
            self._made_up_head = False  # the real body follows
            return
        self.open = False
        try:
            head = self._head()
        except Rejection as reject:
            raise self._refuse(reject.status, str(reject))
        self.events.append(head)

    def on_chunk_header(self) -> None:
        self._meter.chunk_header()

    def on_body(self, data: bytes) -> None:
        if self.chunked and self._meter.unchunked():
            # Body bytes before any chunk header: llhttp did not read this
            # Transfer-Encoding as ending in chunked, where validate_head did, and
            # hands over all it has after the head. It stops here; the server
            # re-frames the rest.
            self.unframed = data
            raise self._refuse(400, "chunked body not framed by the parser")
        self._meter.fed_body += len(data)
        self.events.append(data)

    def on_message_complete(self) -> None:
        if self._upgrade_end:
            self._upgrade_end = False  # the body is still to come (re-framed)
            return
        self.chunked = False
        trailers, self._trailers = self._trailers, None
        if trailers:
            self.events.append(Trailers(trailers))
        self.events.append(END)

    # -- a complete head

    def _head(self) -> RequestHead:
        """Validate the head just parsed; settle its persistence and framing."""
        parser = self.parser
        method = self._get_method()
        first, self.first_read = self.first_read, b""
        version = request_version(parser, first, len(method) + len(self._url))
        head = validate_head(version, method, self._url, self.headers, self._known_host)
        if self._misdirected is not None and self._misdirected(head.host):
            raise Rejection(421, "host served under another certificate than the "
                                 "connection's SNI chose")
        wants_upgrade = head.upgrade is not None and parser.should_upgrade()
        head.keep_alive = keeps_alive(parser, head)
        if head.chunked or head.length:
            self.chunked = head.chunked
            self._length = None if head.chunked else head.length
            self._trailers = []
            # An upgrade request with a body: the Upgrade is ignored (RFC 9110 §7.8
            # allows it) and the body read as the request's (see ServerConnection).
            self._upgrade_end = wants_upgrade
        elif wants_upgrade and head.upgrade is not None:
            head.switch = relayable_upgrade(head.upgrade)
        return head


def request_version(parser: httptools.HttpRequestParser, first: bytes, line: int) -> str:
    """The HTTP version of the head ``parser`` just parsed; ``first`` the bytes the
    message began with when it began a read (else empty), ``line`` the length of its
    method and target. llhttp formats a new string per call, so the common case is
    read from the request line: the version follows the method, the target and two
    spaces. Any other spacing (or a blank line first) fails the comparison and llhttp
    says; empty lines first must be whole ones
    (:func:`~proxy.wire.request.check_line_start`, raising :class:`Rejection`)."""
    if first[line + 2:line + 12] == _HTTP_1_1_LINE_END:
        return _HTTP_1_1
    if first[:1] == b"\r" or first[:1] == b"\n":
        check_line_start(first)  # (empty lines first: llhttp skips a bare CR too)
    version = str(parser.get_http_version())
    # A minor version above ours is served as the highest we speak (RFC 9112 §2.3).
    return _HTTP_1_1 if version[:2] == "1." and version > _HTTP_1_1 else version


def keeps_alive(parser: httptools.HttpRequestParser, head: RequestHead) -> bool:
    """Whether the connection persists after this request (RFC 9112 §9.3): an HTTP/1.1
    one without a Connection field does; otherwise llhttp decides, except that a
    "close" beside an HTTP/1.0 "keep-alive" wins (RFC 9112 §9.6; llhttp lets the
    keep-alive outweigh it)."""
    if head.version == _HTTP_1_1 and not head.connection:
        return True
    return parser.should_keep_alive() and not (
        head.version == "1.0" and asks_close(head.headers))
