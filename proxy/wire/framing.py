"""Pure HTTP/1.1 framing decisions shared by the client side and the upstream side.

No I/O and no state: each function answers one question about bytes or header lists
(RFC 9112 message framing, RFC 9110 trailer and status rules), so the protocol
machines in :mod:`proxy.entrances.http1` and :mod:`proxy.upstream.http1` only apply the answers.
:func:`response_framing` is the one place that frames a response head sent to a client,
:func:`request_framing` the one that frames a request head sent to a backend.
"""

from __future__ import annotations

from email.utils import formatdate
from typing import Callable, Final, NamedTuple

from proxy.request import Headers

MAX_CHUNK_SIZE: Final = 2**63 - 1  # larger chunk sizes are refused (no real body is that big)
DEFAULT_RESPONSE_HEADER_BYTES: Final = 64 * 1024
DEFAULT_RESPONSE_HEADER_COUNT: Final = 200


class HeadLimits(NamedTuple):
    """Caps on what a backend may send before its final response head is complete
    (interim 1xx heads included): ``max_bytes`` of head bytes, ``max_fields`` header
    fields per head (trailers get the same budget of their own).

    A tuple, not a frozen dataclass: it travels to worker processes in their settings,
    and a compiled frozen dataclass does not unpickle."""

    max_bytes: int = DEFAULT_RESPONSE_HEADER_BYTES
    max_fields: int = DEFAULT_RESPONSE_HEADER_COUNT


def named(name: bytes, canonical: bytes, lowered: bytes) -> bool:
    """Whether the field ``name`` is ``lowered`` in any case. The usual spelling
    ``canonical`` is compared first: a lowered copy is only made for another one."""
    return name == canonical or name.lower() == lowered


def trimmed(value: bytes) -> bytes:
    """A field value without the trailing spaces and tabs llhttp leaves on it (RFC 9110
    §5.5: optional whitespace around a value is not part of it); the same object when
    there are none, which is nearly always."""
    last = len(value) - 1
    if last >= 0 and (value[last] == 32 or value[last] == 9):  # SP, HTAB
        return value.rstrip(b" \t")
    return value


def coding_list(value: bytes) -> list[bytes]:
    """The transfer codings a Transfer-Encoding value lists, lowered, in order: the
    one reading of that list for requests and responses alike. Elements are split at
    commas, the optional whitespace around each (SP, HTAB: RFC 9110 §5.6.3) is no part
    of it, and empty elements are ignored (RFC 9110 §5.6.1: ``, chunked`` and
    ``chunked,`` list ``chunked`` alone)."""
    return [c for c in (e.strip(b" \t").lower() for e in value.split(b",")) if c]


def transfer_codings(value: bytes) -> tuple[bytes, bool]:
    """Split a response's Transfer-Encoding value into (the codings other than
    ``chunked``, comma-joined; whether ``chunked`` is the final coding).

    RFC 9112 §6.3 rule 4: a response whose final coding is not chunked is delimited by
    the connection closing, whatever codings it carries.
    """
    codings = coding_list(value)
    chunked = bool(codings) and codings[-1] == b"chunked"
    others = b", ".join(c for c in codings if c != b"chunked")
    return others, chunked


def parser_frames_chunked(sent: bytes) -> bool:
    """Whether llhttp reads a response body as chunked, given the last
    Transfer-Encoding field value as the backend sent it (untrimmed).

    llhttp does not follow the list rules there: a trailing comma or a trailing tab
    after ``chunked`` (``chunked,``, ``chunked\t``; RFC 9110 §5.6.1 and §5.5 make both
    plain ``chunked``) leaves the body to be read until the connection closes, with the
    chunk framing in it. The upstream reader refuses such an answer rather than relay
    that framing as the body (a test holds this to llhttp's own reading).
    """
    value = sent.rstrip(b" ").lower()
    if not value.endswith(b"chunked"):
        return False
    before = value[:-7].rstrip(b" \t")
    return not before or before.endswith(b",")


