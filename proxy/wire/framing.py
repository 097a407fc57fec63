"""Pure HTTP/1.1 framing decisions shared by the client side and the upstream side.

No I/O and no state: each function answers one question about bytes or header lists
(RFC 9112 message framing, RFC 9110 trailer and status rules), so the protocol
machines in :mod:`proxy.entrances.http1` and :mod:`proxy.upstream.http1` only apply the answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.request import Headers

MAX_CHUNK_SIZE = 2**63 - 1  # larger chunk sizes are refused (no real body is that big)
DEFAULT_RESPONSE_HEADER_BYTES = 64 * 1024
DEFAULT_RESPONSE_HEADER_COUNT = 200


@dataclass(frozen=True, slots=True)
class HeadLimits:
    """Caps on what a backend may send before its final response head is complete
    (interim 1xx heads included): ``max_bytes`` of head bytes, ``max_fields`` header
    fields per head (trailers get the same budget of their own)."""

    max_bytes: int = DEFAULT_RESPONSE_HEADER_BYTES
    max_fields: int = DEFAULT_RESPONSE_HEADER_COUNT


def transfer_codings(value: bytes) -> tuple[bytes, bool]:
    """Split a response's Transfer-Encoding value into (the codings other than
    ``chunked``, comma-joined; whether ``chunked`` is the final coding).

    RFC 9112 §6.3 rule 4: a response whose final coding is not chunked is delimited by
    the connection closing, whatever codings it carries.
    """
    codings = [c.strip().lower() for c in value.split(b",") if c.strip()]
    chunked = bool(codings) and codings[-1] == b"chunked"
    others = b", ".join(c for c in codings if c != b"chunked")
    return others, chunked


def valid_status(status: int, version: str) -> bool:
    """A status an HTTP/1.x backend may send: three digits from 100 to 599 (RFC 9110
    §15), on a status line of HTTP/1.0 or HTTP/1.1 (anything else is not an answer
    from the protocol this connection speaks)."""
    return 100 <= status <= 599 and (version == "1.1" or version == "1.0")


def poolable(head_only: bool, status: int, length: int | None, coded: bool) -> bool:
    """Whether a connection may be reused after a response that has no body by rule
    (the answer to a HEAD, 204, 304) but whose head suggests one (a non-zero
    Content-Length, any Transfer-Encoding). Such a backend may well send those body
    bytes later, and they would reach the next request's client as its response: the
    risk cannot be excluded, so the connection is closed instead (RFC 9112 §9.3).
    """
    if not (head_only or status == 204 or status == 304):
        return True
    return not coded and not length


# RFC 9110 §6.5.1: a trailer must not carry what frames, routes or controls the
# message; the connection-specific (hop-by-hop) fields never cross a proxy at all.
_NOT_IN_TRAILERS = frozenset({
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


_HEX = b"0123456789abcdefABCDEF"


def chunk_size_before(data: bytes, end: int, line_start: bool) -> int | None:
    """The chunk size on the line that ends (with CRLF) just before ``data[end]``, or
    None when the line is not wholly inside ``data`` or holds no hex size.
    ``line_start`` says that ``data`` itself begins a line (what came before it ended
    with LF).

    llhttp does not report chunk sizes; the entrance reads the size line of a chunk
    that is still being received this way, to refuse sizes beyond ``MAX_CHUNK_SIZE``
    at once instead of waiting for a body that can never be that long.
    """
    if end < 3 or data[end - 2:end] != b"\r\n":
        return None
    start = data.rfind(b"\n", 0, end - 2)
    if start < 0 and not line_start:
        return None
    line = data[start + 1:end - 2]
    digits = line.split(b";", 1)[0].rstrip(b" \t")
    if not digits or digits.translate(None, _HEX):
        return None
    return int(digits, 16)
