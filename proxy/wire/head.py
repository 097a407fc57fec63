"""Rendering HTTP/1.1 message heads (sans-IO); how they frame a body is decided in
:mod:`proxy.wire.framing`."""

from __future__ import annotations

from http import HTTPStatus
from typing import Callable, Final

from proxy.request import Headers
from proxy.wire.request import METHODS

_Join = Callable[[bytes, Headers, bytes], "bytes | None"]


def _c_join() -> _Join | None:
    """The C join (``_headjoin.c``), built with the compiled hot path; None when the
    tree runs as pure Python."""
    try:
        from proxy.wire import _headjoin
    except ImportError:
        return None
    return _headjoin.join_head


_JOIN: Final = _c_join()


def render_head(first_line: bytes, headers: Headers, extra: bytes = b"") -> bytes:
    """A message head: ``first_line`` (CRLF-terminated), ``headers``, then ``extra``
    (pre-rendered CRLF-terminated lines), then the blank line.

    Raises ValueError if a header name or value holds LF: a config value or a handler
    bug must never split a header line on the wire (response splitting). The head is
    scanned once, for LF only: a bare CR is no line break to a recipient (RFC 9112
    §2.2 makes it invalid or a space), and a second pass per head was a measurable
    share of a small request's CPU. Every source of fields also refuses CR where it
    enters (llhttp, h2, the config validator, the tunnel bridge).

    The C join (``_headjoin.c``) does it in one allocation where it is built;
    :func:`join_head` is the reference, and takes what the C one declines (fields
    that are not exactly ``bytes``).
    """
    if _JOIN is not None:
        head = _JOIN(first_line, headers, extra)
        if head is not None:
            return head
    return join_head(first_line, headers, extra)


def join_head(first_line: bytes, headers: Headers, extra: bytes) -> bytes:
    """:func:`render_head` in Python: the reference the C join must equal."""
    parts = [first_line]
    for name, value in headers:  # one flat join: no per-line bytes objects
        parts.append(name)
        parts.append(b": ")
        parts.append(value)
        parts.append(b"\r\n")
    parts.append(extra)
    parts.append(b"\r\n")
    head = b"".join(parts)
    lines = len(headers) + 2  # the first line, one per header, the blank line
    if extra:
        lines += extra.count(b"\n")
    if head.count(b"\n") != lines:
        raise ValueError("header name or value contains LF")
    return head


# The start of a request line per method served by name.
_METHOD_STARTS: Final = {method: raw + b" " for raw, method in METHODS.items()}
_REQUEST_LINE_END: Final = b" HTTP/1.1\r\n"


def request_line(method: str, target: str) -> bytes:
    """``<method> <target> HTTP/1.1\\r\\n`` (the target already in origin form; it
    holds only what a parsed target or a validated rewrite may: latin-1)."""
    start = _METHOD_STARTS.get(method)
    if start is None:
        start = method.encode("ascii") + b" "
    return start + target.encode("latin-1") + _REQUEST_LINE_END


def _status_line(status: int) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    return f"HTTP/1.1 {status} {reason}\r\n".encode("ascii")


# Every status line a response may have, built once (a table, not a cache), indexed
# by the status (entries below 100 unused).
_STATUS_LINES: Final[tuple[bytes, ...]] = tuple(
    _status_line(status) if status >= 100 else b"" for status in range(1000))


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason>\\r\\n``; ValueError outside 100–999."""
    if not 100 <= status <= 999:
        raise ValueError(f"invalid status {status}")
    return _STATUS_LINES[status]


def error_response(status: int, date_line: bytes) -> bytes:
    """The whole answer the entrance makes up itself for a request it cannot pass on
    (a bad head, a late one, a Handler that failed): a short text body, the connection
    closed after it. ``date_line`` is the ``Date`` field line, CRLF included (RFC 9110
    §6.6.1: 4xx and 5xx answers carry one too)."""
    body = f"{HTTPStatus(status).phrase.lower()}\n".encode("ascii")
    return render_head(status_line(status), [
        (b"Content-Type", b"text/plain; charset=utf-8"),
        (b"Content-Length", str(len(body)).encode("ascii")),
        (b"Connection", b"close"),
    ], date_line) + body