def valid_status(status: int, version: str) -> bool:
    """A status an HTTP/1.x backend may send: three digits from 100 to 599 (RFC 9110
    §15), on a status line of HTTP/1.0 or HTTP/1.1 (anything else is not an answer
    from the protocol this connection speaks)."""
    return 100 <= status <= 599 and (version == "1.1" or version == "1.0")


def poolable(head_only: bool, status: int, length: int | None, coded: bool) -> bool:
    """Whether a connection may be reused after a response, as far as its framing
    tells.

    The answer to a HEAD carries no body, and its Content-Length is the one a GET
    would get (RFC 9110 §9.3.2): normal, so the connection is kept. Should the backend
    send body bytes after all, those that arrive while nothing is asked of it make
    the pool discard the connection (its idle guard, :meth:`proxy.upstream.pool.Pool.
    _take_idle`); a backend that sends them only once the next request went out is
    past any guard, as in every proxy that keeps such connections.

    A 204 or 304 that announces a body (a non-zero Content-Length, any
    Transfer-Encoding), and a HEAD answer with a Transfer-Encoding, are rarer and
    less clear: such a backend may well send those bytes later, where they would
    reach the next request's client as its response, so the connection is closed
    instead (RFC 9112 §9.3).
    """
    if not (head_only or status == 204 or status == 304):
        return True
    if head_only and not coded and status != 204:
        return True
    return not coded and not length


# RFC 9110 §6.5.1: a trailer must not carry what frames, routes or controls the
# message; the connection-specific (hop-by-hop) fields never cross a proxy at all.
_NOT_IN_TRAILERS: Final = frozenset({
    b"connection", b"proxy-connection", b"keep-alive", b"proxy-authenticate",
    b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade",
    b"content-length", b"host",
})


def forwardable_trailers(trailers: Headers) -> Headers:
    """``trailers`` minus the framing, routing and hop-by-hop fields (and the fields
    a ``Connection`` trailer names, although that trailer itself is not allowed)."""
    named: set[bytes] = set()
    for name, value in trailers:
        if name.lower() == b"connection":
            named.update(t.strip().lower() for t in value.split(b","))
    return [(name, value) for name, value in trailers
            if (lname := name.lower()) not in _NOT_IN_TRAILERS and lname not in named]


def accepts_trailers(te: bytes | None) -> bool:
    """Whether a request's ``TE`` value announces ``trailers`` (RFC 9110 §10.1.4)."""
    if not te:
        return False
    return any(token.split(b";")[0].strip().lower() == b"trailers"
               for token in te.split(b","))


_HEX: Final = b"0123456789abcdefABCDEF"


def last_chunk_size(data: bytes) -> int | None:
    """The chunk size on the line ``data`` ends with (CRLF last), or None when the line
    does not start (after an LF) inside ``data`` or holds no hex size.

    llhttp does not report chunk sizes; the entrance reads the size line of a chunk
    that is still being received this way, to refuse sizes beyond ``MAX_CHUNK_SIZE``
    at once instead of waiting for a body that can never be that long.
    """
    if len(data) < 3 or not data.endswith(b"\r\n"):
        return None
    start = data.rfind(b"\n", 0, len(data) - 2)
    if start < 0:
        return None
    line = data[start + 1:-2]
    digits = line.split(b";", 1)[0].rstrip(b" \t")
    if not digits or digits.translate(None, _HEX):
        return None
    return int(digits, 16)


def find_length(headers: Headers) -> int | None:
    """The first Content-Length of ``headers`` (None without one); ValueError when
    it is not a plain decimal number."""
    for name, value in headers:
        if len(name) == 14 and named(name, b"Content-Length", b"content-length"):
            return content_length(value)
    return None


def content_length(value: bytes) -> int:
    """A Content-Length value (RFC 9110 §8.6: 1*DIGIT; surrounding whitespace is
    tolerated); ValueError otherwise. Short values are read digit by digit, with no
    call: ``int()`` of a ``bytes`` decodes it first, a tenth of a small request's
    header work."""
    size = len(value)
    if 0 < size <= 18:  # below 10**18: no overflow of a native int
        total = 0
        for i in range(size):
            digit = value[i] - 48
            if digit < 0 or digit > 9:
                break
            total = total * 10 + digit
        else:
            return total
    if not value.isdigit():  # int() would take signs, spaces and underscores
        value = value.strip()
        if not value.isdigit():
            raise ValueError(f"invalid Content-Length {value!r}")
    return int(value)


