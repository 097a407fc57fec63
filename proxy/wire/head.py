"""Rendering HTTP/1.1 message heads (sans-IO); how they frame a body is decided in
:mod:`proxy.wire.framing`."""

from __future__ import annotations

from http import HTTPStatus
from types import MappingProxyType

from proxy.request import Headers


def render_head(first_line: bytes, headers: Headers, extra: bytes = b"") -> bytes:
    """A message head: ``first_line`` (CRLF-terminated), ``headers``, then ``extra``
    (pre-rendered CRLF-terminated lines), then the blank line.

    Raises ValueError if a header name or value holds CR or LF: a config value or a
    handler bug must never split a header line on the wire (response splitting).
    """
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
    if head.count(b"\n") != lines or head.count(b"\r") != lines:
        raise ValueError("header name or value contains CR or LF")
    return head


def _status_line(status: int) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    return f"HTTP/1.1 {status} {reason}\r\n".encode("ascii")


# Every status line a response may have, built once (a table, not a cache).
_STATUS_LINES = MappingProxyType({status: _status_line(status)
                                  for status in range(100, 1000)})


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason>\\r\\n``; ValueError outside 100–999."""
    line = _STATUS_LINES.get(status)
    if line is None:
        raise ValueError(f"invalid status {status}")
    return line


def error_response(status: int) -> bytes:
    body = f"{HTTPStatus(status).phrase.lower()}\n".encode("ascii")
    return render_head(status_line(status), [
        (b"Content-Type", b"text/plain; charset=utf-8"),
        (b"Content-Length", str(len(body)).encode("ascii")),
        (b"Connection", b"close"),
    ]) + body


ERRORS = {status: error_response(status)
           for status in (400, 405, 408, 414, 431, 500, 501, 505)}