# Hop-by-hop and framing headers the entrance owns; the Handler's copies are dropped.
_FRAMING: Final = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"proxy-connection"})
# without_framing looks at a name of their lengths (10, 16, 17) only, compared as
# literals: a set lookup of the boxed length cost ~95 instructions per field (callgrind,
# 2026-12-07).


def without_framing(headers: Headers, keep_length: bool
                    ) -> tuple[Headers, bool, bytes | None, int | None]:
    """``headers`` minus the entrance-owned ones (and Content-Length unless
    ``keep_length``) — the same list when there is nothing to drop — whether a
    ``Date`` is among them, the transfer codings other than chunked that a dropped
    ``Transfer-Encoding`` named (None if none), and the kept Content-Length (as
    :func:`find_length`; None when there is none or it was dropped). One pass."""
    out: Headers | None = None
    dated = False
    codings: bytes | None = None
    length: int | None = None
    for i, pair in enumerate(headers):
        name = pair[0]
        n = len(name)
        if n == 14 and named(name, b"Content-Length", b"content-length"):
            if keep_length:
                if length is None:
                    length = content_length(pair[1])
                if out is not None:
                    out.append(pair)
            elif out is None:
                out = headers[:i]
        elif (n == 10 or n == 16 or n == 17) and name.lower() in _FRAMING:
            if out is None:
                out = headers[:i]
            if n == 17:
                codings = transfer_codings(pair[1])[0] or None
        else:
            if n == 4 and named(name, b"Date", b"date"):
                dated = True
            if out is not None:
                out.append(pair)
    return (headers if out is None else out), dated, codings, length


_CHUNKED: Final = b"Transfer-Encoding: chunked\r\n"
_LENGTH_ZERO: Final = b"Content-Length: 0\r\n"
_CLOSE: Final = b"Connection: close\r\n"
_KEEP_ALIVE: Final = b"Connection: keep-alive\r\n"
_UPGRADE: Final = b"Connection: upgrade\r\n"
BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})  # an empty body is still announced


class ResponseFraming:
    """How a response head frames its body, as :func:`response_framing` decided.

    ``headers``: the response's headers minus those the entrance owns; ``lines``: the
    CRLF-terminated lines rendered after them (framing, Date, Connection); ``chunked``:
    the body goes out chunked; ``remaining``: the bytes a streamed body must still
    send (its Content-Length), None when not counted; ``keep_alive``: the connection
    stays open after this response; ``no_body``: nothing the Handler writes is sent.
    """

    __slots__ = ("headers", "lines", "chunked", "remaining", "keep_alive", "no_body")

    def __init__(self, headers: Headers, lines: bytes, chunked: bool,
                 remaining: int | None, keep_alive: bool, no_body: bool) -> None:
        self.headers = headers
        self.lines = lines
        self.chunked = chunked
        self.remaining = remaining
        self.keep_alive = keep_alive
        self.no_body = no_body


class DateLine:
    """The ``Date`` field line (CRLF included) a response that lacks one gets (RFC
    9110 §6.6.1), formatted once per second of ``clock`` (seconds since the epoch),
    and read only for such a response: most backends send their own."""

    __slots__ = ("_clock", "_second", "_line")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._second = -1
        self._line = b""

    def line(self) -> bytes:
        now = int(self._clock())
        if now != self._second:
            self._second = now
            self._line = b"Date: %s\r\n" % formatdate(now, usegmt=True).encode()
        return self._line


def response_framing(method: str, status: int, http10: bool, headers: Headers,
                     body_length: int | None, keep_alive: bool, date: DateLine | None,
                     upgrade: bytes = b"") -> ResponseFraming:
    """Frame the response with ``status`` and ``headers`` to a ``method`` request
    from an HTTP/1.1 (or, ``http10``, HTTP/1.0) client.

    ``body_length`` is the length of a complete body; None means a streamed body,
    whose length is the Content-Length of ``headers`` if it has one. ``keep_alive``
    says whether the connection could stay open as far as the request goes; ``date``
    gives the ``Date`` line added to headers that lack one (RFC 9110 §6.6.1; None
    only for a 1xx, which gets none); ``upgrade``
    is the protocol a 101 switches to. Raises ValueError for a malformed
    Content-Length that decides the framing.

    RFC 9112 §6.3: no body after HEAD, 1xx, 204, 304 (a HEAD or 304 may keep the
    Content-Length the GET would have had); else Content-Length when known, chunked
    for an HTTP/1.1 client, and the connection's close for an HTTP/1.0 one.
    """
    if status < 200:
        return _interim_framing(status, headers, keep_alive, upgrade)
    framing = ResponseFraming(headers, b"", False, None, keep_alive,
                              method == "HEAD" or status == 204 or status == 304)
    if body_length is not None:
        dated = _frame_complete(framing, status, body_length)
    else:
        dated = _frame_streamed(framing, status, http10)
    lines = framing.lines
    if not dated and date is not None:
        lines += date.line()
    framing.lines = lines + (_CLOSE if not framing.keep_alive
                             else _KEEP_ALIVE if http10 else b"")
    return framing


def _interim_framing(status: int, headers: Headers, keep_alive: bool,
                     upgrade: bytes) -> ResponseFraming:
    """A 1xx head: it ends at its blank line, so it frames nothing (RFC 9110 §15.2);
    a 101 names the protocol it switches to (RFC 9110 §7.8), and the connection is
    then no longer HTTP's, so it is not kept alive."""
    headers = without_framing(headers, False)[0]
    if status != 101:
        return ResponseFraming(headers, b"", False, None, keep_alive, True)
    lines = _UPGRADE
    if not any(len(n) == 7 and n.lower() == b"upgrade" for n, _ in headers):
        lines += b"Upgrade: " + upgrade + b"\r\n"
    return ResponseFraming(headers, lines, False, None, False, True)


def _frame_complete(framing: ResponseFraming, status: int, body_length: int) -> bool:
    """Frame a complete body of ``body_length`` bytes; whether a Date is present."""
    if status == 204:  # RFC 9110 §8.6: a 204 carries no Content-Length at all
        headers, dated, _, _ = without_framing(framing.headers, False)
    elif (framing.no_body and find_length(framing.headers) is not None) or status == 304:
        headers, dated, _, _ = without_framing(framing.headers, True)
    else:
        headers, dated, _, _ = without_framing(framing.headers, False)
        framing.lines = b"Content-Length: %d\r\n" % body_length
    framing.headers = headers
    return dated


def _frame_streamed(framing: ResponseFraming, status: int, http10: bool) -> bool:
    """Frame a body of unknown length; whether a Date is present."""
    # A 204 carries no Content-Length at all (RFC 9110 §8.6): dropped, not parsed.
    headers, dated, codings, length = without_framing(framing.headers, status != 204)
    if length is not None:
        framing.remaining = None if framing.no_body else length
    else:
        if framing.no_body:
            pass
        elif http10:
            framing.keep_alive = False  # close-delimited body (RFC 9112 §6.3 item 8)
        else:
            framing.chunked = True
            framing.lines = _CHUNKED
    if codings and framing.chunked:
        # The body still carries transfer codings (e.g. gzip, from a backend that
        # ended it by closing): announced, with chunked last so its end is clear.
        # (HTTP/1.0 has no transfer codings: RFC 9112 §6.1 forbids the field there,
        # so such a client gets the coded bytes close-delimited, unannounced.)
        framing.lines = b"Transfer-Encoding: " + codings + b", chunked\r\n"
    framing.headers = headers
    return dated


def request_framing(method: str, length: int | None) -> bytes:
    """The framing line of a request head sent to a backend, for a body of
    ``length`` bytes (None: streamed, so chunked). An empty body needs no line,
    except for the methods that define a body: RFC 9110 §8.6 asks a client to send
    ``Content-Length: 0`` then, and some servers refuse such a request without it
    (411 Length Required)."""
    if length is None:
        return _CHUNKED
    if length:
        return b"Content-Length: %d\r\n" % length
    return _LENGTH_ZERO if method in BODY_METHODS else b""
